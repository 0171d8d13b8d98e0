"""Every trigger rule through real runs: parents that really end SUCCESS, FAILED, SKIPPED and
UPSTREAM_FAILED, a child per combination of them, and a grandchild under each child.

tests/unit/test_rules.py checks :func:`executor.rules.decide` against a reference evaluator; this
file checks what a run does with it: counters bumped by real completions, decisions written
as states, and the decided state travelling one level further down.

Each DAG has four sources, one per way a parent can end:

    ok                      -> SUCCESS
    bad                     -> FAILED       (raises, no retries)
    uf   (child of bad)     -> UPSTREAM_FAILED
    skip (child of a branch that chooses nothing) -> SKIPPED

and, for the rule under test, one child ``c_<letters>`` per non-empty subset of them
(S = ok, F = bad, K = skip, U = uf), each with a grandchild ``g_<letters>`` (all_success).
"""

from __future__ import annotations

import itertools
import time
from datetime import date

import pytest
from support.helpers import events, run_to_end, sql, task_states

from executor import DAG, TriggerRule
from executor.store import Store

DAY = date(2026, 4, 25)
SOURCES = {"S": "ok", "F": "bad", "K": "skip", "U": "uf"}
COMBOS = [
    "".join(c) for n in range(1, 5) for c in itertools.combinations("SFKU", n)
]  # S F K U SF SK SU FK FU KU SFK SFU SKU FKU SFKU

# What the child ends as: R ran (SUCCESS), K SKIPPED, U UPSTREAM_FAILED; "?" depends on
# which of a skip and a failure reaches it first (see ORDER_DEPENDENT).
#                              S F K U SF SK SU FK FU KU SFK SFU SKU FKU SFKU
# fmt: off
EXPECTED = {
    "all_success":                "R U K U U  K  U  ?  U  ?  ?   U   ?   ?   ?",
    "all_done":                   "R R R R R  R  R  R  R  R  R   R   R   R   R",
    "all_failed":                 "K R K R K  K  K  K  R  K  K   K   K   K   K",
    "one_success":                "R U K U R  R  R  U  U  U  R   R   R   U   R",
    "any_of":                     "R U K U R  R  R  U  U  U  R   R   R   U   R",
    "one_failed":                 "K R K R R  K  R  R  R  R  R   R   R   R   R",
    "none_failed":                "R U R U U  R  U  U  U  U  U   U   U   U   U",
    "none_failed_min_one_success": "R U K U U  R  U  U  U  U  U   U   U   U   U",
    "none_skipped":               "R R K R R  K  R  K  R  K  K   R   K   K   K",
    "always":                     "R R R R R  R  R  R  R  R  R   R   R   R   R",
    # a teardown's, with no setup among these parents (test_task_values.py: with setups)
    "all_done_setup_success":     "R R R R R  R  R  R  R  R  R   R   R   R   R",
}
# fmt: on
STATE = {"R": "SUCCESS", "K": "SKIPPED", "U": "UPSTREAM_FAILED"}

# all_success decides at the first parent that is not a success: a skip gives SKIPPED, a
# failure UPSTREAM_FAILED. With both among the parents, the earlier one wins (as in Airflow).
ORDER_DEPENDENT = {"skip_first": "K", "failure_first": "U"}


def expected_for(rule: str, order: str) -> dict[str, str]:
    letters = EXPECTED[rule].split()
    assert len(letters) == len(COMBOS)
    return {
        combo: STATE[ORDER_DEPENDENT[order] if x == "?" else x]
        for combo, x in zip(COMBOS, letters, strict=True)
    }


def rule_dag(rule: str, order: str) -> DAG:
    """Sources end in a fixed order: with one slot, higher priority runs first."""
    dag = DAG(f"rule_{rule}")
    first, second = (60, 50) if order == "skip_first" else (50, 60)

    @dag.task(priority=70)
    def ok(ctx):
        return "ok"

    @dag.task(priority=first, branch=True)
    def branch(ctx):
        return []  # chooses none of its children: skip ends SKIPPED

    @dag.task(priority=second)
    def bad(ctx):
        raise RuntimeError("bad ends FAILED")

    @dag.task(parents=[branch])
    def skip(ctx):
        raise AssertionError("not chosen by the branch")

    @dag.task(parents=[bad])
    def uf(ctx):
        raise AssertionError("its parent failed")

    def child(ctx):
        return sorted(ctx.inputs)

    def grandchild(ctx):
        return ctx.inputs

    for combo in COMBOS:
        dag.task(
            child,
            task_id=f"c_{combo}",
            parents=[SOURCES[x] for x in combo],
            trigger_rule=rule,
        )
        dag.task(grandchild, task_id=f"g_{combo}", parents=[f"c_{combo}"])
    return dag


