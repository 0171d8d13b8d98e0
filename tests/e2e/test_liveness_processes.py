"""Liveness bound to the process, with real processes on SQLite and on PostgreSQL.

* A SIGKILLed triggerer's shards, and a SIGKILLed worker's attempt, are taken over long
  before their TTL (20 s for a triggerer, 60 s for a worker here): the dead process's lock
  (an advisory lock on PostgreSQL, a file lock on SQLite) is released by the server or the
  kernel, and the others notice.
* A SIGSTOPped triggerer or worker keeps its lock: it is declared dead only when its TTL
  (2 s here) passes. When it resumes (SIGCONT) it learns that it lost its shards or its
  attempt before doing anything else: the triggerer checks none of the waits it lost (each
  check is recorded with the checking process's pid) and fires none twice. A paused
  worker's forked child (process isolation) does not wait for it: it stops by itself once
  its worker's heartbeats lapse, before its attempt runs again elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from support import backends
from support.helpers import REPO, cli_env, pid_alive, wait_until, write_dag
from support.recording import ALLOW, LoggedFileTrigger, checks_in

from executor import DAG
from executor.loader import load_dag
from executor.store import Store, open_store
from executor.worker import Worker
from triggers.base import SHARDS

pytestmark = pytest.mark.slow

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
DAY = date(2026, 4, 25)
LONG_TTL = "60"  # far beyond every deadline below: only the liveness lock can be quicker
# A triggerer renews (and rebalances) its leases every fifth of its TTL, so two triggerers
# split the shards only after one renewal: 12 s at 60 s. At 20 s the split takes 4 s, and
# a takeover is still awaited for only half the TTL.
LONG_TRIGGERER_TTL = 20.0
SHORT_TTL = "2"


def query(db_url: str, text: str) -> list[dict[str, Any]]:
    """Rows of one parameterless statement, on either backend."""
    if db_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(db_url[len("sqlite:///") :], timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(text)]
        finally:
            conn.close()

    async def go() -> list[dict[str, Any]]:
        import asyncpg

        conn = await asyncpg.connect(db_url)
        try:
            return [dict(r) for r in await conn.fetch(text)]
        finally:
            await conn.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(go())
    with ThreadPoolExecutor(1) as pool:  # called from a test's own loop
        return pool.submit(asyncio.run, go()).result()


def pause_holding_no_lock(proc: subprocess.Popen, db_url: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no database lock.

    A process paused inside a write transaction keeps its locks: on SQLite the one write
    lock, which stalls every other process until it resumes; on PostgreSQL the rows it
    changed (docs/operations.md, "Failures"). That is what a pause does, not what these
    tests are about: they pause a process between its transactions, resuming it and
    pausing it again until it is caught there."""

    def caught_between_transactions() -> bool:
        proc.send_signal(signal.SIGSTOP)
        if writable(db_url):
            return True
        proc.send_signal(signal.SIGCONT)
        return False

    wait_until(caught_between_transactions, 30, what=f"{proc.pid} paused between transactions")


def writable(db_url: str) -> bool:
    """Whether another connection can take, within a second, the locks a worker or a
    triggerer takes: SQLite's write lock; PostgreSQL's locks on leases, runs and tasks."""
    if db_url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(db_url[len("sqlite:///") :], timeout=1.0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    async def go() -> bool:
        import asyncpg

        conn = await asyncpg.connect(db_url)
        try:
            await conn.execute(
                "BEGIN; SET LOCAL lock_timeout = '1s'; "
                "SELECT 1 FROM shard_lease FOR UPDATE; SELECT 1 FROM dag_run FOR UPDATE; "
                "SELECT 1 FROM task FOR UPDATE; ROLLBACK"
            )
        except asyncpg.LockNotAvailableError:
            return False
        finally:
            await conn.close()
        return True

    return asyncio.run(go())


class Procs:
    """``slotless`` processes of one test; their logs; all stopped at its end."""

    def __init__(self, db_url: str, logs: Path) -> None:
        self.db_url = db_url
        self.logs = logs
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        out = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 - kept by the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "slotless", *args, "--db", self.db_url],
            cwd=REPO,
            env=cli_env(SLOTLESS_ALLOWED_TRIGGERS=ALLOW),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def stop_all(self) -> None:
        for proc in self.procs.values():
            with_signal(proc, signal.SIGCONT)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def output(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-4000:]}" for n in self.procs)


