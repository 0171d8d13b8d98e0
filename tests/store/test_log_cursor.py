"""A task's log read after a cursor, on both backends: every entry once, in order, however
the reads are cut (lines with equal timestamps, pages of one, lines landing between reads);
and on PostgreSQL a line whose transaction is still open holds the cursor back rather
than being skipped once it commits."""

from __future__ import annotations

import asyncio
import time
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.helpers import run_to_end, write_dag

from executor.loader import load_dag
from executor.store import Store
from executor.store.loglines import LogLine

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

ONE_TASK = """
from executor import DAG

dag = DAG("talky")


@dag.task
def talk(ctx):
    ctx.log("hello")
"""


async def a_task(store: Store, tmp_path: Path) -> tuple[str, int]:
    path = write_dag(tmp_path, ONE_TASK, "talky.py")
    run_id = await store.runs.create_run(
        load_dag(str(path), "talky"), date(2026, 4, 25), dag_file=str(path)
    )
    row = await store.views.task_detail(run_id, "talk")
    assert row is not None
    return run_id, row.row.id


async def read_all(store: Store, run_id: str, since: int, limit: int) -> tuple[list[str], int]:
    """Every entry after ``since``, ``limit`` a read, following ``next``; and the cursor."""
    got: list[str] = []
    deadline = time.monotonic() + 10
    while True:
        page = await store.loglines.after(run_id, "talk", -1, since, limit)
        assert page is not None
        assert page.cursor >= since
        got += [e.message for e in page.entries if e.kind == "log"]
        since = page.cursor
        if page.held:  # PostgreSQL: another client's transaction (on this server) still open
            assert time.monotonic() < deadline, "an entry held back for 10 s"
            await asyncio.sleep(0.02)
            continue
        if not page.more:
            return got, since


async def test_every_line_once_in_order_with_equal_timestamps(store: Store, tmp_path: Path):
    run_id, row = await a_task(store, tmp_path)
    ts = 1_780_000_000.123  # every line in the same millisecond: only ids tell them apart
    seen: list[str] = []
    cursor = 0
    written: list[str] = []
    for batch in range(5):
        lines = [f"b{batch} line {i}" for i in range(7)]
        await store.loglines.append([LogLine(row, 1, ts, m) for m in lines])
        written += lines
        for limit in (1, 3):  # a read cut at one entry, then at three
            got, cursor = await read_all(store, run_id, cursor, limit)
            seen += got
    assert seen == written  # none lost, none twice, in the order written
    again, end = await read_all(store, run_id, cursor, 1000)
    assert (again, end) == ([], cursor)  # nothing new: the cursor stays
    everything, _ = await read_all(store, run_id, 0, 2)
    assert everything == written


async def test_pages_and_a_missing_task(store: Store, tmp_path: Path):
    run_id, row = await a_task(store, tmp_path)
    await store.loglines.append([LogLine(row, 1, 1.0, f"l{i}") for i in range(11)])
    chunks = [c async for c in store.loglines.pages(run_id, "talk", -1, size=4)]
    assert [len(c) for c in chunks] == [4, 4, 3]
    assert [e.message for c in chunks for e in c] == [f"l{i}" for i in range(11)]
    assert await store.loglines.after(run_id, "nope", -1, 0, 10) is None
    assert await store.loglines.after("no-run", "talk", -1, 0, 10) is None
    page = await store.loglines.after(run_id, "talk", -1, 0, 100)
    assert page is not None and not page.finished  # PENDING: its log may grow


async def test_an_open_transaction_holds_the_cursor_back(
    store: Store, tmp_path: Path, backend: str
):
    if backend.startswith("sqlite"):
        pytest.skip("SQLite has one writer at a time: ids commit in order, nothing to hold")
    run_id, row = await a_task(store, tmp_path)
    await store.loglines.append([LogLine(row, 1, 5.0, "before")])
    got, cursor = await read_all(store, run_id, 0, 100)
    assert got == ["before"]
    async with store.db.write() as slow:
        # Takes the lower id now, commits last.
        await slow.execute("append_log_line", task_row=row, ts=5.0, attempt=1, message="slow")
        await store.loglines.append([LogLine(row, 1, 5.0, "fast")])  # commits first
        page = await store.loglines.after(run_id, "talk", -1, cursor, 100)
        assert page is not None
        # "fast" is committed, but a row below it may still commit: held, not skipped.
        assert [e.message for e in page.entries] == [] and page.held
        assert page.cursor == cursor and not page.finished
    got, _ = await read_all(store, run_id, cursor, 100)
    assert got == ["slow", "fast"]


TALKER = """
import time
from pathlib import Path

from executor import DAG

STOP = Path({stop!r})
dag = DAG("talker")


@dag.task
def talk(ctx):
    n = 0
    while not STOP.exists() and n < 5000:
        ctx.log(f"tick {{n}}")
        n += 1
        time.sleep(0.005)
    ctx.log("last")
"""


async def test_a_running_tasks_lines_are_read_while_it_runs(store: Store, tmp_path: Path):
    """A worker writes its running attempt's lines as they come (a flush every 0.5 s), the
    rest with the outcome: read after a cursor, in small pages, each line once, in order."""
    stop = tmp_path / "stop"
    path = write_dag(tmp_path, TALKER.format(stop=str(stop)), "talker.py")
    run_id = await store.runs.create_run(
        load_dag(str(path), "talker"), date(2026, 4, 25), dag_file=str(path)
    )
    worker = asyncio.create_task(run_to_end(store, run_id, timeout=60))
    seen: list[str] = []
    cursor = 0
    deadline = time.monotonic() + 30
    try:
        while len(seen) < 200:  # read while the task runs: a few flushes' worth
            assert time.monotonic() < deadline, f"only {len(seen)} lines while running"
            page = await store.loglines.after(run_id, "talk", -1, cursor, 7)
            assert page is not None
            if not seen:
                assert not page.finished
            seen += [e.message for e in page.entries if e.kind == "log"]
            cursor = page.cursor
            await asyncio.sleep(0.02)
        assert "last" not in seen  # all of these were read before it ended
        stop.touch()
        while True:
            assert time.monotonic() < deadline, "the task did not end"
            page = await store.loglines.after(run_id, "talk", -1, cursor, 7)
            assert page is not None
            seen += [e.message for e in page.entries if e.kind == "log"]
            cursor = page.cursor
            if page.finished:
                break
            await asyncio.sleep(0.02)
    finally:
        stop.touch()
        info = await worker
    assert info["state"] == "SUCCESS"
    assert seen[-1] == "last"
    assert seen == [f"tick {i}" for i in range(len(seen) - 1)] + ["last"]
