"""Trigger rules: when a task may run, given how its parents ended.

Each rule is decided from counters alone (parents total, done, succeeded, failed,
upstream-failed, skipped), so a completing parent costs O(1) per child whatever the fan-in.
One rule also reads how its setups ended: a teardown's (``all_done_setup_success``), read
once, when its counters say every parent has ended (executor/statemachine.py).

Also here: which tasks' failures decide their run's state (:func:`leaf_kinds`), since a
teardown changes that (Airflow 3's rule: a teardown's failure does not fail the run unless
it says ``on_failure_fail_run``, and the tasks before it count as leaves).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class TriggerRule(StrEnum):
    ALL_SUCCESS = "all_success"
    ALL_DONE = "all_done"
    ALL_FAILED = "all_failed"
    ONE_SUCCESS = "one_success"
    ONE_FAILED = "one_failed"
    NONE_FAILED = "none_failed"
    NONE_FAILED_MIN_ONE_SUCCESS = "none_failed_min_one_success"
    NONE_SKIPPED = "none_skipped"
    ALWAYS = "always"
    ANY_OF = "any_of"  # seed 003's join: the same as one_success
    # A teardown's (Airflow's name): once every parent ended, run if one of its setups
    # succeeded (or it has none); skipped if they were all skipped; else upstream-failed.
    ALL_DONE_SETUP_SUCCESS = "all_done_setup_success"


class Decision(StrEnum):
    WAIT = "WAIT"
    RUN = "RUN"
    SKIP = "SKIPPED"
    UPSTREAM_FAILED = "UPSTREAM_FAILED"


@dataclass(frozen=True, slots=True)
class Counts:
    total: int
    done: int = 0
    success: int = 0
    failed: int = 0
    upstream_failed: int = 0
    skipped: int = 0
    # How the parents that are setups ended: filled only for all_done_setup_success once
    # every parent is done (the one rule that reads them).
    setups: int = 0
    setups_succeeded: int = 0
    setups_skipped: int = 0

    @property
    def all_done(self) -> bool:
        return self.done >= self.total

    @property
    def failures(self) -> int:
        return self.failed + self.upstream_failed


def decide(rule: TriggerRule | str, c: Counts) -> Decision:
    """What a task with this rule does now; WAIT until the outcome is decided."""
    rule = TriggerRule(rule)
    if c.total == 0 or rule is TriggerRule.ALWAYS:
        return Decision.RUN
    match rule:
        case TriggerRule.ALL_SUCCESS:
            if c.failures:
                return Decision.UPSTREAM_FAILED
            if c.skipped:
                return Decision.SKIP
            return Decision.RUN if c.success == c.total else Decision.WAIT
        case TriggerRule.ALL_DONE:
            return Decision.RUN if c.all_done else Decision.WAIT
        case TriggerRule.ALL_FAILED:
            if c.success or c.skipped:
                return Decision.SKIP
            return Decision.RUN if c.all_done else Decision.WAIT
        case TriggerRule.ONE_SUCCESS | TriggerRule.ANY_OF:
            if c.success:
                return Decision.RUN
            if not c.all_done:
                return Decision.WAIT
            return Decision.SKIP if c.skipped == c.total else Decision.UPSTREAM_FAILED
        case TriggerRule.ONE_FAILED:
            if c.failures:
                return Decision.RUN
            return Decision.SKIP if c.all_done else Decision.WAIT
        case TriggerRule.NONE_FAILED:
            if c.failures:
                return Decision.UPSTREAM_FAILED
            return Decision.RUN if c.all_done else Decision.WAIT
        case TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS:
            if c.failures:
                return Decision.UPSTREAM_FAILED
            if not c.all_done:
                return Decision.WAIT
            return Decision.RUN if c.success else Decision.SKIP
        case TriggerRule.NONE_SKIPPED:
            if c.skipped:
                return Decision.SKIP
            return Decision.RUN if c.all_done else Decision.WAIT
        case TriggerRule.ALL_DONE_SETUP_SUCCESS:
            if not c.all_done:
                return Decision.WAIT
            if c.setups and not c.setups_succeeded:
                # Nothing was set up, so there is nothing to tear down.
                if c.setups_skipped == c.setups:
                    return Decision.SKIP
                return Decision.UPSTREAM_FAILED
            return Decision.RUN
    raise AssertionError(rule)


# task.is_leaf, as the run's outcome reads it. Once a yes/no ("has no children"), still 0
# and 1 for every DAG without a teardown; a teardown adds two values, so that the counters
# of the hot path keep reading one small column they already return:
LEAF_NO = 0  # has children; its failure reaches the run through them
LEAF = 1  # no children: its failure (or upstream failure) fails the run
LEAF_BEFORE_TEARDOWN = 2  # its only children are quiet teardowns: decides as a leaf does
LEAF_QUIET = 3  # a teardown without children whose failure does not fail the run


def decides_run(is_leaf: int) -> bool:
    """Whether this task ending FAILED or UPSTREAM_FAILED fails its run."""
    return is_leaf in (LEAF, LEAF_BEFORE_TEARDOWN)


def has_children(is_leaf: int) -> bool:
    """Whether ending this task bumps children's counters (a leaf has none to bump)."""
    return is_leaf in (LEAF_NO, LEAF_BEFORE_TEARDOWN)


@dataclass(frozen=True, slots=True)
class Node:
    """What :func:`leaf_kinds` needs of a task: its parents and whether it is a quiet
    teardown (a teardown without ``on_failure_fail_run``)."""

    task_id: str
    parents: tuple[str, ...]
    quiet: bool = False


def leaf_kinds(nodes: Iterable[Node]) -> Mapping[str, int]:
    """Each task's ``is_leaf`` (LEAF_*), by Airflow 3's rule for a run's state: a task
    decides when all of its children are quiet teardowns (none is a leaf's case) and it
    is not one itself. A DAG of quiet teardowns alone is judged by its plain leaves."""
    nodes = list(nodes)
    quiet = {n.task_id for n in nodes if n.quiet}
    children: dict[str, list[str]] = {n.task_id: [] for n in nodes}
    for n in nodes:
        for p in n.parents:
            children.setdefault(p, []).append(n.task_id)
    kinds: dict[str, int] = {}
    for n in nodes:
        kids = children[n.task_id]
        effective = not n.quiet and all(k in quiet for k in kids)
        if not kids:
            kinds[n.task_id] = LEAF if effective else LEAF_QUIET
        else:
            kinds[n.task_id] = LEAF_BEFORE_TEARDOWN if effective else LEAF_NO
    if quiet and not any(decides_run(k) for k in kinds.values()):
        kinds = {t: LEAF if not children[t] else LEAF_NO for t in kinds}
    return kinds


def aggregate(c: Counts) -> str:
    """The state a mapped task's template ends in once all its instances ended."""
    if c.failed:
        return "FAILED"
    if c.upstream_failed:
        return "UPSTREAM_FAILED"
    if c.total and c.skipped == c.total:
        return "SKIPPED"
    return "SUCCESS"
