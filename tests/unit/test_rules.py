"""Trigger rules: decided from counters, checked against a reference that reads parent states.

The reference below is written from the list of parents' states the way a user reads the
rule names (Airflow semantics), not from :class:`executor.rules.Counts`; the counters must
agree with it for every mix of parent states.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import run_to_end, task_states

from executor import DAG
from executor.rules import Counts, Decision, TriggerRule, aggregate, decide
from executor.store import Store

NOT_DONE = ("PENDING", "RUNNING", "RETRYING")
ENDED = ("SUCCESS", "FAILED", "UPSTREAM_FAILED", "SKIPPED")
PARENT_STATES = ENDED + NOT_DONE

RUN, WAIT, SKIP, UF = Decision.RUN, Decision.WAIT, Decision.SKIP, Decision.UPSTREAM_FAILED


def reference(rule: TriggerRule, parents: list[str]) -> Decision:
    """What a task with ``rule`` does, given its parents' current states."""
    if not parents or rule is TriggerRule.ALWAYS:
        return RUN
    finished = all(s in ENDED for s in parents)
    any_ok = "SUCCESS" in parents
    any_bad = "FAILED" in parents or "UPSTREAM_FAILED" in parents
    any_skip = "SKIPPED" in parents
    if rule is TriggerRule.ALL_SUCCESS:
        if any_bad:
            return UF
        if any_skip:
            return SKIP
        return RUN if all(s == "SUCCESS" for s in parents) else WAIT
    if rule is TriggerRule.ALL_DONE:
        return RUN if finished else WAIT
    if rule is TriggerRule.ALL_FAILED:
        if any_ok or any_skip:
            return SKIP
        return RUN if finished else WAIT
    if rule in (TriggerRule.ONE_SUCCESS, TriggerRule.ANY_OF):
        if any_ok:
            return RUN
        if not finished:
            return WAIT
        return SKIP if all(s == "SKIPPED" for s in parents) else UF
    if rule is TriggerRule.ONE_FAILED:
        if any_bad:
            return RUN
        return SKIP if finished else WAIT
    if rule is TriggerRule.NONE_FAILED:
        if any_bad:
            return UF
        return RUN if finished else WAIT
    if rule is TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS:
        if any_bad:
            return UF
        if not finished:
            return WAIT
        return RUN if any_ok else SKIP
    if rule is TriggerRule.NONE_SKIPPED:
        if any_skip:
            return SKIP
        return RUN if finished else WAIT
    if rule is TriggerRule.ALL_DONE_SETUP_SUCCESS:  # with no setup among the parents
        return RUN if finished else WAIT
    raise AssertionError(f"reference does not know {rule}")


def counts(parents: list[str]) -> Counts:
    c = Counter(parents)
    return Counts(
        total=len(parents),
        done=sum(c[s] for s in ENDED),
        success=c["SUCCESS"],
        failed=c["FAILED"],
        upstream_failed=c["UPSTREAM_FAILED"],
        skipped=c["SKIPPED"],
    )


# Every multiset of up to 4 parents over the 4 ended states and one not-done state.
MIXES = [
    list(mix)
    for n in range(5)
    for mix in itertools.combinations_with_replacement((*ENDED, "PENDING"), n)
]


@pytest.mark.parametrize("rule", list(TriggerRule))
def test_every_rule_against_every_mix_of_parent_states(rule: TriggerRule) -> None:
    assert len(MIXES) == 126
    wrong = [
        (mix, decide(rule, counts(mix)), reference(rule, mix))
        for mix in MIXES
        if decide(rule, counts(mix)) != reference(rule, mix)
    ]
    assert not wrong, wrong


@given(
    rule=st.sampled_from(list(TriggerRule)),
    parents=st.lists(st.sampled_from(PARENT_STATES), max_size=30),
)
def test_counters_agree_with_reference(rule: TriggerRule, parents: list[str]) -> None:
    assert decide(rule, counts(parents)) == reference(rule, parents)
    # the rule may be given by value too, as DAG files do
    assert decide(rule.value, counts(parents)) == reference(rule, parents)