def with_signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


@pytest.fixture
def procs(url: str, tmp_path: Path) -> Iterator[Procs]:
    logs = tmp_path / "logs"
    logs.mkdir()
    p = Procs(url, logs)
    try:
        yield p
    finally:
        p.stop_all()
        print(p.output())  # shown by pytest only when the test failed


@pytest.fixture
async def live_store(url: str) -> AsyncIterator[Store]:
    s = await open_store(url)
    try:
        yield s
    finally:
        await s.close()


# -- triggerers ---------------------------------------------------------------------------


def waits_dag(inbox: Path, record: Path, n: int) -> DAG:
    dag = DAG("liveness")

    @dag.task
    def items(ctx):
        return list(range(n))

    @dag.task(expand=items)
    def wait(ctx):
        trigger = LoggedFileTrigger(path=str(inbox / f"{ctx.item}.flag"), record=str(record))
        ctx.defer(trigger, method="done", timeout=600)

    @wait.method
    def done(ctx):
        return ctx.event

    return dag


def triggerer_id(db_url: str, proc: subprocess.Popen) -> str | None:
    for r in query(db_url, "SELECT id FROM triggerer"):
        if f":{proc.pid}:" in r["id"]:
            return str(r["id"])
    return None


def shards_of(db_url: str) -> Counter:
    rows = query(db_url, "SELECT owner FROM shard_lease WHERE owner IS NOT NULL")
    return Counter(r["owner"] for r in rows)


def task_states(db_url: str, run_id: str) -> Counter:
    rows = query(db_url, f"SELECT state FROM task WHERE run_id = '{run_id}' AND map_index >= 0")
    return Counter(r["state"] for r in rows)


def fires_per_task(db_url: str, run_id: str) -> Counter:
    rows = query(
        db_url,
        "SELECT t.map_index FROM task_event e JOIN task t ON t.id = e.task_row "
        f"WHERE t.run_id = '{run_id}' AND t.map_index >= 0 AND e.kind = 'transition' "
        "AND e.from_state = 'DEFERRED'",
    )
    return Counter(r["map_index"] for r in rows)


async def split_between_two(
    procs: Procs, db_url: str, store: Store, tmp_path: Path, n: int, ttl: str
) -> tuple[str, Path, Path, subprocess.Popen, subprocess.Popen, Worker, asyncio.Task[None]]:
    inbox, record = tmp_path / "in", tmp_path / "checks.log"
    inbox.mkdir()
    dag = waits_dag(inbox, record, n)
    run_id = await store.runs.create_run(dag, DAY)
    worker = Worker(store, slots=16, dags={dag.dag_id: dag}, poll_interval=0.05)
    serving = asyncio.create_task(worker.run())
    await asyncio.to_thread(
        wait_until, lambda: task_states(db_url, run_id)["DEFERRED"] == n, 60, what="deferred"
    )
    first = procs.start("first", "triggerer", "--lease-ttl", ttl)
    second = procs.start("second", "triggerer", "--lease-ttl", ttl)

    def split() -> bool:
        a, b = triggerer_id(db_url, first), triggerer_id(db_url, second)
        held = shards_of(db_url)
        return a is not None and b is not None and held[a] == held[b] == SHARDS // 2

    await asyncio.to_thread(wait_until, split, 60, what="the two triggerers to split the shards")
    return run_id, inbox, record, first, second, worker, serving


def touch_all(inbox: Path, n: int) -> None:
    for i in range(n):
        (inbox / f"{i}.flag").write_text("")


