"""The store's operations, run unchanged against both backends (SQLite and PostgreSQL).

One parametrized fixture, ``store``, opens a fresh database of each kind (PostgreSQL: a
fresh schema per test, see tests/support/pg.py) with a fake clock; the tests call only the Store
API and named queries, so a difference between the backends' SQL shows up here.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import backends
from support.exchanging import claim, complete, run_counts
from support.helpers import FakeClock, async_wait_until, attempt_of, ops, raw_sql, run_to_end
from support.pg import create_schema, drop_schema, with_params

from executor import DAG
from executor.driver.db import TASKS_CHANNEL, TRIGGERS_CHANNEL, Row
from executor.outcomes import Deferred, Failed, Outcome, Succeeded
from executor.rows import MovedTask
from executor.schedules import Schedule
from executor.sensing import deferral
from executor.store import SchemaTooNew, Store, open_store
from executor.store.catalogue import DeclaredDag, UnknownDag
from executor.store.recording import record_outcomes
from executor.store.viewrows import DeferredRow
from triggerer.store import Fire, TriggererBatch
from triggerer.waitref import pack
from triggers.base import SHARDS
from triggers.files import FileTrigger

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 4, 25)
ALL_SHARDS = list(range(SHARDS))


def wait_key(wait: Row) -> int:
    """A loaded wait's key in the triggerer's table."""
    return int(pack(wait["wait_kind"], wait["wait_id"]))


# ----------------------------------------------------------------------------- helpers


async def row_of(store: Store, run_id: str, task_id: str, map_index: int = -1) -> Row:
    async with store.db.read() as tx:
        row = await tx.fetchone("task_row", run_id=run_id, task_id=task_id, map_index=map_index)
    assert row is not None, f"no task {task_id}[{map_index}] in {run_id}"
    return row


async def state_of(store: Store, run_id: str, task_id: str, map_index: int = -1) -> str:
    return (await row_of(store, run_id, task_id, map_index))["state"]


async def transitions(store: Store, row_id: int) -> list[tuple[str, str]]:
    async with store.db.read() as tx:
        events = await tx.fetch("task_events", task_row=row_id)
    return [(e["from_state"], e["to_state"]) for e in events if e["kind"] == "transition"]


def outcome(row: MovedTask, output: Any = None, skip_children: list[str] | None = None) -> Outcome:
    return Succeeded(
        **attempt_of(row), output_json=json.dumps(output), skip_children=skip_children or []
    )


def failure(row: MovedTask, message: str, retry_delay: float = 0.0) -> Outcome:
    return Failed(**attempt_of(row), message=message, retry_delay=retry_delay)


def deferred(
    row: MovedTask, path: str, now: float, *, method: str | None = None, **kw: Any
) -> Outcome:
    d = deferral(
        FileTrigger(path=path),
        method=method,
        method_kwargs={},
        wait_started_at=now,
        timeout=kw.pop("timeout", 3600.0),
        **kw,
    )
    return Deferred(**attempt_of(row), deferral=d)


def ids(rows: list[MovedTask]) -> list[str]:
    return sorted(r.task_id for r in rows)


def noop(ctx: Any) -> None:
    return None


def etl_dag() -> DAG:
    dag = DAG("etl")
    dag.task(noop, task_id="extract")
    dag.task(noop, task_id="transform_a", parents=["extract"])
    dag.task(noop, task_id="transform_b", parents=["extract"])
    dag.task(noop, task_id="load", parents=["transform_a", "transform_b"])
    return dag


# ------------------------------------------------------------------------------- runs


async def test_create_run_makes_roots_claimable_once(store: Store, clock: FakeClock) -> None:
    run_id = await store.runs.create_run(etl_dag(), DAY)
    claimed = await claim(store, "w1", 10)
    assert ids(claimed) == ["extract"]
    row = claimed[0]
    assert (row.state, row.owner, row.started_at) == ("RUNNING", "w1", clock.now)
    assert await claim(store, "w2", 10) == []
    assert await run_counts(store, run_id) == {"RUNNING": 1, "PENDING": 3}
    assert await transitions(store, row.id) == [("PENDING", "RUNNING")]


async def test_exchange_records_success_and_claims_the_children(store: Store) -> None:
    run_id = await store.runs.create_run(etl_dag(), DAY)
    [extract] = await claim(store, "w1", 10)
    children = await store.exchange.exchange([outcome(extract, output={"n": 3})], "w1#1", 10)
    assert ids(children) == ["transform_a", "transform_b"]
    assert all(r.owner == "w1#1" for r in children)
    assert await store.exchange.parent_outputs(children[0]) == {"extract": {"n": 3}}
    # The claim read them too, in its own transaction (no second read before the attempt).
    assert [r.inputs for r in children] == [{"extract": {"n": 3}}] * 2
    [load] = await store.exchange.exchange(
        [outcome(r, output=r.task_id) for r in children], "w2", 10
    )
    assert load.task_id == "load"
    both = {"transform_a": "transform_a", "transform_b": "transform_b"}
    assert await store.exchange.parent_outputs(load) == load.inputs == both
    await complete(store, [outcome(load)])
    info = await store.views.run_info(run_id)
    assert info is not None and info["state"] == "SUCCESS" and info["tasks_unfinished"] == 0
    assert await run_counts(store, run_id) == {"SUCCESS": 4}
    assert await transitions(store, load.id) == [
        ("PENDING", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]
    [(run, counts)] = await store.views.recent_runs(20)
    assert run.run_id == run_id and counts == {"SUCCESS": 4}


async def test_a_failure_retries_after_its_delay_then_fails_the_run(
    store: Store, clock: FakeClock
) -> None:
    dag = DAG("flaky")
    dag.task(noop, task_id="flaky", retries=1)
    dag.task(noop, task_id="after", parents=["flaky"])
    run_id = await store.runs.create_run(dag, DAY)
    [row] = await claim(store, "w", 5)
    await complete(store, [failure(row, "boom", retry_delay=30.0)])
    retrying = await row_of(store, run_id, "flaky")
    assert (retrying["state"], retrying["attempt"]) == ("RETRYING", 2)
    assert retrying["ready_at"] == pytest.approx(clock.now + 30.0)
    assert await claim(store, "w", 5) == []  # not due yet
    clock.advance(31)
    [again] = await claim(store, "w", 5)
    assert (again.task_id, again.state, again.attempt) == ("flaky", "RUNNING", 2)
    await complete(store, [failure(again, "boom again")])
    assert await state_of(store, run_id, "flaky") == "FAILED"
    assert await state_of(store, run_id, "after") == "UPSTREAM_FAILED"
    info = await store.views.run_info(run_id)
    assert info is not None and info["state"] == "FAILED"
    assert await transitions(store, again.id) == [
        ("PENDING", "RUNNING"),
        ("RUNNING", "RETRYING"),
        ("RETRYING", "RUNNING"),
        ("RUNNING", "FAILED"),
    ]


async def test_a_stale_report_changes_nothing(store: Store) -> None:
    run_id = await store.runs.create_run(etl_dag(), DAY)
    [row] = await claim(store, "w1", 5)
    stale = outcome(row)
    stale.owner = "someone-else"
    await complete(store, [stale])
    assert await state_of(store, run_id, "extract") == "RUNNING"


async def test_the_branch_not_taken_is_skipped(store: Store) -> None:
    dag = DAG("branchy")
    dag.task(noop, task_id="choose", branch=True)
    dag.task(noop, task_id="left", parents=["choose"])
    dag.task(noop, task_id="right", parents=["choose"])
    dag.task(noop, task_id="after_right", parents=["right"])
    run_id = await store.runs.create_run(dag, DAY)
    [choose] = await claim(store, "w", 5)
    chosen = outcome(choose, output="left", skip_children=["right"])
    [left] = await store.exchange.exchange([chosen], "w", 5)
    assert left.task_id == "left"
    assert await state_of(store, run_id, "right") == "SKIPPED"
    assert await state_of(store, run_id, "after_right") == "SKIPPED"
    await complete(store, [outcome(left)])
    info = await store.views.run_info(run_id)
    assert info is not None and info["state"] == "SUCCESS"


async def test_a_fan_out_expands_runs_and_fans_in_in_index_order(store: Store) -> None:
    dag = DAG("fan")
    dag.task(noop, task_id="source")
    dag.task(noop, task_id="each", expand="source", retries=2)
    dag.task(noop, task_id="total", parents=["each"])
    run_id = await store.runs.create_run(dag, DAY)
    [source] = await claim(store, "w", 10)
    instances = await store.exchange.exchange([outcome(source, output=[10, 20, 30])], "w", 10)
    assert sorted((r.map_index, json.loads(str(r.item))) for r in instances) == [
        (0, 10),
        (1, 20),
        (2, 30),
    ]
    assert all(r.map_total == 3 and r.max_attempts == 3 for r in instances)
    assert await state_of(store, run_id, "each") == "RUNNING"  # the template
    # finish them out of order; the fan-in sees them in index order
    done = [outcome(r, output=json.loads(str(r.item)) * 2) for r in reversed(instances)]
    [total] = await store.exchange.exchange(done, "w", 10)
    assert total.task_id == "total"
    assert await store.exchange.parent_outputs(total) == total.inputs == {"each": [20, 40, 60]}
    assert await state_of(store, run_id, "each") == "SUCCESS"
    assert await store.views.mapped_counts(run_id) == {"each": {"SUCCESS": 3}}
    await complete(store, [outcome(total)])
    assert await run_counts(store, run_id) == {"SUCCESS": 5}


async def test_an_empty_fan_out_skips_the_mapped_task(store: Store) -> None:
    dag = DAG("empty")
    dag.task(noop, task_id="source")
    dag.task(noop, task_id="each", expand="source")
    run_id = await store.runs.create_run(dag, DAY)
    [source] = await claim(store, "w", 10)
    assert await store.exchange.exchange([outcome(source, output=[])], "w", 10) == []
    assert await state_of(store, run_id, "each") == "SKIPPED"


# --------------------------------------------------------------------------- deferral


def sensor_dag(tmp_path: Path, *, soft_fail: bool = False) -> DAG:
    dag = DAG("waits")
    dag.sensor("wait", FileTrigger(path=str(tmp_path / "in.csv")), soft_fail=soft_fail)
    dag.task(noop, task_id="after", parents=["wait"])
    dag.task(noop, task_id="submit")
    return dag


async def test_run_progress_reads_one_runs_counts_mapped_tasks_waits_and_retries(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    dag = DAG("progress")
    dag.task(noop, task_id="source")
    dag.task(noop, task_id="each", expand="source", retries=1)
    dag.task(noop, task_id="wait")
    dag.task(noop, task_id="after", parents=["each", "wait"])
    run_id = await store.runs.create_run(dag, DAY, run_id="this")
    other = await store.runs.create_run(dag, DAY, run_id="other")
    p = await store.views.run_progress(run_id)
    assert p is not None and p.counts == {"PENDING": 4}
    assert [(m.task_id, m.expand_from, m.map_total) for m in p.mapped] == [("each", "source", None)]
    rows = {(r.run_id, r.task_id): r for r in await claim(store, "w", 10)}
    flag = str(tmp_path / "ready.flag")
    await complete(store, [deferred(rows["other", "wait"], flag, clock.now)])
    started = clock.now
    instances = await store.exchange.exchange(
        [
            outcome(rows["this", "source"], output=[1, 2, 3]),
            deferred(rows["this", "wait"], flag, started),
        ],
        "w",
        10,
    )
    ours = sorted((r for r in instances if r.run_id == run_id), key=lambda r: r.map_index)
    clock.advance(5)
    await complete(
        store, [outcome(ours[0]), failure(ours[1], "boom\nsecond line", retry_delay=30.0)]
    )

    p = await store.views.run_progress(run_id)
    assert p is not None and p.run.run_id == run_id and p.now == clock.now
    assert p.counts == {"SUCCESS": 2, "DEFERRED": 1, "RETRYING": 1, "RUNNING": 1, "PENDING": 1}
    [each] = p.mapped
    assert (each.task_id, each.map_total, each.n_done, each.n_failed) == (
        "each",
        3,
        1,
        0,
    )
    [wait] = p.waits  # not the other run's
    assert (wait.task_id, wait.state, wait.wait_started_at) == (
        "wait",
        "DEFERRED",
        started,
    )
    assert isinstance(wait, DeferredRow)  # a DEFERRED wait has no last check
    assert wait.description == FileTrigger(path=flag).describe()
    [retrying] = p.retrying
    assert (retrying.task_id, retrying.map_index, retrying.attempt) == ("each", 1, 2)
    assert retrying.retrying_since == clock.now
    assert retrying.ready_at == pytest.approx(clock.now + 30.0)
    assert retrying.last_error == "attempt 1 of 2 failed: boom\nsecond line; retrying in 30.0 s"
    assert (await store.views.run_progress(run_id, n=0)).waits == []  # type: ignore[union-attr]
    assert await store.views.run_progress("nope") is None
    assert other != run_id


async def test_a_late_event_does_not_wake_a_task_now_waiting_on_another_trigger(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """A hand-over can deliver an event twice; by then the task may have resumed and
    deferred again, on a new trigger. The late copy must change nothing."""
    run_id = await store.runs.create_run(sensor_dag(tmp_path), DAY)
    submit = {r.task_id: r for r in await claim(store, "w", 10)}["submit"]
    await complete(store, [deferred(submit, str(tmp_path / "one"), clock.now, method="check")])
    (first,) = [w for w in await ops(store).load_triggers(ALL_SHARDS) if wait_key(w) == submit.id]
    old = Fire({submit.id: first["trigger_id"]}, json.dumps(1), "fired: one")
    await ops(store).triggerer_commit(TriggererBatch(fires=[old]))
    again = {r.task_id: r for r in await claim(store, "w2", 10)}["submit"]
    await complete(store, [deferred(again, str(tmp_path / "two"), clock.now, method="check")])
    await ops(store).triggerer_commit(TriggererBatch(fires=[old], failures=[(old.waits, "late")]))
    row = await row_of(store, run_id, "submit")
    assert row["state"] == "DEFERRED" and row["trigger_id"] != first["trigger_id"]


async def test_defer_then_fire_finishes_a_sensor_and_resumes_a_task(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    run_id = await store.runs.create_run(sensor_dag(tmp_path), DAY)
    rows = {r.task_id: r for r in await claim(store, "w", 10)}
    assert sorted(rows) == ["submit", "wait"]
    await complete(
        store,
        [
            deferred(rows["wait"], str(tmp_path / "in.csv"), clock.now),
            deferred(rows["submit"], str(tmp_path / "done.flag"), clock.now, method="check"),
        ],
    )
    assert await run_counts(store, run_id) == {"DEFERRED": 2, "PENDING": 1}
    waits = await ops(store).load_triggers(ALL_SHARDS)
    by_row = {wait_key(w): w for w in waits}
    assert set(by_row) == {rows["wait"].id, rows["submit"].id}
    assert by_row[rows["submit"].id]["next_method"] == "check"
    assert by_row[rows["wait"].id]["next_method"] is None
    newest = max(w["trigger_id"] for w in waits)
    assert await ops(store).load_triggers(ALL_SHARDS, newest) == []

    clock.advance(1)
    on = {wait_key(w): {wait_key(w): w["trigger_id"]} for w in waits}
    fires = [
        Fire(on[rows["wait"].id], json.dumps({"paths": ["in.csv"]}), "fired: in.csv"),
        Fire(on[rows["submit"].id], json.dumps({"flag": True}), "fired: done.flag"),
    ]
    await ops(store).triggerer_commit(
        TriggererBatch(fires=fires, logs=[(rows["wait"].id, "poked")])
    )
    wait = await row_of(store, run_id, "wait")
    assert wait["state"] == "SUCCESS" and json.loads(wait["output"]) == {"paths": ["in.csv"]}
    # the same fire again (a hand-over's double fire) changes nothing
    await ops(store).triggerer_commit(TriggererBatch(fires=fires))
    assert await transitions(store, rows["wait"].id) == [
        ("PENDING", "RUNNING"),
        ("RUNNING", "DEFERRED"),
        ("DEFERRED", "SUCCESS"),
    ]
    claimed = {r.task_id: r for r in await claim(store, "w2", 10)}
    assert sorted(claimed) == ["after", "submit"]
    resumed = claimed["submit"]
    assert resumed.next_method == "check" and json.loads(str(resumed.event)) == {"flag": True}
    assert resumed.attempt == 1  # a deferral is not a new attempt
    assert await store.exchange.parent_outputs(claimed["after"]) == {"wait": {"paths": ["in.csv"]}}
    assert await ops(store).delete_orphan_triggers(ALL_SHARDS) == 2


async def test_a_batch_of_deferrals_gives_each_row_its_own_wait(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """The deferrals of one exchange are written together (one INSERT of trigger rows, one
    compare-and-set): each row still gets its own trigger row, method, kwargs and wait; a
    report sent twice defers once, a stale report moves nothing, and neither leaves a
    trigger row behind."""
    dag = DAG("deferrals")
    for i in range(5):
        dag.task(noop, task_id=f"t{i}")
    run_id = await store.runs.create_run(dag, DAY)
    rows = {r.task_id: r for r in await claim(store, "w", 10)}
    started = clock.now
    clock.advance(2)
    shared = str(tmp_path / "shared")  # equal waits: one poke hash, still two trigger rows
    batch = [
        deferred(rows["t0"], shared, started),
        deferred(rows["t1"], shared, started, timeout=60.0),
        deferred(rows["t2"], str(tmp_path / "two"), clock.now, method="resume"),
        deferred(rows["t2"], str(tmp_path / "two"), clock.now, method="resume"),  # again
        deferred(rows["t3"], str(tmp_path / "three"), clock.now, soft_fail=True),
    ]
    stale = deferred(rows["t4"], str(tmp_path / "four"), clock.now)
    assert isinstance(stale, Deferred)
    stale.owner = "someone else"
    await complete(store, [*batch, stale])

    got = {t: await row_of(store, run_id, t) for t in rows}
    assert {t: r["state"] for t, r in got.items()} == {
        "t0": "DEFERRED", "t1": "DEFERRED", "t2": "DEFERRED", "t3": "DEFERRED", "t4": "RUNNING",
    }  # fmt: skip
    assert len({got[t]["trigger_id"] for t in ("t0", "t1", "t2", "t3")}) == 4
    assert got["t2"]["next_method"] == "resume" and got["t0"]["next_method"] is None
    assert got["t0"]["wait_started_at"] == started and got["t2"]["wait_started_at"] == clock.now
    assert got["t1"]["wait_timeout_at"] == started + 60.0
    assert got["t3"]["soft_fail"] == 1 and got["t0"]["soft_fail"] == 0
    assert await transitions(store, rows["t2"].id) == [
        ("PENDING", "RUNNING"),
        ("RUNNING", "DEFERRED"),
    ]
    waits = await ops(store).load_triggers(ALL_SHARDS)
    assert sorted(wait_key(w) for w in waits) == sorted(
        rows[t].id for t in ("t0", "t1", "t2", "t3")
    )
    assert {w["trigger_id"] for w in waits} == {
        got[t]["trigger_id"] for t in ("t0", "t1", "t2", "t3")
    }
    assert {w["poke_hash"] for w in waits if wait_key(w) in (rows["t0"].id, rows["t1"].id)} == {
        next(w["poke_hash"] for w in waits if wait_key(w) == rows["t0"].id)
    }
    assert await ops(store).delete_orphan_triggers(ALL_SHARDS) == 0  # none left behind


async def test_a_flush_of_many_fires_settles_a_fan_in_once(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """Fires of one flush are one compare-and-set per kind, each row with its own payload
    and message; a child of many of them is bumped once, by all, and then runs."""
    dag = DAG("fan_in")
    for i in range(12):
        dag.sensor(f"s{i:02d}", FileTrigger(path=str(tmp_path / f"f{i % 4}")))
    dag.task(noop, task_id="resumes")
    dag.task(noop, task_id="after", parents=[f"s{i:02d}" for i in range(12)])
    run_id = await store.runs.create_run(dag, DAY)
    rows = {r.task_id: r for r in await claim(store, "w", 20)}
    await complete(store,
        [deferred(r, str(tmp_path / f"f{int(t[1:]) % 4}"), clock.now) for t, r in rows.items()
         if t.startswith("s")]
        + [deferred(rows["resumes"], str(tmp_path / "r"), clock.now, method="again")]
    )  # fmt: skip
    waits = await ops(store).load_triggers(ALL_SHARDS)
    by_row = {wait_key(w): w["trigger_id"] for w in waits}
    fires = [
        Fire({rows[t].id: by_row[rows[t].id]}, json.dumps({"n": t}), f"fired: {t}")
        for t in [*sorted(t for t in rows if t.startswith("s")), "resumes"]
    ]
    fires.append(fires[0])  # one fire twice in the flush (a replay): once
    clock.advance(1)
    await ops(store).triggerer_commit(TriggererBatch(fires=fires))
    for t in rows:
        row = await row_of(store, run_id, t)
        if t == "resumes":
            assert row["state"] == "PENDING" and json.loads(row["event"]) == {"n": t}
        else:
            assert row["state"] == "SUCCESS" and json.loads(row["output"]) == {"n": t}
        events = await store.views.task_log(run_id, t)
        assert events is not None and f"fired: {t}" in [e["message"] for e in events]
    after = await row_of(store, run_id, "after")
    assert (after["n_done"], after["n_success"], after["n_parents"]) == (12, 12, 12)
    assert ids(await claim(store, "w2", 10)) == ["after", "resumes"]


async def test_expired_waits_fail_or_skip(store: Store, clock: FakeClock, tmp_path: Path) -> None:
    hard = await store.runs.create_run(sensor_dag(tmp_path), DAY, run_id="hard")
    soft = await store.runs.create_run(sensor_dag(tmp_path, soft_fail=True), DAY, run_id="soft")
    rows = await claim(store, "w", 10)
    sensors = [r for r in rows if r.task_id == "wait"]
    path = str(tmp_path / "never")
    await complete(
        store,
        [deferred(r, path, clock.now, timeout=5.0, soft_fail=r.run_id == soft) for r in sensors],
    )
    assert await ops(store).expire_waits(ALL_SHARDS) == []
    clock.advance(6)
    assert sorted(await ops(store).expire_waits(ALL_SHARDS)) == sorted(r.id for r in sensors)
    assert await state_of(store, hard, "wait") == "FAILED"
    assert await state_of(store, hard, "after") == "UPSTREAM_FAILED"
    assert await state_of(store, soft, "wait") == "SKIPPED"
    assert await state_of(store, soft, "after") == "SKIPPED"
    assert await ops(store).expire_waits(ALL_SHARDS) == []


async def test_a_trigger_committed_after_a_newer_one_is_still_loaded(
    store: Store, clock: FakeClock, tmp_path: Path, backend: str
) -> None:
    """Ids are handed out at INSERT and seen at COMMIT: on PostgreSQL a deferral may commit
    after a newer one that a load already returned. The next incremental load gets it."""
    if backend.startswith("sqlite"):
        pytest.skip("SQLite serializes writers: ids commit in order")
    dag = DAG("two")
    dag.sensor("a", FileTrigger(path=str(tmp_path / "a")))
    dag.sensor("b", FileTrigger(path=str(tmp_path / "b")))
    await store.runs.create_run(dag, DAY)
    rows = {r.task_id: r for r in await claim(store, "w", 10)}
    async with store.db.write() as slow:
        await record_outcomes(
            slow, [deferred(rows["a"], str(tmp_path / "a"), clock.now)], clock.now
        )
        await complete(store, [deferred(rows["b"], str(tmp_path / "b"), clock.now)])
        first = await ops(store).load_triggers(ALL_SHARDS)
        assert [wait_key(w) for w in first] == [rows["b"].id]
    cursor = first[0]["trigger_id"]
    later = await ops(store).load_triggers(ALL_SHARDS, cursor)
    assert [wait_key(w) for w in later] == [rows["a"].id]
    assert later[0]["trigger_id"] < cursor
    assert await ops(store).load_triggers(ALL_SHARDS, cursor) == []


# ----------------------------------------------------------------------------- leases


async def test_lease_shards_share_fairly_and_take_over_a_dead_triggerer(
    store: Store, clock: FakeClock
) -> None:
    assert len(await ops(store).lease_shards("t1", 10, 10)) == SHARDS
    assert await ops(store).lease_shards("t2", 10, 10) == set()  # nothing free yet
    t1 = await ops(store).lease_shards("t1", 10, 10)  # over its share now: gives half back
    assert len(t1) == SHARDS // 2
    t2 = await ops(store).lease_shards("t2", 10, 10)
    assert len(t2) == SHARDS // 2 and not t1 & t2
    assert {r.id: r.shards for r in await store.views.list_triggerers()} == {"t1": 32, "t2": 32}
    clock.advance(5)
    assert await ops(store).lease_shards("t2", 10, 10) == t2  # renewed, t1 still live
    clock.advance(6)  # t1 silent for 11 s: its leases (10 s) expired
    assert len(await ops(store).lease_shards("t2", 10, 10)) == SHARDS
    await ops(store).triggerer_leave("t2")
    assert [r.id for r in await store.views.list_triggerers()] == ["t1"]
    assert len(await ops(store).lease_shards("t3", 10, 10)) == SHARDS  # t2 gave them back


async def test_a_dead_triggerers_shards_go_to_a_survivor_even_when_a_newcomer_counts(
    store: Store,
) -> None:
    # The dead one's replacement is listed (live) but still starting: the survivor takes
    # every freed shard at once, then gives the newcomer its share at the next renewal.
    t1 = await ops(store).lease_shards("t1", 10, 10)
    assert await ops(store).lease_shards("t2", 10, 10) == set()
    t1 = await ops(store).lease_shards("t1", 10, 10)
    t2 = await ops(store).lease_shards("t2", 10, 10)
    assert len(t1) == len(t2) == SHARDS // 2
    await ops(store).triggerer_beat("t3", 0, None)  # the replacement, holding nothing yet
    assert await ops(store).forget_triggerer("t2") == SHARDS // 2
    assert await ops(store).lease_shards("t1", 10, 10) == t1  # by share alone: nothing more
    assert len(await ops(store).lease_shards("t1", 10, 10, take_free=True)) == SHARDS
    released: set[int] = set()
    t1 = await ops(store).lease_shards("t1", 10, 10, released)
    assert len(t1) == SHARDS // 2 and len(released) == SHARDS // 2
    assert await ops(store).lease_shards("t3", 10, 10) == released


# ------------------------------------------------------------------------- catalogue


def stored(spec: str, timezone: str = "UTC") -> str:
    """A schedule as the catalogue stores it (what a parse of the DAG file would give)."""
    return Schedule.parse(spec, timezone=timezone).to_json()


def text(stored: str | None) -> str | None:
    """The schedule a catalogue row holds, as its DAG wrote it."""
    return None if stored is None else Schedule.from_json(stored).text


async def test_catalogue_records_dags_and_broken_files(store: Store, clock: FakeClock) -> None:
    await store.catalogue.record_parse(
        "/dags/etl.py",
        100.5,
        [DeclaredDag("etl"), DeclaredDag("etl_hourly", stored("@hourly"))],
        None,
    )
    await store.catalogue.record_parse(
        "/dags/broken.py", 7.25, [], "cannot import: SyntaxError (line 1)"
    )
    assert await store.catalogue.catalogue_files() == {
        "/dags/broken.py": 7.25,
        "/dags/etl.py": 100.5,
    }
    dags = await store.catalogue.catalogue_dags()
    assert [
        (d["dag_id"], d["file"], text(d["schedule"]), d["timezone"], d["paused"]) for d in dags
    ] == [
        ("etl", "/dags/etl.py", None, "UTC", 0),
        ("etl_hourly", "/dags/etl.py", "@hourly", "UTC", 0),
    ]
    assert all(d["file_mtime"] == 100.5 and d["parsed_at"] == clock.now for d in dags)
    assert all(d["next_logical_date"] is None and d["parse_error"] is None for d in dags)
    [broken] = await store.catalogue.broken_files()
    assert (broken["path"], broken["mtime"]) == ("/dags/broken.py", 7.25)
    assert broken["parse_error"] == "cannot import: SyntaxError (line 1)"

    # Last run state: the newest run of each DAG.
    await store.runs.create_run(etl_dag(), DAY, run_id="etl-1")
    assert {d["dag_id"]: d["last_run_state"] for d in await store.catalogue.catalogue_dags()} == {
        "etl": "RUNNING",
        "etl_hourly": None,
    }


async def test_catalogue_a_provisional_parse_is_parsed_again_and_a_settled_one_decides(
    store: Store,
) -> None:
    # By hand, in a shell that lacks a module the services have: recorded, not settled.
    await store.catalogue.record_parse(
        "/dags/a.py", 1.0, [], "cannot import: ModuleNotFoundError", settled=False
    )
    await store.catalogue.record_parse("/dags/b.py", 1.0, [DeclaredDag("b")], None, settled=False)
    assert await store.catalogue.catalogue_files() == {"/dags/a.py": None, "/dags/b.py": None}
    [broken] = await store.catalogue.broken_files()
    assert broken["path"] == "/dags/a.py"
    # A service's parse of the same file versions settles both.
    await store.catalogue.record_parse("/dags/a.py", 1.0, [DeclaredDag("a")], None)
    await store.catalogue.record_parse("/dags/b.py", 1.0, [DeclaredDag("b")], None)
    assert await store.catalogue.catalogue_files() == {"/dags/a.py": 1.0, "/dags/b.py": 1.0}
    assert await store.catalogue.broken_files() == []
    assert [d["dag_id"] for d in await store.catalogue.catalogue_dags()] == ["a", "b"]


async def test_catalogue_reparse_keeps_paused_and_drops_what_a_file_no_longer_declares(
    store: Store,
) -> None:
    await store.catalogue.record_parse(
        "/dags/a.py", 1.0, [DeclaredDag("one"), DeclaredDag("two")], None
    )
    await store.catalogue.set_paused("one", True)
    # Broken: its DAGs stay, paused kept, with the error.
    await store.catalogue.record_parse("/dags/a.py", 2.0, [], "cannot import: boom")
    rows = {d["dag_id"]: d for d in await store.catalogue.catalogue_dags()}
    assert rows["one"]["paused"] == 1 and rows["one"]["parse_error"] == "cannot import: boom"
    # Fixed, and now declaring only "one" with a schedule: "two" goes, "one" keeps its pause.
    await store.catalogue.record_parse(
        "/dags/a.py",
        3.0,
        [
            DeclaredDag(
                "one", stored("@daily", "Europe/Paris"), "Europe/Paris", "2026-05-03T22:00:00+00:00"
            )
        ],
        None,
    )
    [one] = await store.catalogue.catalogue_dags()
    assert (one["dag_id"], one["paused"], text(one["schedule"]), one["timezone"]) == (
        "one",
        1,
        "@daily",
        "Europe/Paris",
    )
    assert one["next_logical_date"] == "2026-05-03T22:00:00+00:00"
    assert one["parse_error"] is None and await store.catalogue.broken_files() == []
    await store.catalogue.set_paused("one", False)
    assert (await store.catalogue.catalogue_dags())[0]["paused"] == 0
    with pytest.raises(UnknownDag, match="no DAG 'nope'"):
        await store.catalogue.set_paused("nope", True)


async def test_catalogue_refuses_a_dag_id_held_by_another_file_and_forgets_files(
    store: Store,
) -> None:
    await store.catalogue.record_parse("/dags/a.py", 1.0, [DeclaredDag("shared")], None)
    error = await store.catalogue.record_parse("/dags/b.py", 1.0, [DeclaredDag("shared")], None)
    assert error == "DAG 'shared' is already defined in /dags/a.py"
    # Parsed again on the next scan: its mtime is not recorded.
    assert await store.catalogue.catalogue_files() == {"/dags/a.py": 1.0, "/dags/b.py": None}
    assert [d["file"] for d in await store.catalogue.catalogue_dags()] == ["/dags/a.py"]

    await store.catalogue.forget_files(["/dags/a.py"])
    assert (
        await store.catalogue.record_parse("/dags/b.py", 1.0, [DeclaredDag("shared")], None) is None
    )
    assert [d["file"] for d in await store.catalogue.catalogue_dags()] == ["/dags/b.py"]
    await store.catalogue.forget_files(["/dags/b.py"])
    assert (
        await store.catalogue.catalogue_dags() == []
        and await store.catalogue.catalogue_files() == {}
    )


async def test_the_dags_page_reads_each_dags_newest_runs_and_the_broken_files(
    store: Store, clock: FakeClock
) -> None:
    nightly = DAG("nightly")
    nightly.task(noop, task_id="work")
    await store.catalogue.record_parse(
        "/dags/nightly.py",
        1.0,
        [
            DeclaredDag(
                "nightly",
                stored("0 6 * * *", "Europe/Paris"),
                "Europe/Paris",
                "2026-05-03T04:00:00+00:00",
            )
        ],
        None,
    )
    await store.catalogue.record_parse("/dags/idle.py", 1.0, [DeclaredDag("idle")], None)
    await store.catalogue.record_parse(
        "/dags/broken.py", 2.0, [], "cannot import: SyntaxError (line 1)"
    )
    # 27 runs of nightly, a second apart: the first ends SUCCESS, the second FAILED.
    for day in range(27):
        clock.advance(1)
        await store.runs.create_run(nightly, DAY + timedelta(days=day), run_id=f"nightly-{day:02d}")
        if day < 2:
            [row] = await claim(store, "w", 5)
            await complete(store, [outcome(row) if day == 0 else failure(row, "boom")])
    # A run of a DAG the catalogue does not hold is on no row.
    await store.runs.create_run(etl_dag(), DAY, run_id="etl-1")

    page = await store.views.dags_page()
    assert [d.dag_id for d in page.dags] == ["idle", "nightly"]
    assert text(page.dags[1].schedule) == "0 6 * * *" and page.dags[1].last_run_state == "RUNNING"
    assert set(page.runs) == {"nightly"}  # idle never ran; etl is not catalogued
    shown = page.runs["nightly"]
    # The newest 25, oldest first: the two that ended are older than those.
    assert [r.run_id for r in shown] == [f"nightly-{d:02d}" for d in range(2, 27)]
    assert {r.state for r in shown} == {"RUNNING"}
    assert shown[-1].logical_date == (DAY + timedelta(days=26)).isoformat()
    every = await store.views.dags_page(runs_per_dag=27)
    assert [r.state for r in every.runs["nightly"][:3]] == ["SUCCESS", "FAILED", "RUNNING"]
    [broken] = page.broken_files
    assert (broken.path, broken.parse_error) == (
        "/dags/broken.py",
        "cannot import: SyntaxError (line 1)",
    )

    # Squares go by logical date: a run of an old date (a backfill) lands on the left.
    await store.runs.create_run(nightly, DAY - timedelta(days=1), run_id="backfilled")
    assert (await store.views.dags_page(runs_per_dag=28)).runs["nightly"][0].run_id == "backfilled"
    # Runs of one date created in the same instant are ordered by run_id, on both backends.
    clock.advance(1)
    for run_id in ("same-b", "same-a"):
        await store.runs.create_run(nightly, DAY + timedelta(days=26), run_id=run_id)
    tail = (await store.views.dags_page(runs_per_dag=3)).runs["nightly"]
    assert [r.run_id for r in tail] == ["nightly-26", "same-a", "same-b"]


# ------------------------------------------------------------------------------ misc


async def test_reap_takes_back_the_tasks_of_a_silent_worker(store: Store, clock: FakeClock) -> None:
    dag = DAG("reap")
    dag.task(noop, task_id="retried", retries=1)
    dag.task(noop, task_id="failed")
    run_id = await store.runs.create_run(dag, DAY)
    rows = await claim(store, "dead-worker", 10)
    assert len(await store.exchange.heartbeat("dead-worker", [r.id for r in rows])) == 2
    clock.advance(5)
    assert await store.exchange.reap(30) == 0
    clock.advance(30)
    assert await store.exchange.reap(30) == 2
    assert await state_of(store, run_id, "retried") == "RETRYING"
    assert await state_of(store, run_id, "failed") == "FAILED"


async def test_external_states_answers_many_questions_at_once(store: Store) -> None:
    run_id = await store.runs.create_run(etl_dag(), DAY)
    [extract] = await claim(store, "w", 10)
    await complete(store, [outcome(extract)])
    answers = await store.views.external_states(
        [
            {"dag_id": "etl", "logical_date": DAY.isoformat(), "task_id": None},
            {"dag_id": "etl", "logical_date": DAY.isoformat(), "task_id": "extract"},
            {"dag_id": "etl", "logical_date": DAY.isoformat(), "task_id": "load"},
            {"dag_id": "nope", "logical_date": DAY.isoformat(), "task_id": None},
        ]
    )
    assert [(a["q"], a["state"], a["run_id"]) for a in answers] == [
        (0, "RUNNING", run_id),
        (1, "SUCCESS", run_id),
        (2, "PENDING", run_id),
        (3, None, None),
    ]


async def test_concurrent_claimers_never_claim_a_row_twice(
    store: Store, url: str, clock: FakeClock
) -> None:
    dag = DAG("wide")
    for i in range(300):
        dag.task(noop, task_id=f"t{i:03d}")
    await store.runs.create_run(dag, DAY)
    others = [await open_store(url, clock=clock) for _ in range(3)]
    try:

        async def drain(s: Store, name: str) -> list[int]:
            got: list[int] = []
            while rows := await claim(s, name, 7):
                got += [r.id for r in rows]
            return got

        results = await asyncio.gather(*(drain(s, f"w{i}") for i, s in enumerate([store, *others])))
    finally:
        for s in others:
            await s.close()
    claimed = [i for r in results for i in r]
    assert len(claimed) == 300 and len(set(claimed)) == 300


async def test_an_in_process_worker_runs_a_dag_to_the_end(url: str) -> None:
    dag = DAG("e2e")

    @dag.task
    def items(ctx: Any) -> list[int]:
        return list(range(25))

    @dag.task(expand=items)
    def square(ctx: Any) -> int:
        return ctx.item * ctx.item

    @dag.task(parents=[square])
    def total(ctx: Any) -> int:
        return sum(ctx.inputs["square"])

    store = await open_store(url)
    try:
        run_id = await store.runs.create_run(dag, DAY)
        info = await run_to_end(store, run_id, dags={"e2e": dag}, slots=4)
        assert info["state"] == "SUCCESS"
        assert json.loads((await row_of(store, run_id, "total"))["output"]) == sum(
            i * i for i in range(25)
        )
    finally:
        await store.close()


async def test_reopening_migrates_nothing_and_a_newer_schema_is_refused(url: str) -> None:
    first, second = await asyncio.gather(open_store(url), open_store(url))  # racing migrators
    await first.close()
    await second.close()
    await raw_sql(url, "INSERT INTO schema_version VALUES (999, 'future', 0)")
    with pytest.raises(SchemaTooNew, match="999"):
        await open_store(url)


async def parked(waiting: asyncio.Task[bool], db: Any, channel: str) -> None:
    """PostgreSQL: until ``waiting`` (a ``db.wait(channel, ...)``) sits on the channel's event
    with LISTEN up for it, so what the test writes next must wake that very wait."""

    def sits() -> bool:
        return waiting.done() or (
            db._listen_conn is not None
            and channel in db._listened
            and bool(db._channels[channel]._waiters)  # asyncio.Event's own waiters
        )

    await async_wait_until(sits, timeout=10, what=f"a wait on {channel} listening")
    assert not waiting.done(), f"the wait returned {waiting.result()} before any write"


async def test_wait_wakes_on_new_work_on_postgresql_and_sleeps_on_sqlite(url: str) -> None:
    listener, writer = await open_store(url), await open_store(url)
    try:
        if url.startswith("sqlite"):
            began = time.monotonic()
            assert await listener.db.wait(TASKS_CHANNEL, 0.2) is False
            assert time.monotonic() - began >= 0.19
            return
        await listener.db.wait(TASKS_CHANNEL, 0.01)  # starts listening (may say True once)
        await listener.db.wait(TRIGGERS_CHANNEL, 0.01)
        assert await listener.db.wait(TASKS_CHANNEL, 0.05) is False  # nothing happened

        waiting = asyncio.create_task(listener.db.wait(TASKS_CHANNEL, 10))
        await parked(waiting, listener.db, TASKS_CHANNEL)
        began = time.monotonic()
        run_id = await writer.runs.create_run(etl_dag(), DAY)  # a root becomes claimable
        assert await waiting is True
        assert time.monotonic() - began < 1.0

        # The run's commit may notify more than once (one per statement that made rows
        # claimable), and the later ones may arrive after the first woke us: drain them.
        while await listener.db.wait(TASKS_CHANNEL, 0.3):
            pass
        [extract] = await claim(writer, "w", 1)
        assert await listener.db.wait(TASKS_CHANNEL, 0.3) is False  # claiming wakes nobody
        # a notification that arrives between two waits is not lost
        await complete(writer, [deferred(extract, "/nonexistent/x", writer.clock())])
        # NOTIFY reaches the listening connection some time after the commit: wait until it
        # has been received while nobody waits on the channel, then a wait returns at once.
        channel_flag = listener.db._channels[TRIGGERS_CHANNEL]  # type: ignore[attr-defined]
        await async_wait_until(channel_flag.is_set, timeout=10, what="the NOTIFY to arrive")
        assert await listener.db.wait(TRIGGERS_CHANNEL, 0.0) is True
        assert await state_of(writer, run_id, "extract") == "DEFERRED"
    finally:
        await listener.close()
        await writer.close()


async def test_two_schemas_of_one_database_do_not_wake_each_other(pg_server: str) -> None:
    """NOTIFY is database-wide: each schema's channels carry its own tag."""
    names = [await create_schema(pg_server) for _ in range(2)]
    urls = [with_params(pg_server, search_path=n) for n in names]
    quiet, other_listener, other_writer = [await open_store(u) for u in (urls[0], *urls[1:] * 2)]
    try:
        for db in (quiet.db, other_listener.db):
            await db.wait(TASKS_CHANNEL, 0.01)  # starts listening (may say True once)
        waiting = asyncio.create_task(quiet.db.wait(TASKS_CHANNEL, 30))
        await parked(waiting, quiet.db, TASKS_CHANNEL)
        await other_writer.runs.create_run(etl_dag(), DAY)  # claimable rows in the other schema
        assert await other_listener.db.wait(TASKS_CHANNEL, 30) is True
        # Its own listener heard it; the other schema's waiter goes on sleeping.
        done, _ = await asyncio.wait({waiting}, timeout=1.0)
        assert not done, "a write in another schema woke this schema's wait"
        await quiet.runs.create_run(etl_dag(), DAY)
        assert await waiting is True
    finally:
        for store in (quiet, other_listener, other_writer):
            await store.close()
        for n in names:
            await drop_schema(pg_server, n)