@given(
    rule=st.sampled_from(list(TriggerRule)),
    parents=st.lists(st.sampled_from(ENDED), min_size=1, max_size=30),
)
def test_every_rule_is_decided_once_all_parents_ended(rule: TriggerRule, parents: list[str]):
    """No task may wait forever: with every parent ended, each rule decides."""
    assert decide(rule, counts(parents)) is not WAIT


@given(
    rule=st.sampled_from(
        [
            TriggerRule.ALL_SUCCESS,
            TriggerRule.ALL_DONE,
            TriggerRule.NONE_FAILED,
            TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
            TriggerRule.NONE_SKIPPED,
        ]
    ),
    parents=st.lists(st.sampled_from(PARENT_STATES), min_size=1, max_size=30),
)
def test_mappable_rules_run_only_when_every_parent_ended(rule, parents):
    if decide(rule, counts(parents)) is RUN:
        assert all(s in ENDED for s in parents)


# A few hand-written cases, so that the reference itself is pinned to the documented meaning.
@pytest.mark.parametrize(
    ("rule", "parents", "expected"),
    [
        ("all_success", ["SUCCESS", "SUCCESS"], RUN),
        ("all_success", ["SUCCESS", "PENDING"], WAIT),
        ("all_success", ["FAILED", "PENDING"], UF),
        ("all_success", ["SKIPPED", "SUCCESS"], SKIP),
        ("all_done", ["FAILED", "SKIPPED", "UPSTREAM_FAILED"], RUN),
        ("all_failed", ["FAILED", "UPSTREAM_FAILED"], RUN),
        ("all_failed", ["FAILED", "SUCCESS"], SKIP),
        ("one_success", ["PENDING", "SUCCESS"], RUN),
        ("one_success", ["FAILED", "SKIPPED"], UF),
        ("one_success", ["SKIPPED", "SKIPPED"], SKIP),
        ("one_failed", ["PENDING", "FAILED"], RUN),
        ("one_failed", ["SUCCESS", "SKIPPED"], SKIP),
        ("none_failed", ["SUCCESS", "SKIPPED"], RUN),
        ("none_failed", ["UPSTREAM_FAILED", "PENDING"], UF),
        ("none_failed_min_one_success", ["SKIPPED", "SKIPPED"], SKIP),
        ("none_failed_min_one_success", ["SKIPPED", "SUCCESS"], RUN),
        ("none_skipped", ["FAILED", "SUCCESS"], RUN),
        ("none_skipped", ["SKIPPED", "PENDING"], SKIP),
        ("always", ["PENDING"], RUN),
        ("any_of", ["FAILED", "PENDING", "SUCCESS"], RUN),
    ],
)
def test_documented_cases(rule: str, parents: list[str], expected: Decision) -> None:
    assert reference(TriggerRule(rule), parents) is expected
    assert decide(rule, counts(parents)) is expected


def test_no_parents_always_runs() -> None:
    for rule in TriggerRule:
        assert decide(rule, Counts(total=0)) is RUN


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError):
        decide("sometimes", Counts(total=1))


@pytest.mark.parametrize(
    ("instances", "expected"),
    [
        (["SUCCESS", "SUCCESS"], "SUCCESS"),
        (["SUCCESS", "SKIPPED"], "SUCCESS"),
        (["SKIPPED", "SKIPPED"], "SKIPPED"),
        (["SUCCESS", "FAILED", "UPSTREAM_FAILED"], "FAILED"),
        (["SUCCESS", "UPSTREAM_FAILED"], "UPSTREAM_FAILED"),
    ],
)
def test_mapped_template_aggregate(instances: list[str], expected: str) -> None:
    assert aggregate(counts(instances)) == expected


# -- end to end: SKIPPED and UPSTREAM_FAILED travel down a DAG run ------------------------