async def test_a_killed_triggerer_is_taken_over_long_before_its_lease_ends(
    procs: Procs, url: str, live_store: Store, tmp_path: Path
) -> None:
    n = 200
    run_id, inbox, record, first, second, worker, serving = await split_between_two(
        procs, url, live_store, tmp_path, n, str(LONG_TRIGGERER_TTL)
    )
    try:
        dead, survivor = triggerer_id(url, first), triggerer_id(url, second)
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        # Renewed at most a fifth of the TTL ago, its leases still have 6 s left at the
        # deadline: only its released lock can explain this.
        await asyncio.to_thread(
            wait_until,
            lambda: shards_of(url) == Counter({survivor: SHARDS}),
            LONG_TRIGGERER_TTL / 2,
            what="the survivor to hold every shard",
        )
        assert triggerer_id(url, first) is None  # forgotten at once, not after the TTL
        assert f"triggerer {dead} is gone (its liveness lock was released)" in procs.log("second")
        touch_all(inbox, n)
        await asyncio.to_thread(
            wait_until, lambda: task_states(url, run_id)["SUCCESS"] == n, 60, what="all fired"
        )
    finally:
        worker.stop()
        await asyncio.wait_for(serving, 30)
    assert fires_per_task(url, run_id) == Counter(dict.fromkeys(range(n), 1))
    assert {pid for pid, _, _ in checks_in(record)} <= {first.pid, second.pid}


async def test_a_paused_triggerer_loses_its_shards_at_the_ttl_and_checks_none_when_it_wakes(
    procs: Procs, url: str, live_store: Store, tmp_path: Path
) -> None:
    n = 200
    run_id, inbox, record, first, second, worker, serving = await split_between_two(
        procs, url, live_store, tmp_path, n, SHORT_TTL
    )
    try:
        paused, survivor = triggerer_id(url, first), triggerer_id(url, second)
        await asyncio.to_thread(pause_holding_no_lock, first, url)
        await asyncio.to_thread(
            wait_until,
            lambda: shards_of(url) == Counter({survivor: SHARDS}),
            60,
            what="the survivor to take the paused one's shards at the TTL",
        )
        # Taken because its leases lapsed, not because it was declared dead: its lock and
        # its row are still there.
        assert triggerer_id(url, first) == paused
        assert f"triggerer {paused} is gone" not in procs.log("second")
        # Every condition holds while it sleeps: the survivor fires them all.
        touch_all(inbox, n)
        await asyncio.to_thread(
            wait_until, lambda: task_states(url, run_id)["SUCCESS"] == n, 60, what="all fired"
        )
        resumed_at = time.time()
        first.send_signal(signal.SIGCONT)
        await asyncio.to_thread(
            wait_until,
            lambda: f"triggerer {paused} lost {SHARDS // 2} shards" in procs.log("first"),
            30,
            what="the woken triggerer to notice it lost its shards",
        )
        # It shares the shards again (the waits are all done by now).
        await asyncio.to_thread(
            wait_until,
            lambda: shards_of(url)[paused] == SHARDS // 2,
            60,
            what="the woken triggerer to get its share back",
        )
    finally:
        worker.stop()
        await asyncio.wait_for(serving, 30)
    # Its table still held its half of the waits, every one of them due: it checked none.
    late = [(t, path) for pid, t, path in checks_in(record) if pid == first.pid and t > resumed_at]
    assert late == []
    assert fires_per_task(url, run_id) == Counter(dict.fromkeys(range(n), 1))


# -- workers ------------------------------------------------------------------------------

LONG_DAG = """
import json
import os
import time
from pathlib import Path

from executor import DAG

MARKS = Path({marks!r})
dag = DAG("liveness_worker")


@dag.task(retries=2, retry_delay=0)
def long(ctx):
    (MARKS / f"attempt{{ctx.attempt}}").write_text(json.dumps({{"pid": os.getpid()}}))
    if ctx.attempt == 1:
        time.sleep(120)  # the worker is killed, or paused and resumed, in here
        (MARKS / "attempt1-ended").write_text("")
    return {{"attempt": ctx.attempt}}
"""


def create_run(db_url: str, dag_file: Path) -> str:
    async def go() -> str:
        store = await open_store(db_url)
        try:
            return await store.runs.create_run(load_dag(dag_file), DAY, dag_file=str(dag_file))
        finally:
            await store.close()

    return asyncio.run(go())


def long_transitions(db_url: str) -> list[tuple[str, str, int, str]]:
    rows = query(
        db_url,
        "SELECT e.from_state, e.to_state, e.attempt, e.message FROM task_event e "
        "JOIN task t ON t.id = e.task_row WHERE t.task_id = 'long' AND e.kind = 'transition' "
        "ORDER BY e.id",
    )
    return [(r["from_state"], r["to_state"], r["attempt"], r["message"]) for r in rows]


def run_state(db_url: str, run_id: str) -> str:
    return str(query(db_url, f"SELECT state FROM dag_run WHERE run_id = '{run_id}'")[0]["state"])


