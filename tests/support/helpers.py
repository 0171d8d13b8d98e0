"""Small tools shared by the executor tests: polling with a deadline, a fake clock, raw SQL,
running the CLI in a subprocess, and driving an in-process worker until a run ends."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from executor.states import RUN_TERMINAL
from executor.store import Store
from executor.worker import Worker

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    """An injectable clock (``Store(db, clock=fake)``) that only moves when told to."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def set(self, now: float) -> None:
        self.now = now


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    interval: float = 0.02,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


async def async_wait_until(
    predicate: Callable[[], Any | Awaitable[Any]],
    timeout: float = 20.0,
    interval: float = 0.02,
    what: str = "condition",
) -> Any:
    """:func:`wait_until` in an event loop; ``predicate`` may be sync or async."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


def sql(db_path: Path | str, query: str, *args: Any) -> list[dict[str, Any]]:
    """Run one statement on the database file with the stdlib driver; rows as dicts.

    A write takes the lock at BEGIN (IMMEDIATE): a deferred transaction whose snapshot a
    service's commit made stale fails at once with "database is locked", busy timeout or
    not. Never call it on the loop a service of the test runs on: use :func:`raw_sql`.
    """
    conn = sqlite3.connect(str(db_path), timeout=30, isolation_level="IMMEDIATE")
    conn.row_factory = sqlite3.Row
    try:
        with conn:
            return [dict(r) for r in conn.execute(query, args).fetchall()]
    finally:
        conn.close()


async def raw_sql(url: str, query: str) -> list[dict[str, Any]]:
    """One statement behind the store's back (what a hand edit or a bug does), on either
    backend. SQLite's runs in a thread: a service on this test's loop may hold the write
    lock and need the loop to let it go."""
    if url.startswith("sqlite"):
        return await asyncio.to_thread(sql, url.removeprefix("sqlite:///"), query)
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return [dict(r) for r in await conn.fetch(query)]
    finally:
        await conn.close()


def events(db_path: Path | str, run_id: str, task_id: str, map_index: int = -1) -> list[dict]:
    return sql(
        db_path,
        "SELECT e.* FROM task_event e JOIN task t ON t.id = e.task_row"
        " WHERE t.run_id = ? AND t.task_id = ? AND t.map_index = ? ORDER BY e.id",
        run_id,
        task_id,
        map_index,
    )


def task_states(db_path: Path | str, run_id: str) -> dict[str, str]:
    rows = sql(
        db_path, "SELECT task_id, state FROM task WHERE run_id = ? AND map_index = -1", run_id
    )
    return {r["task_id"]: r["state"] for r in rows}


def write_dag(directory: Path, source: str, name: str = "dag_file.py") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env.pop("SLOTLESS_DB", None)
    env.update(extra)
    return env


def cli(
    *args: str, cwd: Path | None = None, timeout: float = 60.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``slotless ARGS`` in a subprocess, through ``python -m slotless``."""
    return subprocess.run(
        [sys.executable, "-m", "slotless", *args],
        cwd=cwd or REPO,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(*args: str, log: Path | None = None) -> subprocess.Popen:
    """``slotless ARGS`` as a process; its output goes to ``log`` (read it on failure)."""
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - kept by the child
    return subprocess.Popen(
        [sys.executable, "-m", "slotless", *args],
        cwd=REPO,
        env=cli_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def start_worker(db_url: str, *extra: str, log: Path | None = None) -> subprocess.Popen:
    """A ``slotless worker`` process; its output goes to ``log`` (read it on failure)."""
    return start_cli("worker", "--db", db_url, *extra, log=log)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state where /proc says it.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def run_to_end(store: Store, run_id: str, timeout: float = 30.0, **worker_kw: Any) -> dict:
    """Serve ``run_id`` with an in-process worker until the run ends; its run row."""
    worker_kw.setdefault("poll_interval", 0.02)
    worker = Worker(store, **worker_kw)

    async def ended() -> bool:
        info = await store.views.run_info(run_id)
        return info is not None and info["state"] in RUN_TERMINAL

    await asyncio.wait_for(worker.run(until=ended), timeout)
    info = await store.views.run_info(run_id)
    assert info is not None
    return dict(info)


def ops(store: Any) -> Any:
    """The triggerer's side of ``store`` (leases, loading waits, firing events)."""
    from triggerer.store import TriggererStore

    return TriggererStore(store.db, store.clock)


async def held_as_loaded(store: Any) -> Any:
    """A check table loaded by the triggerer's own loader from every shard, after saying
    that the database's per-shard checksums (``shard_sums``) are the table's."""
    from triggerer.checks import CheckTable
    from triggerer.loading import Loader
    from triggerer.writing import Outbox
    from triggers.base import SHARDS

    table, store_ops = CheckTable(), ops(store)
    loader = Loader(store_ops, table, Outbox(store_ops), shards_per_query=4, clock=store.clock)
    await loader.load(range(SHARDS), full=True)
    sums = await store_ops.shard_sums(range(SHARDS))
    assert sums == {s: table.shard_sum(s) for s in range(SHARDS) if table.shard_sum(s)[0]}
    return table


async def loaded_waits(store: Any, kind: str) -> dict[int, int]:
    """The waits of ``kind`` a triggerer would load: wait key -> trigger id."""
    from triggerer.waitref import pack

    rows = await ops(store).load_triggers(range(64))
    return {pack(kind, r["wait_id"]): r["trigger_id"] for r in rows if r["wait_kind"] == kind}


def attempt_of(row: Any) -> dict[str, Any]:
    """What every outcome of a claimed row's attempt carries (``Succeeded(**attempt_of(row),
    output_json=...)``)."""
    assert row.owner is not None
    return {
        "row_id": row.id,
        "owner": row.owner,
        "attempt": row.attempt,
        "max_attempts": row.max_attempts,
        "run_id": row.run_id,
    }


def skip_unless_ci(what: str, reason: str) -> NoReturn:
    """Skip with ``reason`` on a machine that cannot run the test; fail under CI=true,
    where it must run (a skip there would hide a test that never ran)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} must run under CI=true: {reason}")
    pytest.skip(reason)
