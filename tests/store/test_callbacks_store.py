"""Callback rows on both backends: written in the transaction of the transition that
raises the event (once per event, a stale report adds none), claimed like tasks (never
twice), taken back from a silent worker, and a deduplicated record() records once."""

from __future__ import annotations

import asyncio
import json
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from support import backends
from support.exchanging import claim, complete
from support.helpers import FakeClock, attempt_of, ops
from test_store_backends import ALL_SHARDS, deferred, failure, outcome

from executor import DAG, notifications
from executor.store import Store, open_store
from executor.store.callbacks import claim_callbacks
from executor.store.runs import RunShape
from triggers.files import FileTrigger

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 4, 25)


def hook(ctx: Any) -> None:
    return None


async def callbacks(store: Store, run_id: str) -> list[tuple[str | None, str, int | None]]:
    return [
        (r["task_id"], r["event"], r["attempt"])
        for r in await store.callbacks.run_callbacks(run_id)
    ]


async def claim_callback_rows(store: Store, owner: str, n: int = 10) -> list[Any]:
    async with store.db.write() as tx:
        return await claim_callbacks(tx, owner, n, store.clock())


async def test_retries_then_failure_write_one_row_per_event(store: Store) -> None:
    dag = DAG("flaky", on_retry=hook, on_run_failure=hook)
    dag.task(hook, task_id="flaky", retries=2, on_failure=hook)
    dag.task(hook, task_id="quiet")  # the DAG's on_retry only; it succeeds: no row
    run_id = await store.runs.create_run(dag, DAY)
    rows = {r.task_id: r for r in await claim(store, "w", 5)}
    assert (
        rows["flaky"].hooks
        == notifications.HOOK_BITS["on_retry"] | (notifications.HOOK_BITS["on_failure"])
    )
    await complete(store, [failure(rows["flaky"], "boom 1"), outcome(rows["quiet"])])
    stale = failure(rows["flaky"], "boom 1 again")  # a replayed report: moves nothing
    await complete(store, [stale])
    for n in (2, 3):
        [row] = await claim(store, "w", 5)
        await complete(store, [failure(row, f"boom {n}")])
    assert await callbacks(store, run_id) == [
        ("flaky", "on_retry", 1),
        ("flaky", "on_retry", 2),
        ("flaky", "on_failure", 3),
        (None, "on_run_failure", None),
    ]
    messages = [r["message"] for r in await store.callbacks.run_callbacks(run_id)]
    assert "boom 1" in messages[0] and "boom 3" in messages[2]


async def test_claimed_once_and_taken_back_from_a_silent_worker(
    store: Store, clock: FakeClock
) -> None:
    dag = DAG("ok", on_success=hook)
    dag.task(hook, task_id="a")
    dag.task(hook, task_id="b")
    await store.runs.create_run(dag, DAY)
    rows = await claim(store, "w", 5)
    await complete(store, [outcome(r) for r in rows])
    first, second = await asyncio.gather(
        claim_callback_rows(store, "w1", 1), claim_callback_rows(store, "w2", 5)
    )
    assert len(first) + len(second) == 2
    assert {c.id for c in first}.isdisjoint(c.id for c in second)
    assert await claim_callback_rows(store, "w3") == []
    clock.advance(60)
    assert await store.callbacks.reap_callbacks(30) == 2
    again = await claim_callback_rows(store, "w3")
    assert sorted(c.id for c in again) == sorted(c.id for c in first + second)
    assert all(c.tries == 2 for c in again)
    # the task's log says the first worker was lost while delivering
    async with store.db.read() as tx:
        log = await tx.fetch("task_events", task_row=rows[0].id)
    assert any("worker lost while delivering" in (e["message"] or "") for e in log)


async def test_a_gone_workers_callbacks_are_taken_back_with_its_attempts(store: Store) -> None:
    # No clock advance: the liveness lock said the worker is gone, no heartbeat TTL passed.
    dag = DAG("ok", on_success=hook)
    dag.task(hook, task_id="a")
    dag.task(hook, task_id="b")
    await store.runs.create_run(dag, DAY)
    rows = await claim(store, "w", 5)
    await complete(store, [outcome(r) for r in rows])
    gone, other = (
        await claim_callback_rows(store, "dead-worker#1", 1),
        await claim_callback_rows(store, "live-worker#1", 1),
    )
    assert len(gone) == len(other) == 1
    assert await store.exchange.reap_worker("dead-worker", "its process is gone") == 1
    again = await claim_callback_rows(store, "live-worker#2")
    assert [c.id for c in again] == [gone[0].id]  # the live worker's row stays its own
    assert again[0].tries == 2
    async with store.db.read() as tx:
        log = await tx.fetch("task_events", task_row=gone[0].task_row)
    assert any("its process is gone" in (e["message"] or "") for e in log)


