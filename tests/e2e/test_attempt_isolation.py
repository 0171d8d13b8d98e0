"""What each isolation does with an attempt that must stop, with an in-process worker on
SQLite and on PostgreSQL: a forked child killed at its execution timeout keeps the log
lines it wrote before; a thread whose attempt was taken back (the run cancelled) is
interrupted at its next Python instruction instead of running on beside its retry. (A
SIGSTOPped worker's forked child: tests/e2e/test_liveness_processes.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.helpers import async_wait_until, run_to_end

from executor import DAG
from executor.store import Store, open_store
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


async def test_a_force_cleared_attempt_blocked_in_c_is_not_claimed_again_beside_itself(
    url: str,
) -> None:
    """A thread blocked in a C call cannot be interrupted: until it returns, the worker
    leaves the cleared row to others rather than run a second copy beside it under the
    same row's bookkeeping (which once stopped the new copy and failed the run)."""
    dag = DAG("blocked_in_c")
    gate, entered = threading.Event(), threading.Event()
    copies = {"live": 0, "most": 0}
    lock = threading.Lock()

    @dag.task
    def waits(ctx):
        with lock:
            copies["live"] += 1
            copies["most"] = max(copies["most"], copies["live"])
        entered.set()
        try:
            gate.wait(60)  # blocked in C: an interruption lands only when it returns
        finally:
            with lock:
                copies["live"] -= 1
        return 1

    store = await open_store(url)
    worker = Worker(
        store, isolation="thread", dags={dag.dag_id: dag}, poll_interval=0.02,
        heartbeat_interval=0.2, slots=2,
    )  # fmt: skip
    exchanges = [0]
    worker.on_exchange = lambda recorded, claimed: exchanges.__setitem__(0, exchanges[0] + 1)
    serving = asyncio.create_task(worker.run())
    try:
        run_id = await store.runs.create_run(dag, DAY)
        await async_wait_until(entered.is_set, timeout=30, what="the attempt to start")
        await store.runs.clear(run_id, ["waits"], force=True, reason="redo")
        await async_wait_until(
            lambda: worker.attempts_lost == 1 or copies["most"] > 1,
            timeout=10, what="the worker to see it lost",
        )  # fmt: skip
        assert copies["most"] == 1, "a second copy was claimed beside the taken-back one"
        seen = exchanges[0]
        # Several claims with a free slot and the row PENDING: none may take it.
        await async_wait_until(lambda: exchanges[0] >= seen + 5, timeout=10, what="5 claims")
        assert copies["most"] == 1, "a second copy was claimed beside the taken-back one"
        gate.set()  # the stale copy returns; the row is then claimed and runs once more
        await async_wait_until(lambda: _state(store, run_id), timeout=30, what="the run to end")
        info = await store.views.run_info(run_id)
        assert info is not None and info["state"] == "SUCCESS"
        assert copies["most"] == 1
    finally:
        gate.set()
        worker.stop()
        if not serving.done():
            serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await store.close()


async def _state(store: Store, run_id: str) -> bool:
    info = await store.views.run_info(run_id)
    return info is not None and info["state"] in ("SUCCESS", "FAILED")
