"""Waits on another DAG's run woken by PostgreSQL's NOTIFY of the run's state change (the
schema's table trigger), polled on SQLite; a lost LISTEN connection falls back and comes
back."""

from __future__ import annotations

import logging
import secrets
from datetime import date

import asyncpg
import pytest
from support import pg
from support.helpers import async_wait_until
from support.triggers import serving

from executor import DAG
from executor.store import open_store
from triggers.external import RUNS_CHANNEL, ExternalDagRunTrigger

pg_server, pg_url = pg.pg_server, pg.pg_url  # fixtures

DAY = date(2026, 4, 25)
KEY = ("notify", RUNS_CHANNEL)

pytestmark = pytest.mark.usefixtures("fresh_triggers")


def dags(interval: float) -> tuple[DAG, DAG]:
    up = DAG("up_" + secrets.token_hex(3))

    @up.task
    def extract(ctx):
        return 1

    down = DAG("down_" + secrets.token_hex(3))
    trig = ExternalDagRunTrigger(dag_id=up.dag_id, logical_date="{{ ds }}", poke_interval=interval)
    down.sensor("wait_for_up", trig, mode="deferrable")
    return up, down


async def state_of(store, run_id: str, task_id: str) -> str | None:
    rows = await store.views.run_tasks(run_id)
    return next((r["state"] for r in rows if r["task_id"] == task_id), None)


async def test_postgres_wakes_the_wait_when_the_run_ends(
    pg_server: str, pg_url: str, caplog
) -> None:
    store = await open_store(pg_url)
    up, down = dags(interval=3600.0)  # only a push can wake it within the test
    try:
        waiting = await store.runs.create_run(down, DAY)
        async with serving(store, up, down, config={"push": True, "push_retry": 0.2}) as h:
            trig = h.triggerer
            assert trig is not None

            async def deferred() -> bool:
                return await state_of(store, waiting, "wait_for_up") == "DEFERRED"

            await async_wait_until(deferred, what="the sensor deferred")
            await async_wait_until(lambda: trig.push.live(KEY), what="LISTEN is live")

            # The LISTEN connection dies: the source falls back, then listens again.
            caplog.set_level(logging.WARNING, logger="slotless.triggerer.push")
            conn = await asyncpg.connect(pg_server)
            try:
                listen_pid = store.db._listen_conn.get_server_pid()  # type: ignore[attr-defined]
                await conn.execute("SELECT pg_terminate_backend($1)", listen_pid)
            finally:
                await conn.close()
            await async_wait_until(lambda: "LISTEN connection was lost" in caplog.text)
            await async_wait_until(lambda: trig.push.live(KEY), what="LISTEN is live again")

            checks = trig.checks_done
            await store.runs.create_run(up, DAY)

            async def resumed() -> bool:
                return await state_of(store, waiting, "wait_for_up") == "SUCCESS"

            await async_wait_until(resumed, what="the wait woken by the run's end")
            # Woken by the creation and the end of the run: a few checks, no polling.
            assert trig.checks_done - checks <= 4
    finally:
        await store.close()


async def test_sqlite_keeps_polling(store, caplog) -> None:
    up, down = dags(interval=0.2)
    caplog.set_level(logging.INFO, logger="slotless.triggerer.push")
    waiting = await store.runs.create_run(down, DAY)
    async with serving(store, up, down, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(
            lambda: "sends no notifications" in caplog.text, what="the source declined"
        )
        assert not trig.push.live(KEY)
        await store.runs.create_run(up, DAY)

        async def resumed() -> bool:
            return await state_of(store, waiting, "wait_for_up") == "SUCCESS"

        await async_wait_until(resumed, what="the wait polled to its end")
