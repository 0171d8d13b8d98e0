"""The triggerer in-process on the real SQLite store: one check per distinct condition at the
shortest interval asked for, batched calls, per-task timeouts, sampled logs, cleanup."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from datetime import date
from pathlib import Path

import pytest
from support.helpers import async_wait_until, sql
from support.triggers import (
    BATCHES,
    FLAGS,
    BatchFlagTrigger,
    FlagTrigger,
    PushFlagTrigger,
    log_text,
    pokes_of,
    serving,
    spy_listings,
    state_of,
    task_row,
    task_rows,
    transition_events,
)

from executor import DAG
from triggers.base import BaseTrigger
from triggers.files import FileTrigger
from triggers.temporal import TimeDeltaTrigger

DAY = date(2026, 4, 25)

pytestmark = pytest.mark.usefixtures("fresh_triggers")


def fan_out_dag(dag_id: str, n: int, make_trigger, *, timeout_for=lambda item: None) -> DAG:
    """``n`` mapped instances; instance ``i`` defers on ``make_trigger(i)``, then returns."""
    dag = DAG(dag_id)

    @dag.task
    def items(ctx):
        return list(range(n))

    @dag.task(expand=items)
    def wait(ctx):
        ctx.defer(make_trigger(ctx.item), method="done", timeout=timeout_for(ctx.item))

    @wait.method
    def done(ctx):
        return ctx.event

    return dag


def instances(db_path: Path, run_id: str) -> list[dict]:
    return [r for r in task_rows(db_path, run_id, "wait") if r["map_index"] >= 0]


def all_in(db_path: Path, run_id: str, state: str, n: int) -> bool:
    rows = instances(db_path, run_id)
    return len(rows) == n and all(r["state"] == state for r in rows)


def assert_sequential(times: list[float], interval: float) -> None:
    """One check at a time, never sooner than ``interval`` after the previous one."""
    for a, b in itertools.pairwise(times):
        assert b - a >= interval - 1e-6, (a, b)


async def test_many_waits_on_one_condition_are_one_check(store, db_path) -> None:
    n = 40
    # One instance asks for 0.1 s, the others for an hour: the check runs every 0.1 s.
    dag = fan_out_dag(
        "dedup", n, lambda i: FlagTrigger(name="shared", poke_interval=0.1 if i == 7 else 3600)
    )
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False) as h:
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", n), what="all deferred")
        assert len({r["poke_hash"] for r in sql(db_path, "SELECT poke_hash FROM trigger")}) == 1
        trig = await h.start_triggerer()
        await async_wait_until(lambda: len(pokes_of("shared")) >= 5, what="five checks")
        (check,) = trig.table.by_hash.values()
        assert len(check.subscribers) == n and check.interval == 0.1
        FLAGS.add("shared")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", n), what="all resumed")
        checks_done = trig.checks_done
    pokes = pokes_of("shared")
    assert checks_done == len(pokes)  # every check the triggerer made was this one
    assert_sequential(pokes, 0.1)
    # Fired together: one transaction flipped every subscriber.
    woke = {
        e["ts"]
        for r in instances(db_path, run_id)
        for e in transition_events(db_path, r["id"])
        if (e["from_state"], e["to_state"]) == ("DEFERRED", "PENDING")
    }
    assert len(woke) == 1
    assert {json.loads(r["output"])["name"] for r in instances(db_path, run_id)} == {"shared"}


async def test_a_newcomer_with_a_shorter_interval_speeds_up_the_shared_check(store) -> None:
    def one_waiter(dag_id: str, interval: float) -> DAG:
        dag = DAG(dag_id)

        @dag.task
        def wait(ctx):
            ctx.defer(FlagTrigger(name="shared", poke_interval=interval), method="done")

        @wait.method
        def done(ctx):
            return ctx.event

        return dag

    slow, fast = one_waiter("slow", 3600), one_waiter("fast", 0.1)
    slow_run = await store.runs.create_run(slow, DAY)
    async with serving(store, slow, fast) as h:
        await async_wait_until(lambda: len(pokes_of("shared")) == 1, what="the first check")
        # The next check of the hourly wait is an hour away ... until someone is in a hurry.
        await store.runs.create_run(fast, DAY)
        await async_wait_until(lambda: len(pokes_of("shared")) >= 4, timeout=10, what="fast checks")
        assert h.triggerer is not None
        (check,) = h.triggerer.table.by_hash.values()
        assert len(check.subscribers) == 2 and check.interval == 0.1
        FLAGS.add("shared")
        await async_wait_until(
            lambda: state_of(store.db.path, slow_run, "wait") == "SUCCESS", what="slow resumed"
        )
    assert_sequential(pokes_of("shared")[1:], 0.1)


async def test_a_batching_class_gets_one_call_for_many_checks(store, db_path) -> None:
    n = 30
    dag = fan_out_dag("batch", n, lambda i: BatchFlagTrigger(name=f"key-{i}", poke_interval=0.1))
    run_id = await store.runs.create_run(dag, DAY)
    names = {f"key-{i}" for i in range(n)}
    async with serving(store, dag, triggerer=False) as h:
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", n), what="all deferred")
        assert len({r["poke_hash"] for r in sql(db_path, "SELECT poke_hash FROM trigger")}) == n
        await h.start_triggerer()
        await async_wait_until(lambda: len(BATCHES) >= 2, what="two batched cycles")
        assert all(sorted(b) == sorted(names) for b in BATCHES[:2]), BATCHES[:2]
        FLAGS.update(f"key-{i}" for i in range(0, n, 2))
        await async_wait_until(
            lambda: sum(r["state"] == "SUCCESS" for r in instances(db_path, run_id)) == n // 2
        )
        seen = len(BATCHES)
        await async_wait_until(lambda: len(BATCHES) >= seen + 2, what="cycles of the rest")
        # The rest is still checked in one call per cycle.
        odd = sorted(f"key-{i}" for i in range(1, n, 2))
        assert sorted(BATCHES[-1]) == odd
        FLAGS.update(names)
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", n), what="all resumed")
    assert all(len(b) in (n, n // 2) for b in BATCHES)
    for i in range(n):
        assert json.loads(instances(db_path, run_id)[i]["output"]) == {"name": f"key-{i}"}


async def test_file_waits_in_one_directory_cost_one_listing_per_cycle(
    store, db_path, tmp_path, monkeypatch
) -> None:
    n = 25
    inbox = tmp_path / "in"
    inbox.mkdir()
    listed = spy_listings(monkeypatch)
    dag = fan_out_dag(
        "files", n, lambda i: FileTrigger(path=str(inbox / f"{i}.csv"), poke_interval=0.1)
    )
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False) as h:
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", n), what="all deferred")
        # The polling path: with inotify the waits would be polled only every 5 minutes.
        trig = await h.start_triggerer(push=False)
        await async_wait_until(lambda: trig.checks_done >= 3 * n, what="three cycles")
        cycles, settled = len(listed), trig.checks_done  # read together: no await between
        for i in range(n):
            (inbox / f"{i}.csv").write_text("")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", n), what="all resumed")
    assert all(d == [str(inbox)] for d in listed)  # one directory per listing ...
    assert cycles <= math.ceil(settled / n) + 1  # ... and one listing per cycle (+1 in flight)


async def test_timeouts_stay_per_task_on_a_shared_check(store, db_path) -> None:
    dag = fan_out_dag(
        "timeouts",
        2,
        lambda i: FlagTrigger(name="shared", poke_interval=0.1),
        timeout_for=lambda i: 0.3 if i == 0 else 60,
    )
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait", 0) == "FAILED", what="timeout"
        )
        checks_at_timeout = len(pokes_of("shared"))
        assert state_of(db_path, run_id, "wait", 1) == "DEFERRED"
        # The check goes on for the one still waiting.
        await async_wait_until(lambda: len(pokes_of("shared")) >= checks_at_timeout + 3)
        FLAGS.add("shared")
        await async_wait_until(lambda: state_of(db_path, run_id, "wait", 1) == "SUCCESS")
    text = await log_text(store, run_id, "wait", 0)
    assert "sensor timeout: the condition did not hold within" in text


async def test_a_long_wait_has_a_readable_sampled_log(store, db_path) -> None:
    dag = fan_out_dag("sampled", 1, lambda i: FlagTrigger(name="slowly", poke_interval=0.02))
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(lambda: len(pokes_of("slowly")) >= 35, what="35 checks")
        FLAGS.add("slowly")
        await async_wait_until(lambda: state_of(db_path, run_id, "wait", 0) == "SUCCESS")
    total = len(pokes_of("slowly"))
    events = await store.views.task_log(run_id, "wait", 0)
    lines = [e["message"] for e in events if e["kind"] == "check"]
    # Checks 1, 2, 4, 8, 16, 32, ... are written; the one that fired says so instead.
    assert len(lines) == sum(1 for k in range(1, total) if k & (k - 1) == 0)
    assert set(lines) == {"checked FlagTrigger(name='slowly'): not yet; next in 0.02 s"}
    text = await log_text(store, run_id, "wait", 0)
    assert f"trigger fired: FlagTrigger(name='slowly') (after {total} checks)" in text


async def test_a_push_style_trigger_wakes_its_task(store, db_path) -> None:
    dag = fan_out_dag("push", 3, lambda i: PushFlagTrigger(name="pushed", poke_interval=0.1))
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag) as h:
        await async_wait_until(lambda: pokes_of("pushed"), what="the push trigger runs")
        assert h.triggerer is not None and len(h.triggerer.table) == 1
        FLAGS.add("pushed")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 3), what="all resumed")
    out = json.loads(instances(db_path, run_id)[0]["output"])
    assert out == {"name": "pushed", "style": "push"}


async def test_a_time_trigger_is_not_polled(store, db_path) -> None:
    dag = DAG("later")

    @dag.task
    def wait(ctx):
        ctx.defer(TimeDeltaTrigger(delta=0.4, poke_interval=0.01), method="done")

    @wait.method
    def done(ctx):
        return ctx.event

    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag) as h:
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait") == "SUCCESS", what="SUCCESS"
        )
        assert h.triggerer is not None
        assert h.triggerer.checks_done == 1  # the scheduler slept until the moment
    row = task_row(db_path, run_id, "wait")
    claimed, _deferred, woke, *_ = transition_events(db_path, row["id"])
    assert (woke["from_state"], woke["to_state"]) == ("DEFERRED", "PENDING")
    # The moment is set when the task defers, after its claim; the fire is not earlier.
    assert woke["ts"] - claimed["ts"] >= 0.4


async def test_trigger_rows_nobody_waits_on_are_deleted(store, db_path) -> None:
    dag = fan_out_dag("cleanup", 5, lambda i: FlagTrigger(name=f"c{i}", poke_interval=0.1))
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", 5), what="all deferred")
        assert len(sql(db_path, "SELECT id FROM trigger")) == 5
        FLAGS.update({"c0", "c1", "c2"})
        await async_wait_until(
            lambda: len(sql(db_path, "SELECT id FROM trigger")) == 2, what="cleanup"
        )
        left = {json.loads(r["kwargs"])["name"] for r in sql(db_path, "SELECT * FROM trigger")}
        assert left == {"c3", "c4"}
        FLAGS.update({"c3", "c4"})
        await async_wait_until(
            lambda: not sql(db_path, "SELECT id FROM trigger"), what="all cleaned"
        )
    assert all_in(db_path, run_id, "SUCCESS", 5)


def test_the_helpers_triggers_are_distinct_checks() -> None:
    # Guards the tests above: a name is the whole of a FlagTrigger's poke context.
    a: BaseTrigger = FlagTrigger(name="x", poke_interval=1)
    assert a.poke_hash() == FlagTrigger(name="x", poke_interval=9).poke_hash()
    assert a.poke_hash() != FlagTrigger(name="y").poke_hash()


async def test_a_wait_after_the_trigger_table_emptied_is_still_loaded(store, db_path) -> None:
    # The loader reads new rows by id; an id used again after cleanup must not be skipped.
    def one_waiter(dag_id: str, name: str) -> DAG:
        dag = DAG(dag_id)

        @dag.task
        def wait(ctx):
            ctx.defer(FlagTrigger(name=name, poke_interval=0.05), method="done")

        @wait.method
        def done(ctx):
            return ctx.event

        return dag

    first, second = one_waiter("first", "first"), one_waiter("second", "second")
    async with serving(store, first, second):
        run1 = await store.runs.create_run(first, DAY)
        await async_wait_until(
            lambda: state_of(db_path, run1, "wait") == "DEFERRED", what="deferred"
        )
        old_id = task_row(db_path, run1, "wait")["trigger_id"]
        FLAGS.add("first")
        await async_wait_until(lambda: state_of(db_path, run1, "wait") == "SUCCESS", what="first")
        await async_wait_until(lambda: not sql(db_path, "SELECT id FROM trigger"), what="cleanup")
        run2 = await store.runs.create_run(second, DAY)
        await async_wait_until(
            lambda: state_of(db_path, run2, "wait") == "DEFERRED", what="deferred"
        )
        assert task_row(db_path, run2, "wait")["trigger_id"] > old_id
        FLAGS.add("second")
        await async_wait_until(lambda: state_of(db_path, run2, "wait") == "SUCCESS", what="second")


async def test_a_flush_cancelled_mid_commit_keeps_its_batch() -> None:
    """Stopping cancels the writing loop, maybe inside a commit: the fires it held must
    still go out with the triggerer's last flush (a fire written twice changes nothing)."""
    from triggerer.store import Fire
    from triggerer.writing import Outbox

    committing = asyncio.Event()

    class StuckStore:
        async def triggerer_commit(self, batch: object, owner: str | None = None) -> None:
            committing.set()
            await asyncio.Event().wait()  # a commit that has not answered yet

    outbox = Outbox(StuckStore())  # type: ignore[arg-type]
    outbox.fire(Fire({7: 1}, "{}", "fired"))
    flushing = asyncio.create_task(outbox.flush())
    await committing.wait()
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    assert [f.waits for f in outbox.batch.fires] == [{7: 1}]