async def test_postgresql_times_come_from_the_server_clock(
    backend: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases, heartbeats and ready_at are stamped with the database's clock, not the
    host's: a host whose wall clock is an hour off still agrees with the server."""
    if backend.startswith("sqlite"):
        pytest.skip("SQLite is one host: the store uses the host clock")
    import asyncpg

    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600.0)
    store = await open_store(url)
    conn = await asyncpg.connect(url)
    try:
        server = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
        assert abs(store.clock() - server) < 0.05
        assert await ops(store).lease_shards("t", 10, 10)
        expiry = await conn.fetchval("SELECT max(expires_at) FROM shard_lease")
        assert expiry == pytest.approx(server + 10, abs=0.5)
    finally:
        await conn.close()
        await store.close()


async def test_postgresql_recovers_when_the_server_drops_its_connections(
    backend: str, url: str
) -> None:
    """A server restart or a failover drops every connection: the next statements work
    again on new connections, and LISTEN comes back by itself (waiters woken meanwhile)."""
    if backend.startswith("sqlite"):
        pytest.skip("no server connection to lose")
    import asyncpg

    name = f"slotless-test-{secrets.token_hex(4)}"  # only this test's connections are cut
    mine = with_params(url, application_name=name)
    listener, writer = await open_store(mine), await open_store(mine)
    admin = await asyncpg.connect(url)
    try:
        await listener.db.wait(TASKS_CHANNEL, 0.01)  # listening now
        assert await listener.db.wait(TASKS_CHANNEL, 0.05) is False
        cut = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = $1",
            name,
        )
        assert cut >= 3  # two pools and the LISTEN connection
        # The lost LISTEN connection wakes its waiters at once: they look for work.
        assert await listener.db.wait(TASKS_CHANNEL, 5.0) is True
        for attempt in range(3):  # the pool hands out a dead connection at most once each
            try:
                await run_counts(writer, "none")
                break
            except Exception:  # the callers (worker, triggerer) retry on any error too
                assert attempt < 2
        await listener.db.wait(TASKS_CHANNEL, 0.01)  # listening again (may say True once)
        waiting = asyncio.create_task(listener.db.wait(TASKS_CHANNEL, 10))
        await parked(waiting, listener.db, TASKS_CHANNEL)
        await writer.runs.create_run(etl_dag(), DAY)
        assert await waiting is True
    finally:
        await admin.close()
        await listener.close()
        await writer.close()


async def test_a_cancelled_sqlite_transaction_ends_before_the_cancellation_goes_on(
    store: Store, backend: str
) -> None:
    """``transact`` runs its body whole in the driver's thread: cancelled meanwhile, it
    returns only once that transaction has ended there (here: committed), and the
    connection goes on serving the next one."""
    if not backend.startswith("sqlite"):
        pytest.skip("PostgreSQL runs the body on the event loop: nothing outlives the await")
    import threading

    entered, go = threading.Event(), threading.Event()
    ended: list[bool] = []

    async def body(tx: Any) -> None:
        entered.set()
        go.wait(30.0)  # in the driver's thread: holds the transaction open
        await tx.execute("worker_beat", id="w", now=1.0, expires_at=2.0)
        ended.append(True)

    call = asyncio.create_task(store.db.transact(body))
    try:
        assert await asyncio.to_thread(entered.wait, 30.0)
        call.cancel()
    finally:
        go.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert ended  # it had ended (committed) when the cancellation came out
    assert await store.exchange.other_workers("me") == ["w"]