async def test_sensor_timeout_raises_its_event(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    dag = DAG("sensing", on_sensor_timeout=hook, on_failure=hook)
    dag.sensor("wait", FileTrigger(path=str(tmp_path / "never")), timeout=5)
    soft = DAG("soft", on_sensor_timeout=hook, on_failure=hook)
    soft.sensor("wait", FileTrigger(path=str(tmp_path / "never")), timeout=5, soft_fail=True)
    hard_run = await store.runs.create_run(dag, DAY)
    soft_run = await store.runs.create_run(soft, DAY)
    rows = await claim(store, "w", 5)
    await complete(
        store,
        [
            deferred(
                r, str(tmp_path / "never"), clock.now, timeout=5.0, soft_fail=r.run_id == soft_run
            )
            for r in rows
        ],
    )
    clock.advance(6)
    assert len(await ops(store).expire_waits(ALL_SHARDS)) == 2
    assert [e for _, e, _ in await callbacks(store, hard_run)] == [
        "on_sensor_timeout",
        "on_failure",
    ]
    assert [e for _, e, _ in await callbacks(store, soft_run)] == ["on_sensor_timeout"]


async def test_record_with_a_key_records_once_and_ends_as_told(store: Store) -> None:
    run_id = await store.runs.create_run(DAG("d"), DAY)
    for _ in range(2):
        async with store.db.write() as tx:
            await notifications.record(
                tx, "late", run_id=run_id, now=store.clock(), message="late!",
                context={"expected_by": "05:30"}, key=f"late:{run_id}",
            )  # fmt: skip
    [row] = await claim_callback_rows(store, "w")
    assert (row.event, row.message, row.context) == ("late", "late!", {"expected_by": "05:30"})
    assert await store.callbacks.callback_delivered(row, "w", ["callback"])
    assert not await store.callbacks.callback_delivered(row, "someone-else", ["x"])
    assert await store.callbacks.end_callback(
        row, "w", state="DONE", done=["callback"], error=None, ready_at=None, log_lines=[]
    )
    [stored] = await store.callbacks.run_callbacks(run_id)
    assert (stored["state"], json.loads(stored["delivered"])) == ("DONE", ["callback"])


def test_the_stored_shape_keeps_the_hooks() -> None:
    dag = DAG("shaped", on_run_success=hook)
    dag.task(hook, task_id="a", notify={"on_retry": "json://127.0.0.1:9/x"})
    shape = RunShape.of(dag)
    back = RunShape.from_json("shaped", shape.to_json())
    assert back == shape and back.hooks == notifications.HOOK_BITS["on_run_success"]
    assert back.tasks[0].hooks == notifications.HOOK_BITS["on_retry"]
    # a shape stored before callbacks existed (a list, 7 fields a task) still reads
    old = json.dumps([["a", [], "all_success", 0, None, None, 1]])
    assert RunShape.from_json("shaped", old).tasks[0].hooks == 0


async def test_a_run_with_no_hooks_writes_no_row(url: str) -> None:
    s = await open_store(url)
    try:
        dag = DAG("plain")
        dag.task(hook, task_id="a", retries=1)
        run_id = await s.runs.create_run(dag, DAY)
        [row] = await claim(s, "w", 5)
        await complete(s, [failure(row, "boom")])
        [row] = await claim(s, "w", 5)
        await complete(s, [outcome(row)])
        assert await s.callbacks.run_callbacks(run_id) == []
        assert attempt_of(row)["attempt"] == 2
    finally:
        await s.close()


HOOKED_SCHEDULE = """
from datetime import datetime
from executor import DAG

def alert(ctx):
    pass

dag = DAG("hooked", schedule="@hourly", start_date=datetime.fromisoformat("{start}"),
          on_run_failure=alert)

@dag.task(retries=1, on_retry=alert)
def work(ctx):
    raise RuntimeError("no")
"""


async def test_a_run_the_triggerer_starts_from_the_catalogue_keeps_its_hooks(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    from support.catalogued import all_runs, catalogue_file
    from support.helpers import write_dag
    from test_starts import T0, fire_start_waits

    clock.set(T0.timestamp() + 600)
    await catalogue_file(
        store,
        write_dag(tmp_path, HOOKED_SCHEDULE.format(start=(T0 - timedelta(hours=2)).isoformat())),
    )
    await fire_start_waits(store)
    [run] = await all_runs(store)
    assert run["hooks"] == notifications.HOOK_BITS["on_run_failure"]
    assert run["dag_file"]  # the worker imports the file for the callables
    [row] = await claim(store, "w", 5)
    assert row.hooks == notifications.HOOK_BITS["on_retry"]
    await complete(store, [failure(row, "no")])
    [row] = await claim(store, "w", 5)
    await complete(store, [failure(row, "no")])
    assert [e for _, e, _ in await callbacks(store, run["run_id"])] == [
        "on_retry",
        "on_run_failure",
    ]


async def test_a_tasks_events_are_claimed_in_order(store: Store, clock: FakeClock) -> None:
    dag = DAG("ordered", on_retry=hook, on_failure=hook)
    dag.task(hook, task_id="flaky", retries=1)
    run_id = await store.runs.create_run(dag, DAY)
    for n in (1, 2):
        [row] = await claim(store, "w", 5)
        await complete(store, [failure(row, f"boom {n}")])
    assert [e for _, e, _ in await callbacks(store, run_id)] == ["on_retry", "on_failure"]
    [first] = await claim_callback_rows(store, "w1")
    assert first.event == "on_retry"
    assert await claim_callback_rows(store, "w2") == []  # on_failure waits for on_retry to end
    await store.callbacks.end_callback(
        first, "w1", state="PENDING", done=[], error="x", ready_at=clock.now + 5, log_lines=[]
    )
    assert await claim_callback_rows(store, "w2") == []  # a retried one still holds it back
    clock.advance(6)
    [again] = await claim_callback_rows(store, "w2")
    assert again.id == first.id
    await store.callbacks.end_callback(
        again, "w2", state="DONE", done=["callback"], error=None, ready_at=None, log_lines=[]
    )
    [last] = await claim_callback_rows(store, "w2")
    assert last.event == "on_failure"
