"""Orphan repair and a wait's own timeout, on SQLite and PostgreSQL, with a real triggerer
and worker in-process: a DEFERRED task whose trigger row is gone or NULL is ended within one
reconcile period (or by its own timeout), a trigger row nobody waits on is deleted, a
RUNNING task with an unknown owner is retried, and no event fires a wait whose row is gone
or whose timeout passed, even from memory."""

from __future__ import annotations

from datetime import date

import pytest
from support import backends
from support.exchanging import claim
from support.helpers import async_wait_until, raw_sql
from support.triggers import FLAGS, FlagTrigger, serving

from executor import DAG

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
live_store = backends.live_store  # fixture

DAY = date(2026, 4, 25)
RECONCILE = 0.5  # the test triggerer's reload_every: each repair must land within it

pytestmark = pytest.mark.usefixtures("fresh_triggers")


async def state(url: str, run_id: str, task_id: str) -> str:
    rows = await raw_sql(
        url, f"SELECT state FROM task WHERE run_id = '{run_id}' AND task_id = '{task_id}'"
    )
    return str(rows[0]["state"])


async def log_of(url: str, run_id: str, task_id: str) -> str:
    rows = await raw_sql(
        url,
        "SELECT e.message FROM task_event e JOIN task t ON t.id = e.task_row "
        f"WHERE t.run_id = '{run_id}' AND t.task_id = '{task_id}' ORDER BY e.id",
    )
    return "\n".join(str(r["message"]) for r in rows)


def delete_trigger_of(run_id: str) -> str:
    return (
        f"DELETE FROM trigger WHERE id IN (SELECT trigger_id FROM task WHERE run_id = '{run_id}')"
    )


def waiting_dag(dag_id: str, name: str, timeout: float = 3600) -> DAG:
    dag = DAG(dag_id)
    dag.sensor(
        "wait", FlagTrigger(name=name, poke_interval=0.05), mode="deferrable", timeout=timeout
    )
    return dag


async def deferred(url: str, run_id: str) -> None:
    async def ok() -> bool:
        return await state(url, run_id, "wait") == "DEFERRED"

    await async_wait_until(ok, timeout=30, what="the sensor deferred")


async def test_deferred_with_trigger_row_missing_or_null_is_failed(live_store, url) -> None:
    gone, null = waiting_dag("gone", "never-gone"), waiting_dag("null", "never-null")
    run_gone = await live_store.runs.create_run(gone, DAY)
    run_null = await live_store.runs.create_run(null, DAY)
    async with serving(live_store, gone, null, config={"reload_every": 3600}) as h:
        await deferred(url, run_gone)
        await deferred(url, run_null)
        await raw_sql(url, delete_trigger_of(run_gone))
        await raw_sql(url, f"UPDATE task SET trigger_id = NULL WHERE run_id = '{run_null}'")
        assert h.triggerer is not None
        h.triggerer.config.reload_every = RECONCILE  # from now on, one reconcile period

        async def both_failed() -> bool:
            return {await state(url, run_gone, "wait"), await state(url, run_null, "wait")} == {
                "FAILED"
            }

        await async_wait_until(both_failed, timeout=30, what="both orphans failed")
        trig = h.triggerer
        # Counted once the repair's transaction committed: a moment after the rows moved.
        await async_wait_until(lambda: trig.repaired["deferred_trigger_missing"] == 2, timeout=30)
    assert "trigger row missing: trigger row" in await log_of(url, run_gone, "wait")
    assert "trigger row missing: its trigger_id is NULL" in await log_of(url, run_null, "wait")


