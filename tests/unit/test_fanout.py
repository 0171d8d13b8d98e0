"""Dynamic fan-out and fan-in, end to end: expansion, per-instance attempts, outputs in index
order, replays, the width cap, bad and empty lists, atomicity, and O(1) readiness.

Most tests run a real in-process worker over a real SQLite file; the ones about replays,
crashes and costs drive the store directly (claim, then complete with an Outcome) so that
they control exactly which transaction happens when.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
import threading
import time
from collections import Counter
from datetime import date
from typing import Any

import pytest
from support.exchanging import claim, complete
from support.helpers import attempt_of, events, run_to_end, sql, task_states

from executor import DAG
from executor.outcomes import Outcome, Succeeded
from executor.rows import MovedTask
from executor.store import Store

DAY = date(2026, 4, 25)


# ----------------------------------------------------------------------------- helpers


def ok(row: MovedTask, output: Any = None) -> Outcome:
    """The report of a successful attempt of a claimed ``row``."""
    return Succeeded(**attempt_of(row), output_json=json.dumps(output))


def instances(db_path, run_id: str, task_id: str) -> list[dict]:
    return sql(
        db_path,
        "SELECT * FROM task WHERE run_id = ? AND task_id = ? AND map_index >= 0 ORDER BY map_index",
        run_id,
        task_id,
    )


def template(db_path, run_id: str, task_id: str) -> dict:
    (row,) = sql(
        db_path,
        "SELECT * FROM task WHERE run_id = ? AND task_id = ? AND map_index = -1",
        run_id,
        task_id,
    )
    return row


def messages(db_path, run_id: str, task_id: str, map_index: int = -1) -> list[str]:
    return [e["message"] for e in events(db_path, run_id, task_id, map_index)]


def claims(db_path, run_id: str, task_id: str) -> Counter:
    """How many attempts each instance of a mapped task started (map_index -> count)."""
    rows = sql(
        db_path,
        "SELECT t.map_index FROM task_event e JOIN task t ON t.id = e.task_row"
        " WHERE t.run_id = ? AND t.task_id = ? AND t.map_index >= 0"
        " AND e.kind = 'transition' AND e.to_state = 'RUNNING'",
        run_id,
        task_id,
    )
    return Counter(r["map_index"] for r in rows)


def fan_dag(n: int, *, map_cap: int | None = None, fan_in_rule: str = "all_success") -> DAG:
    """source -> each (expand over source) -> total."""
    dag = DAG(f"fan{n}")

    @dag.task
    def source(ctx):
        return list(range(n))

    @dag.task(expand=source, map_cap=map_cap)
    def each(ctx):
        return ctx.item

    @dag.task(parents=[each], trigger_rule=fan_in_rule)
    def total(ctx):
        return len(ctx.inputs["each"])

    return dag


async def claim_one(store: Store, task_id: str) -> MovedTask:
    rows = await claim(store, "w", 10)
    assert [r.task_id for r in rows] == [task_id], rows
    return rows[0]


# ------------------------------------------------------------ what instances and fan-ins see


async def test_instances_see_item_index_total_and_the_fan_in_gets_outputs_in_index_order(
    store: Store, db_path
) -> None:
    n = 40
    dag = DAG("shapes")

    @dag.task
    def tiles(ctx):
        return [{"x": i % 8, "y": i // 8} for i in range(n)]

    @dag.task
    def scale(ctx):
        return 10

    @dag.task(expand=tiles, parents=[scale])
    def render(ctx):
        # later instances finish first, so completion order is the reverse of index order
        time.sleep(0.002 * (ctx.total - ctx.index))
        return {
            "item": ctx.item,
            "index": ctx.index,
            "total": ctx.total,
            "inputs": ctx.inputs,  # the other parents, not the list the item was cut from
            "scaled": ctx.item["x"] * ctx.inputs["scale"],
        }

    @dag.task(parents=[render])
    def merge(ctx):
        return ctx.inputs["render"]

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=8)
    assert info["state"] == "SUCCESS"

    expected = [
        {
            "item": {"x": i % 8, "y": i // 8},
            "index": i,
            "total": n,
            "inputs": {"scale": 10},
            "scaled": (i % 8) * 10,
        }
        for i in range(n)
    ]
    merged = json.loads(template(db_path, run_id, "merge")["output"])
    assert merged == expected
    # the instances really did finish out of order
    ended = sorted(instances(db_path, run_id, "render"), key=lambda r: (r["ended_at"], r["id"]))
    assert [r["map_index"] for r in ended] != list(range(n))
    # the fan-in counts the mapped task as one parent
    assert template(db_path, run_id, "merge")["n_parents"] == 1
    assert template(db_path, run_id, "render")["map_total"] == n
    assert f"expanded over tiles into {n} instances" in messages(db_path, run_id, "render")


async def test_each_instance_has_its_own_attempts(store: Store, db_path) -> None:
    calls: list[tuple[int, int]] = []
    lock = threading.Lock()
    dag = DAG("attempts")

    @dag.task
    def items(ctx):
        return ["a", "b", "c", "d", "e"]

    @dag.task(expand=items, retries=2, retry_delay=0)
    def work(ctx):
        with lock:
            calls.append((ctx.index, ctx.attempt))
        if ctx.item == "c" and ctx.attempt < 3:
            raise RuntimeError(f"flaky {ctx.item} on attempt {ctx.attempt}")
        return ctx.item.upper()

    @dag.task(parents=[work])
    def joined(ctx):
        return "".join(ctx.inputs["work"])

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=4)
    assert info["state"] == "SUCCESS"
    # instance 2 ran three times; none of the others ran again
    assert sorted(calls) == [(0, 1), (1, 1), (2, 1), (2, 2), (2, 3), (3, 1), (4, 1)]
    assert claims(db_path, run_id, "work") == {0: 1, 1: 1, 2: 3, 3: 1, 4: 1}
    assert [r["attempt"] for r in instances(db_path, run_id, "work")] == [1, 1, 3, 1, 1]
    log = messages(db_path, run_id, "work", 2)
    assert any("attempt 1 of 3 failed: RuntimeError: flaky c on attempt 1" in m for m in log)
    assert template(db_path, run_id, "joined")["output"] == '"ABCDE"'


async def test_a_failed_instance_fails_the_mapped_task_and_downstream_follows_its_rule(
    store: Store, db_path
) -> None:
    dag = DAG("one_bad")

    @dag.task
    def items(ctx):
        return [1, 2, 0, 4]

    @dag.task(expand=items)
    def invert(ctx):
        return 1 / ctx.item  # item 0 fails, for good (no retries)

    @dag.task(parents=[invert], trigger_rule="all_done")
    def report(ctx):
        return ctx.inputs["invert"]

    @dag.task(parents=[invert])
    def strict(ctx):
        raise AssertionError("must not run: an instance failed")

    @dag.task(parents=[invert], trigger_rule="one_failed")
    def alert(ctx):
        return "paged"

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=4)
    assert task_states(db_path, run_id) == {
        "items": "SUCCESS",
        "invert": "FAILED",
        "report": "SUCCESS",
        "strict": "UPSTREAM_FAILED",
        "alert": "SUCCESS",
    }
    assert info["state"] == "FAILED"  # strict is a leaf and did not run
    assert [r["state"] for r in instances(db_path, run_id, "invert")] == [
        "SUCCESS",
        "SUCCESS",
        "FAILED",
        "SUCCESS",
    ]
    # a failed instance's place in the list is kept (None), so indexes still line up
    assert json.loads(template(db_path, run_id, "report")["output"]) == [1.0, 0.5, None, 0.25]
    assert "all 4 instances ended: of 4 instances, 3 succeeded, 1 failed" in messages(
        db_path, run_id, "invert"
    )


async def test_mapping_over_a_mapped_task_takes_its_outputs_in_order(store: Store, db_path):
    dag = DAG("chain")

    @dag.task
    def words(ctx):
        return ["ab", "cde", "f"]

    @dag.task(expand=words)
    def length(ctx):
        return len(ctx.item)

    @dag.task(expand=length)
    def square(ctx):
        return ctx.item * ctx.item

    @dag.task(parents=[square])
    def total(ctx):
        return ctx.inputs["square"]

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=4)
    assert info["state"] == "SUCCESS"
    assert [json.loads(r["item"]) for r in instances(db_path, run_id, "square")] == [2, 3, 1]
    assert template(db_path, run_id, "total")["output"] == "[4, 9, 1]"


# --------------------------------------------------------------------------------- replays


async def test_replaying_the_upstream_success_creates_no_duplicate(store: Store, db_path) -> None:
    dag = fan_dag(5)
    run_id = await store.runs.create_run(dag, DAY)
    source = await claim_one(store, "source")
    done = ok(source, list(range(5)))
    await complete(store, [done])
    await complete(store, [done])  # the same report again: a retried flush, a replayed hook
    await complete(store, [done, done])
    rows = instances(db_path, run_id, "each")
    assert [r["map_index"] for r in rows] == [0, 1, 2, 3, 4]
    tpl = template(db_path, run_id, "each")
    assert (tpl["state"], tpl["n_parents"], tpl["map_total"]) == ("RUNNING", 5, 5)
    expanded = [m for m in messages(db_path, run_id, "each") if m.startswith("expanded")]
    assert expanded == ["expanded over source into 5 instances"]
    assert [e["to_state"] for e in events(db_path, run_id, "source") if e["to_state"]] == [
        "RUNNING",
        "SUCCESS",
    ]


async def test_replaying_an_instance_success_counts_it_once(store: Store, db_path) -> None:
    dag = fan_dag(3)
    run_id = await store.runs.create_run(dag, DAY)
    source = await claim_one(store, "source")
    first = await store.exchange.exchange([ok(source, [7, 8, 9])], "w", 1)
    assert [(r.task_id, r.map_index) for r in first] == [("each", 0)]
    report = ok(first[0], 7)
    for _ in range(3):
        await complete(store, [report])
    tpl = template(db_path, run_id, "each")
    assert (tpl["n_done"], tpl["n_success"], tpl["state"]) == (1, 1, "RUNNING")
    rest = await claim(store, "w", 10)
    assert sorted(r.map_index for r in rest) == [1, 2]
    total = await store.exchange.exchange([ok(r, json.loads(str(r.item))) for r in rest], "w", 10)
    assert [r.task_id for r in total] == ["total"]
    assert await store.exchange.parent_outputs(total[0]) == {"each": [7, 8, 9]}


# --------------------------------------------------------------------------------- the cap


async def test_past_its_cap_the_upstream_fails_with_count_and_cap_and_the_run_goes_on(
    store: Store, db_path
) -> None:
    dag = DAG("capped")

    @dag.task
    def source(ctx):
        return list(range(12))

    @dag.task(expand=source, map_cap=10)
    def each(ctx):
        raise AssertionError("no instance may run")

    @dag.task(parents=[each], trigger_rule="all_done")
    def cleanup(ctx):
        return ctx.inputs

    @dag.task(parents=[source], trigger_rule="one_failed")
    def alert(ctx):
        return "paged"

    @dag.task
    def unrelated(ctx):
        return "fine"

    run_id = await store.runs.create_run(dag, DAY)
    await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=2)
    assert task_states(db_path, run_id) == {
        "source": "FAILED",
        "each": "UPSTREAM_FAILED",
        "cleanup": "SUCCESS",
        "alert": "SUCCESS",
        "unrelated": "SUCCESS",
    }
    assert instances(db_path, run_id, "each") == []
    failed = [e for e in events(db_path, run_id, "source") if e["to_state"] == "FAILED"]
    assert len(failed) == 1
    assert "fan-out of 12 items from source exceeds the cap of 10" in failed[0]["message"]
    assert "no instance was created" in failed[0]["message"]
    assert "(mapped task each)" in failed[0]["message"]
    assert template(db_path, run_id, "source")["output"] is None
    assert json.loads(template(db_path, run_id, "cleanup")["output"]) == {"each": []}


async def test_the_deployment_cap_comes_from_slotless_max_map(
    store: Store, db_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTLESS_MAX_MAP", "3")
    over = fan_dag(4)
    run_id = await store.runs.create_run(over, DAY)
    await run_to_end(store, run_id, dags={over.dag_id: over})
    assert task_states(db_path, run_id)["source"] == "FAILED"
    assert any(
        "fan-out of 4 items from source exceeds the cap of 3" in m
        for m in messages(db_path, run_id, "source")
    )
    assert instances(db_path, run_id, "each") == []

    at_cap = fan_dag(3)
    run_id = await store.runs.create_run(at_cap, DAY)
    info = await run_to_end(store, run_id, dags={at_cap.dag_id: at_cap})
    assert info["state"] == "SUCCESS"
    assert len(instances(db_path, run_id, "each")) == 3

    # a per-task cap overrides the deployment's, in both directions
    wider = fan_dag(5, map_cap=5)
    run_id = await store.runs.create_run(wider, DAY)
    assert (await run_to_end(store, run_id, dags={wider.dag_id: wider}))["state"] == "SUCCESS"


async def test_the_store_enforces_the_cap_when_the_worker_cannot(store: Store, db_path) -> None:
    """Mapping over a mapped task: the list exists only once its instances ended, so the
    check happens at expansion, and the mapped task fails (its upstream did nothing wrong)."""
    dag = DAG("chained_cap")

    @dag.task
    def words(ctx):
        return ["a", "b", "c"]

    @dag.task(expand=words)
    def upper(ctx):
        return ctx.item.upper()

    @dag.task(expand=upper, map_cap=2)
    def again(ctx):
        raise AssertionError("must not run")

    run_id = await store.runs.create_run(dag, DAY)
    await run_to_end(store, run_id, dags={dag.dag_id: dag})
    states = task_states(db_path, run_id)
    assert (states["upper"], states["again"]) == ("SUCCESS", "FAILED")
    assert instances(db_path, run_id, "again") == []
    assert any(
        "fan-out of 3 items from upper exceeds the cap of 2" in m
        for m in messages(db_path, run_id, "again")
    )


# ------------------------------------------------------------------- not a list; empty list


@pytest.mark.parametrize(
    ("value", "kind"),
    [({"tiles": [1, 2]}, "dict"), ("abc", "str"), (3, "int"), (None, "NoneType")],
)
async def test_mapping_over_something_that_is_not_a_list_fails_the_upstream(
    store: Store, db_path, value: Any, kind: str
) -> None:
    dag = DAG("not_a_list")

    @dag.task
    def source(ctx):
        return value

    @dag.task(expand=source)
    def each(ctx):
        raise AssertionError("must not run")

    @dag.task(parents=[source], trigger_rule="all_done")
    def goes_on(ctx):
        return "ran"

    run_id = await store.runs.create_run(dag, DAY)
    await run_to_end(store, run_id, dags={dag.dag_id: dag})
    assert task_states(db_path, run_id) == {
        "source": "FAILED",
        "each": "UPSTREAM_FAILED",
        "goes_on": "SUCCESS",
    }
    assert any(
        f"cannot map over the output of source: it is a {kind}, not a list (mapped task each)" in m
        for m in messages(db_path, run_id, "source")
    )


async def test_an_empty_list_skips_the_mapped_task_and_downstream_follows_its_rule(
    store: Store, db_path
) -> None:
    dag = DAG("empty")

    @dag.task
    def source(ctx):
        return []

    @dag.task(expand=source)
    def each(ctx):
        raise AssertionError("nothing to run")

    @dag.task(parents=[each])
    def strict(ctx):
        raise AssertionError("all_success over a skipped parent is skipped")

    @dag.task(parents=[each], trigger_rule="all_done")
    def summary(ctx):
        return {"n": len(ctx.inputs["each"]), "inputs": ctx.inputs}

    @dag.task(parents=[each], trigger_rule="none_failed")
    def tolerant(ctx):
        return "ran"

    @dag.task(parents=[each], trigger_rule="none_failed_min_one_success")
    def needs_one(ctx):
        raise AssertionError("no parent succeeded")

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag})
    assert task_states(db_path, run_id) == {
        "source": "SUCCESS",
        "each": "SKIPPED",
        "strict": "SKIPPED",
        "summary": "SUCCESS",
        "tolerant": "SUCCESS",
        "needs_one": "SKIPPED",
    }
    assert info["state"] == "SUCCESS"
    assert instances(db_path, run_id, "each") == []
    assert json.loads(template(db_path, run_id, "summary")["output"]) == {
        "n": 0,
        "inputs": {"each": []},
    }
    assert "source returned an empty list: no instance to run" in messages(db_path, run_id, "each")


# ------------------------------------------------------------------------------ atomicity


async def test_a_crash_while_creating_instances_leaves_neither_success_nor_instances(
    store: Store, db_path
) -> None:
    dag = fan_dag(5)
    run_id = await store.runs.create_run(dag, DAY)
    source = await claim_one(store, "source")
    # the third instance's insert fails inside the transaction that records the success
    sql(
        db_path,
        "CREATE TRIGGER crash BEFORE INSERT ON task WHEN NEW.map_index = 2"
        " BEGIN SELECT RAISE(ABORT, 'disk on fire'); END",
    )
    done = ok(source, list(range(5)))
    with pytest.raises(sqlite3.DatabaseError, match="disk on fire"):
        await complete(store, [done])
    src = template(db_path, run_id, "source")
    assert (src["state"], src["output"]) == ("RUNNING", None)
    assert instances(db_path, run_id, "each") == []
    tpl = template(db_path, run_id, "each")
    assert (tpl["state"], tpl["map_total"], tpl["n_parents"]) == ("PENDING", None, 1)
    assert "SUCCESS" not in [e["to_state"] for e in events(db_path, run_id, "source")]

    # the same report, once the fault is gone, records both at once
    sql(db_path, "DROP TRIGGER crash")
    await complete(store, [done])
    assert template(db_path, run_id, "source")["state"] == "SUCCESS"
    assert [r["map_index"] for r in instances(db_path, run_id, "each")] == [0, 1, 2, 3, 4]
    assert template(db_path, run_id, "each")["state"] == "RUNNING"


# ----------------------------------------------------------------- O(1) readiness, 100,000


async def _completion_cost(store: Store, outcome: Outcome) -> tuple[list[str], int]:
    """The statements one ``complete`` runs, and the SQLite VM instructions they cost."""
    statements: list[str] = []
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    conn = store.db._conn  # type: ignore[attr-defined]
    await conn.set_trace_callback(statements.append)
    await conn.set_progress_handler(step, 1)
    try:
        await complete(store, [outcome])
    finally:
        await conn.set_progress_handler(None, 1)
        await conn.set_trace_callback(None)
    return statements, steps[0]


def _shape(statements: list[str]) -> list[str]:
    """Statements without comments and literal values (the trace shows them bound)."""
    out = []
    for text in statements:
        text = re.sub(r"--[^\n]*", "", text)
        text = re.sub(r"'[^']*'|\b\d+(\.\d+)?\b", "?", text)
        out.append(" ".join(text.split()))
    return out


async def _expanded(store: Store, n: int) -> str:
    run_id = await store.runs.create_run(fan_dag(n, map_cap=n), DAY)
    source = await claim_one(store, "source")
    await complete(store, [ok(source, list(range(n)))])
    return run_id


async def test_a_completion_costs_the_same_with_10_or_100000_siblings(store: Store) -> None:
    costs = {}
    for n in (10, 100_000):
        await _expanded(store, n)
        a, b = await claim(store, "w", 2)
        costs[n] = await _completion_cost(store, ok(a, 0))
        # the second one as well, so a first-time cache effect does not decide the result
        costs[n] = max(costs[n], await _completion_cost(store, ok(b, 1)), key=lambda c: c[1])
        while await claim(store, "w", 10_000):  # out of the next run's way
            pass
    (small, small_steps), (big, big_steps) = costs[10], costs[100_000]
    assert _shape(small) == _shape(big)
    assert len(big) <= 8, big  # BEGIN, output, CAS, event, template counter, COMMIT
    # Same statements, same plans: the work differs only by B-tree depth, never by N.
    assert big_steps <= 1.1 * small_steps, (small_steps, big_steps)


async def test_a_fan_in_over_100000_instances(store: Store) -> None:
    n = 100_000
    started = time.perf_counter()
    run_id = await _expanded(store, n)
    created = time.perf_counter() - started

    # Claim every instance, then report them in a shuffled order, in batches.
    claimed: list[MovedTask] = []
    while len(claimed) < n:
        batch = await claim(store, "w", 10_000)
        assert batch and all(r.task_id == "each" for r in batch)
        claimed += batch
    rng = random.Random(7)
    rng.shuffle(claimed)
    last, rest = claimed[-1], claimed[:-1]
    for i in range(0, len(rest), 10_000):
        await complete(store, [ok(r, 3 * r.map_index) for r in rest[i : i + 10_000]])
        assert await claim(store, "w", 1) == []  # the fan-in waits for every instance

    # The last instance's completion decides the fan-in, still in a constant number of steps.
    statements, _ = await _completion_cost(store, ok(last, 3 * last.map_index))
    assert len(statements) <= 14, _shape(statements)
    [fan_in] = await claim(store, "w", 10)
    assert fan_in.task_id == "total"
    inputs = await store.exchange.parent_outputs(fan_in)
    assert inputs["each"] == [3 * i for i in range(n)]
    await complete(store, [ok(fan_in, n)])
    info = await store.views.run_info(run_id)
    assert info is not None and info["state"] == "SUCCESS"
    elapsed = time.perf_counter() - started
    # Generous bounds against a pathological (per-instance, quadratic) path only: the cost is
    # bounded above by statement counts, and speed lives in benchmarks/fanout.py.
    assert created < 60 and elapsed < 300, (created, elapsed)
