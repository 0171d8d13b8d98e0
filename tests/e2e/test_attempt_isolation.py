"""What each isolation does with an attempt that must stop, with an in-process worker on
SQLite and on PostgreSQL: a forked child killed at its execution timeout keeps the log
lines it wrote before; a thread whose attempt was taken back (the run cancelled) is
interrupted at its next Python instruction instead of running on beside its retry. (A
SIGSTOPped worker's forked child: tests/e2e/test_liveness_processes.py.)"""

from __future__ import annotations

import asyncio
import time
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.helpers import async_wait_until, run_to_end

from executor import DAG
from executor.store import open_store
from executor.worker import Worker

pytestmark = pytest.mark.slow

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
DAY = date(2026, 4, 25)


async def test_a_forked_attempt_killed_at_its_timeout_keeps_its_log_lines(url: str) -> None:
    dag = DAG("keeps_its_lines")

    @dag.task(execution_timeout=2.0)  # time for a fork on a busy machine
    def hangs(ctx):
        ctx.log("first line, before the hang")
        ctx.log("second line, before the hang")
        time.sleep(60)

    store = await open_store(url)
    try:
        run_id = await store.runs.create_run(dag, DAY)
        info = await run_to_end(store, run_id, isolation="process", dags={dag.dag_id: dag})
        assert info["state"] == "FAILED"
        events = await store.views.task_log(run_id, "hangs")
        assert events is not None
        messages = [e["message"] for e in events]
        assert "first line, before the hang" in messages, messages
        assert "second line, before the hang" in messages, messages
        assert any("execution timeout: killed after 2 s" in m for m in messages), messages
    finally:
        await store.close()


async def test_a_thread_whose_attempt_was_taken_back_stops_at_once(
    url: str, tmp_path: Path
) -> None:
    dag = DAG("taken_back")
    started, stopped = tmp_path / "started", tmp_path / "stopped"

    @dag.task
    def spins(ctx):
        started.write_text("")
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.01)  # Python between sleeps: where the interruption lands
        finally:
            stopped.write_text("")

    store = await open_store(url)
    worker = Worker(
        store, isolation="thread", dags={dag.dag_id: dag}, poll_interval=0.02,
        heartbeat_interval=0.2,
    )  # fmt: skip
    serving = asyncio.create_task(worker.run())
    try:
        run_id = await store.runs.create_run(dag, DAY)
        await async_wait_until(started.exists, timeout=30, what="the attempt to start")
        await store.runs.cancel(run_id)  # its row is taken from the worker
        await async_wait_until(stopped.exists, timeout=10, what="the thread to stop")
        assert worker.attempts_lost == 1
        worker.stop()
        await asyncio.wait_for(serving, 10)  # nothing of it is held any more
        info = await store.views.run_info(run_id)
        assert info is not None and info["state"] != "RUNNING"
    finally:
        worker.stop()
        if not serving.done():
            serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await store.close()