async def test_a_killed_workers_attempt_is_retried_long_before_stale_after(
    procs: Procs, url: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    run_id = await asyncio.to_thread(
        create_run, url, write_dag(tmp_path, LONG_DAG.format(marks=str(marks)))
    )
    opts = ("--stale-after", LONG_TTL, "--heartbeat-interval", "0.5", "--poll-interval", "0.05")
    workers = [procs.start(f"w{i}", "worker", *opts) for i in range(2)]
    await asyncio.to_thread(
        wait_until, lambda: (marks / "attempt1").exists(), 60, what="attempt 1 to start"
    )
    (row,) = await asyncio.to_thread(query, url, "SELECT owner FROM task WHERE task_id = 'long'")
    (victim,) = [w for w in workers if f":{w.pid}:" in row["owner"]]
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    await asyncio.to_thread(
        wait_until, lambda: run_state(url, run_id) == "SUCCESS", 40, what="the retry to succeed"
    )
    moves = await asyncio.to_thread(long_transitions, url)
    assert [m[:3] for m in moves] == [
        ("PENDING", "RUNNING", 1),
        ("RUNNING", "RETRYING", 2),
        ("RETRYING", "RUNNING", 2),
        ("RUNNING", "SUCCESS", 2),
    ]
    assert "its process is gone (liveness lock released)" in moves[1][3]
    (survivor,) = [w for w in workers if w is not victim]
    name = f"w{workers.index(survivor)}"
    assert "is gone (its liveness lock was released)" in procs.log(name)


async def test_a_paused_worker_is_reaped_at_the_ttl_and_its_forked_attempt_stopped_first(
    db_url: str, tmp_path: Path
) -> None:
    """(On SQLite: the TTL path is the same code on both backends.)"""
    (tmp_path / "logs").mkdir()
    procs = Procs(db_url, tmp_path / "logs")
    try:
        await paused_worker(procs, db_url, tmp_path)
    finally:
        procs.stop_all()
        print(procs.output())


async def paused_worker(procs: Procs, url: str, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    run_id = await asyncio.to_thread(
        create_run, url, write_dag(tmp_path, LONG_DAG.format(marks=str(marks)))
    )
    opts = ("--stale-after", SHORT_TTL, "--heartbeat-interval", "0.3", "--poll-interval", "0.05")
    paused = procs.start("paused", "worker", "--isolation", "process", *opts)
    await asyncio.to_thread(
        wait_until, lambda: (marks / "attempt1").exists(), 60, what="attempt 1 to start"
    )
    child = json.loads((marks / "attempt1").read_text())["pid"]
    assert child != paused.pid  # a forked child runs it
    # The child runs on: SIGSTOP reaches the worker only.
    await asyncio.to_thread(pause_holding_no_lock, paused, url)
    procs.start("other", "worker", *opts)
    await asyncio.to_thread(
        wait_until, lambda: run_state(url, run_id) == "SUCCESS", 60, what="the retry to succeed"
    )
    moves = await asyncio.to_thread(long_transitions, url)
    assert "lost: no heartbeat for" in moves[1][3]  # the TTL's doing: its lock is held
    # One copy at a time: the paused worker's child stopped by itself once its worker's
    # heartbeats lapsed, before the attempt could be taken back and run again.
    assert not pid_alive(child)
    assert not (marks / "attempt1-ended").exists()
    paused.send_signal(signal.SIGCONT)
    await asyncio.to_thread(
        wait_until, lambda: "was paused for" in procs.log("paused"), 30, what="it to wake"
    )
    paused.send_signal(signal.SIGTERM)
    assert paused.wait(30) == 0
    # What it reported of its child on waking was refused: the row was no longer its own.
    assert [m[:3] for m in await asyncio.to_thread(long_transitions, url)] == [
        ("PENDING", "RUNNING", 1),
        ("RUNNING", "RETRYING", 2),
        ("RETRYING", "RUNNING", 2),
        ("RUNNING", "SUCCESS", 2),
    ]
    assert run_state(url, run_id) == "SUCCESS"
    (row,) = query(url, "SELECT output FROM task WHERE task_id = 'long'")
    assert json.loads(row["output"]) == {"attempt": 2}
    assert os.path.exists(marks / "attempt2")
