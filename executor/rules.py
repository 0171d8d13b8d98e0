"""Trigger rules: when a task may run, given how its parents ended.

Each rule is decided from counters alone (parents total, done, succeeded, failed,
upstream-failed, skipped), so a completing parent costs O(1) per child whatever the fan-in.
"""

from __future__ import annotations

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
    raise AssertionError(rule)


def aggregate(c: Counts) -> str:
    """The state a mapped task's template ends in once all its instances ended."""
    if c.failed:
        return "FAILED"
    if c.upstream_failed:
        return "UPSTREAM_FAILED"
    if c.total and c.skipped == c.total:
        return "SKIPPED"
    return "SUCCESS"