def propagation_dag() -> DAG:
    dag = DAG("propagation")

    @dag.task
    def ok(ctx):
        return 1

    @dag.task
    def boom(ctx):
        raise RuntimeError("boom")

    @dag.task(branch=True)
    def choose(ctx):
        return "taken"

    @dag.task(parents=[choose])
    def taken(ctx):
        return "taken"

    @dag.task(parents=[choose])
    def not_taken(ctx):
        raise AssertionError("a branch not chosen must not run")

    # UPSTREAM_FAILED runs down a chain of all_success tasks
    @dag.task(parents=[boom])
    def after_boom(ctx):
        raise AssertionError("must not run")

    @dag.task(parents=[after_boom])
    def after_after_boom(ctx):
        raise AssertionError("must not run")

    # SKIPPED runs down a chain of all_success tasks
    @dag.task(parents=[not_taken])
    def after_skip(ctx):
        raise AssertionError("must not run")

    @dag.task(parents=[after_skip])
    def after_after_skip(ctx):
        raise AssertionError("must not run")

    @dag.task(parents=[ok, boom, not_taken], trigger_rule="all_done")
    def cleanup(ctx):
        return sorted(ctx.inputs)

    @dag.task(parents=[boom, ok], trigger_rule="one_failed")
    def alert(ctx):
        return "alerted"

    @dag.task(parents=[ok, not_taken], trigger_rule="none_failed")
    def tolerant(ctx):
        return "ran"

    @dag.task(parents=[not_taken, after_skip], trigger_rule="none_failed_min_one_success")
    def needs_one_success(ctx):
        raise AssertionError("must not run")

    @dag.task(parents=[ok], trigger_rule="all_failed")
    def on_all_failed(ctx):
        raise AssertionError("must not run")

    @dag.task(parents=[not_taken, boom], trigger_rule="one_success")
    def any_ok(ctx):
        raise AssertionError("must not run")

    @dag.task(parents=[taken, not_taken], trigger_rule="none_skipped")
    def no_skips(ctx):
        raise AssertionError("must not run")

    @dag.task(parents=[after_after_boom, after_after_skip], trigger_rule="always")
    def always(ctx):
        return "always"

    return dag


async def test_skipped_and_upstream_failed_propagate_through_a_run(store: Store, db_path) -> None:
    dag = propagation_dag()
    run_id = await store.runs.create_run(dag, date(2026, 1, 2))
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=4)
    states = task_states(db_path, run_id)
    assert states == {
        "ok": "SUCCESS",
        "boom": "FAILED",
        "choose": "SUCCESS",
        "taken": "SUCCESS",
        "not_taken": "SKIPPED",
        "after_boom": "UPSTREAM_FAILED",
        "after_after_boom": "UPSTREAM_FAILED",
        "after_skip": "SKIPPED",
        "after_after_skip": "SKIPPED",
        "cleanup": "SUCCESS",
        "alert": "SUCCESS",
        "tolerant": "SUCCESS",
        "needs_one_success": "SKIPPED",
        "on_all_failed": "SKIPPED",
        "any_ok": "UPSTREAM_FAILED",
        "no_skips": "SKIPPED",
        "always": "SUCCESS",
    }
    # a failed leaf (any_ok is UPSTREAM_FAILED and has no children) fails the run
    assert info["state"] == "FAILED"
    assert info["tasks_unfinished"] == 0
    tasks = {t["task_id"]: t for t in await store.views.run_tasks(run_id)}
    assert tasks["cleanup"]["output"] == '["boom", "not_taken", "ok"]'
    # tasks that never ran were decided by their rule, and the log says why
    log = await store.views.task_log(run_id, "after_after_boom")
    assert log is not None
    (last,) = [e for e in log if e["kind"] == "transition"]
    assert (last["from_state"], last["to_state"]) == ("PENDING", "UPSTREAM_FAILED")
    assert "trigger rule all_success" in last["message"]
    skipped = await store.views.task_log(run_id, "not_taken")
    assert skipped is not None
    assert [e["message"] for e in skipped if e["kind"] == "transition"] == ["branch not taken"]


async def test_run_succeeds_when_only_inner_tasks_fail(store: Store, db_path) -> None:
    """A failure absorbed by an all_done leaf leaves the run SUCCESS (leaves decide)."""
    dag = DAG("absorbed")

    @dag.task
    def flaky(ctx):
        raise ValueError("nope")

    @dag.task(parents=[flaky], trigger_rule="all_done")
    def report(ctx):
        return "done"

    run_id = await store.runs.create_run(dag, date(2026, 1, 2))
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag})
    assert task_states(db_path, run_id) == {"flaky": "FAILED", "report": "SUCCESS"}
    assert info["state"] == "SUCCESS"
