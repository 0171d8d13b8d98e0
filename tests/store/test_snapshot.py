"""db.snapshot(): every statement in it sees the same committed state, on both backends,
while another connection commits; db.read() does not promise it (each statement its own).
A web page reads its whole view in one snapshot (executor/store/inspecting.py)."""

from __future__ import annotations

import asyncio
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.helpers import write_dag

from executor.driver.db import Tx
from executor.loader import load_dag
from executor.store import Store, open_store

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

DAG = """
from executor import DAG

dag = DAG("snap")


@dag.task
def only(ctx):
    return 1
"""


async def _run(store: Store, tmp_path: Path) -> str:
    dag = load_dag(str(write_dag(tmp_path, DAG, "snap.py")), None)
    return await store.runs.create_run(dag, date(2026, 6, 1))


async def _state(tx: Tx, run_id: str) -> str:
    row = await tx.fetchone("run_info", run_id=run_id)
    assert row is not None
    return str(row["state"])


async def test_a_snapshot_keeps_its_moment_while_another_connection_commits(
    store: Store, url: str, tmp_path: Path
) -> None:
    run_id = await _run(store, tmp_path)
    other = await open_store(url)  # another connection, as a worker's
    try:
        async with store.db.snapshot() as tx:
            assert await _state(tx, run_id) == "RUNNING"
            await other.runs.cancel(run_id, who="test")
            assert await _state(tx, run_id) == "RUNNING"  # still the snapshot's moment
        async with store.db.snapshot() as tx:
            assert await _state(tx, run_id) == "CANCELLED"  # the next one sees it
    finally:
        await other.close()


async def test_read_statements_each_see_their_own_moment(
    store: Store, url: str, tmp_path: Path
) -> None:
    """Why pages use snapshot(): in read(), a commit between two statements shows."""
    run_id = await _run(store, tmp_path)
    other = await open_store(url)
    try:
        async with store.db.read() as tx:
            assert await _state(tx, run_id) == "RUNNING"
            await other.runs.cancel(run_id, who="test")
            assert await _state(tx, run_id) == "CANCELLED"
    finally:
        await other.close()


async def test_a_snapshot_ended_by_an_error_or_a_cancel_leaves_the_connection_usable(
    store: Store, tmp_path: Path
) -> None:
    run_id = await _run(store, tmp_path)
    with pytest.raises(KeyError):
        async with store.db.snapshot() as tx:
            await _state(tx, run_id)
            raise KeyError("the page failed")
    inside = asyncio.Event()

    async def reading() -> None:
        async with store.db.snapshot() as tx:
            await _state(tx, run_id)
            inside.set()
            await asyncio.Event().wait()  # cancelled here, mid-snapshot

    task = asyncio.create_task(reading())
    await asyncio.wait_for(inside.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await store.runs.cancel(run_id, who="test")  # a write after it: no transaction left open
    async with store.db.snapshot() as tx:
        assert await _state(tx, run_id) == "CANCELLED"