@pytest.mark.parametrize("order", ["skip_first", "failure_first"])
@pytest.mark.parametrize("rule", [r.value for r in TriggerRule])
async def test_every_rule_against_every_mix_of_ended_parents(
    store: Store, db_path, rule: str, order: str
) -> None:
    dag = rule_dag(rule, order)
    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=1)
    states = task_states(db_path, run_id)

    sources = {x: states[t] for x, t in SOURCES.items()}
    assert sources == {"S": "SUCCESS", "F": "FAILED", "K": "SKIPPED", "U": "UPSTREAM_FAILED"}

    expected = expected_for(rule, order)
    got = {combo: states[f"c_{combo}"] for combo in COMBOS}
    assert got == expected

    # one level further: an all_success grandchild runs, or inherits SKIPPED / UPSTREAM_FAILED
    assert {c: states[f"g_{c}"] for c in COMBOS} == expected

    # a child that ran saw every parent's output (None for one that did not succeed)
    for combo in COMBOS:
        if expected[combo] == "SUCCESS":
            (row,) = sql(
                db_path,
                "SELECT output FROM task WHERE run_id = ? AND task_id = ?",
                run_id,
                f"c_{combo}",
            )
            assert row["output"] is not None

    # a child that did not run was decided by its rule, and its log says which
    for combo in COMBOS:
        if expected[combo] != "SUCCESS":
            log = [e for e in events(db_path, run_id, f"c_{combo}") if e["kind"] == "transition"]
            assert [(e["from_state"], e["to_state"]) for e in log] == [("PENDING", expected[combo])]
            assert log[0]["message"].startswith(f"trigger rule {rule}: ")

    # the run fails exactly when a leaf (a grandchild) ended FAILED or UPSTREAM_FAILED
    leaf_failed = any(s == "UPSTREAM_FAILED" for s in expected.values())
    assert info["state"] == ("FAILED" if leaf_failed else "SUCCESS")
    assert info["tasks_unfinished"] == 0


@pytest.mark.parametrize("rule", ["one_success", "any_of", "one_failed", "always"])
async def test_early_rules_fire_while_another_parent_is_still_running(
    store: Store, db_path, rule: str
) -> None:
    """one_success / any_of run at the first success, one_failed at the first failure and
    always at once: none of them waits for a parent that is still running."""
    dag = DAG(f"early_{rule}")

    @dag.task(priority=10)
    def quick_ok(ctx):
        return "ok"

    @dag.task(priority=10)
    def quick_bad(ctx):
        raise RuntimeError("bad")

    @dag.task
    def slow(ctx):
        # ends only once the child below has ended: proof that the child did not wait
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            rows = sql(
                db_path, "SELECT state FROM task WHERE run_id = ? AND task_id = 'early'", ctx.run_id
            )
            if rows[0]["state"] == "SUCCESS":
                return "slow done"
            time.sleep(0.01)
        raise TimeoutError("the child waited for this parent")

    @dag.task(parents=[quick_ok, quick_bad, slow], trigger_rule=rule)
    def early(ctx):
        return "early"

    run_id = await store.runs.create_run(dag, DAY)
    await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=3)
    assert task_states(db_path, run_id) == {
        "quick_ok": "SUCCESS",
        "quick_bad": "FAILED",
        "slow": "SUCCESS",
        "early": "SUCCESS",
    }
    (slow_row,) = sql(
        db_path, "SELECT ended_at FROM task WHERE run_id = ? AND task_id = 'slow'", run_id
    )
    (early_row,) = sql(
        db_path, "SELECT ended_at FROM task WHERE run_id = ? AND task_id = 'early'", run_id
    )
    assert early_row["ended_at"] <= slow_row["ended_at"]