async def test_own_timeout_holds_whatever_the_trigger_row(live_store, url) -> None:
    # No reconcile during the test: the timeout sweep alone must end both.
    gone, null = waiting_dag("t_gone", "never-1"), waiting_dag("t_null", "never-2")
    run_gone = await live_store.runs.create_run(gone, DAY)
    run_null = await live_store.runs.create_run(null, DAY)
    async with serving(live_store, gone, null, config={"reload_every": 3600}):
        await deferred(url, run_gone)
        await deferred(url, run_null)
        # The timeout first: whichever ends it then (the sweep or a repair), it times out.
        await raw_sql(url, f"UPDATE task SET wait_timeout_at = 1 WHERE run_id = '{run_gone}'")
        await raw_sql(url, delete_trigger_of(run_gone))
        await raw_sql(
            url,
            f"UPDATE task SET trigger_id = NULL, wait_timeout_at = 1 WHERE run_id = '{run_null}'",
        )

        async def both_timed_out() -> bool:
            return {await state(url, run_gone, "wait"), await state(url, run_null, "wait")} == {
                "FAILED"
            }

        await async_wait_until(both_timed_out, timeout=30, what="both waits timed out")
    for run_id in (run_gone, run_null):
        assert "sensor timeout" in await log_of(url, run_id, "wait")


async def test_no_fire_from_memory_for_a_deleted_row_or_a_passed_timeout(live_store, url) -> None:
    gone, late = waiting_dag("m_gone", "fires-gone"), waiting_dag("m_late", "fires-late")
    run_gone = await live_store.runs.create_run(gone, DAY)
    run_late = await live_store.runs.create_run(late, DAY)
    async with serving(
        live_store, gone, late, config={"reload_every": 3600, "timeouts_every": 3600}
    ) as h:
        trig = h.triggerer
        assert trig is not None
        await deferred(url, run_gone)
        await deferred(url, run_late)
        await async_wait_until(lambda: trig.table.subscriptions == 2, timeout=30)
        await raw_sql(url, delete_trigger_of(run_gone))
        await raw_sql(url, f"UPDATE task SET wait_timeout_at = 1 WHERE run_id = '{run_late}'")
        FLAGS.update({"fires-gone", "fires-late"})  # both conditions now hold, in memory
        await async_wait_until(lambda: trig.events_fired >= 2, timeout=30, what="two fires")
        await async_wait_until(lambda: not trig.outbox.batch, timeout=30, what="the flush")
        # Not fired. (A full reload may already have repaired the gone one, if the loaded
        # machine let a lease lapse meanwhile: that is not a fire either.)
        assert await state(url, run_gone, "wait") in ("DEFERRED", "FAILED")
        assert await state(url, run_late, "wait") == "DEFERRED"
        # What ends them is the timeout sweep and the repair, with their reasons.
        await trig.ops.expire_waits(trig.shards)
        await trig.repair.run(trig.shards)
    assert "trigger row missing" in await log_of(url, run_gone, "wait")
    assert "sensor timeout" in await log_of(url, run_late, "wait")
    for run_id in (run_gone, run_late):
        assert "trigger fired" not in await log_of(url, run_id, "wait")
    for run_id in (run_gone, run_late):
        assert await state(url, run_id, "wait") == "FAILED"


async def test_unwaited_trigger_rows_deleted_and_unknown_owners_retried(live_store, url) -> None:
    dag = DAG("owners")

    @dag.task(retries=1)
    def job(ctx):
        return 1

    run_id = await live_store.runs.create_run(dag, DAY)
    claimed = await claim(live_store, "worker-that-vanished", 1)
    assert [c.task_id for c in claimed] == ["job"]
    await raw_sql(url, f"UPDATE task SET owner = NULL WHERE run_id = '{run_id}'")
    await raw_sql(
        url,
        "INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, description) "
        "VALUES ('support.triggers.FlagTrigger', '{\"name\": \"x\"}', 'ab', 3, 0, 'stray')",
    )
    async with serving(
        live_store, dag, worker=False, config={"reload_every": RECONCILE, "cleanup_every": 3600}
    ) as h:
        trig = h.triggerer
        assert trig is not None

        async def repaired() -> bool:
            return (await state(url, run_id, "job")) == "RETRYING" and not await raw_sql(
                url, "SELECT id FROM trigger"
            )

        await async_wait_until(repaired, timeout=30, what="both repaired")
        # Counted once each transaction committed: a moment after the rows changed.
        await async_wait_until(
            lambda: (
                trig.repaired["running_owner_unknown"] == 1
                and trig.repaired["trigger_unwaited"] == 1
            ),
            timeout=30,
            what="both counted",
        )
    assert "owner unknown to the store (no owner)" in await log_of(url, run_id, "job")
