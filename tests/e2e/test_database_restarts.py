"""Database faults with real processes: a private PostgreSQL cluster restarted, then stopped
mid-run for longer than the workers' stale TTL, the triggerer's lease TTL and the reconnect
backoff's cap (workers and a triggerer reconnect with backoff, reap no live worker, log the
outage once per loop, lose nothing: the run completes); no deadlock when 4 workers complete a
10,000-wide fan-in (read in the server's own log); SQLite's lock held far beyond the busy
timeout fails no task.

These start their own cluster (tests/support/pgcluster.py), never the shared server."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import date
from pathlib import Path

import pytest
from support.helpers import REPO, cli_env, sql, stop_process, wait_until
from support.pgcluster import PgCluster
from support.pgcluster import pg_cluster as pg_cluster  # the fixture

from executor.loader import load_dag
from executor.store import open_store

pytestmark = pytest.mark.slow

DAY = date(2026, 6, 1)


def start(kind: str, url: str, log: Path, *args: str, **env: str) -> subprocess.Popen:
    out = open(log, "w")  # noqa: SIM115 - kept by the child
    return subprocess.Popen(
        [sys.executable, "-m", "slotless", kind, "--db", url, *args],
        cwd=REPO,
        env=cli_env(**env),
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def create_run(url: str, dag_file: Path, dag_id: str) -> str:
    async def go() -> str:
        store = await open_store(url)
        try:
            return await store.runs.create_run(
                load_dag(dag_file, dag_id), DAY, dag_file=str(dag_file)
            )
        finally:
            await store.close()

    return asyncio.run(go())


async def _pg(url: str, query: str, *args: object) -> list[dict]:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        return [dict(r) for r in await conn.fetch(query, *args)]
    finally:
        await conn.close()


def pg(url: str, query: str, *args: object) -> list[dict]:
    """One query, or [] while the server is away."""
    try:
        return asyncio.run(_pg(url, query, *args))
    except OSError:
        return []
    except Exception as exc:  # the server starting or stopping
        if "shutting down" in str(exc) or "starting up" in str(exc):
            return []
        raise


def run_state(url: str, run_id: str) -> str | None:
    rows = pg(url, "SELECT state FROM dag_run WHERE run_id = $1", run_id)
    return rows[0]["state"] if rows else None


def logs_of(paths: list[Path]) -> dict[str, str]:
    return {p.name: p.read_text(errors="replace") for p in paths}


RESTART_DAG = """
import time
from pathlib import Path

from executor import DAG
from triggers.files import FileTrigger

IN = Path({inbox!r})
dag = DAG("restarts")
sensors = [
    dag.sensor(f"s{{i}}", FileTrigger(path=str(IN / f"f{{i}}"), poke_interval=0.3))
    for i in range({sensors})
]


@dag.task(parents=sensors)
def source(ctx):
    return list(range({items}))


@dag.task(expand=source)
def work(ctx):
    time.sleep(0.05)
    return ctx.item


@dag.task(parents=[work])
def total(ctx):
    return sum(ctx.inputs["work"])
"""


# The clock is shrunk, the invariant kept: the outage outlasts the workers' stale TTL and the
# triggerer's lease TTL (so every heartbeat and lease is older than it when the server is
# back: a worker that reaped at once would take back live attempts) and the reconnect
# backoff's 5 s cap (so every loop is retrying at its slowest when the server returns).
STALE_AFTER = 6.0
OUTAGE = 9.0  # was 30 s with a 20 s TTL: the same ratio, a third of the wait
assert OUTAGE > STALE_AFTER and OUTAGE > 5.0


@pytest.mark.timeout(420)
def test_postgres_restart_and_a_stop_longer_than_the_stale_ttl_mid_run(
    pg_cluster: PgCluster, tmp_path: Path
) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    sensors, items = 20, 600
    dag_file = tmp_path / "restarts.py"
    dag_file.write_text(
        textwrap.dedent(RESTART_DAG).format(inbox=str(inbox), sensors=sensors, items=items)
    )
    url = pg_cluster.dsn
    run_id = create_run(url, dag_file, "restarts")
    logs = [tmp_path / "w0.log", tmp_path / "w1.log", tmp_path / "t0.log"]
    procs = [
        start(
            "worker",
            url,
            logs[0],
            "--slots",
            "4",
            "--heartbeat-interval",
            "1",
            "--stale-after",
            str(STALE_AFTER),
        ),
        start(
            "worker",
            url,
            logs[1],
            "--slots",
            "4",
            "--heartbeat-interval",
            "1",
            "--stale-after",
            str(STALE_AFTER),
        ),
        start("triggerer", url, logs[2], "--lease-ttl", str(STALE_AFTER)),
    ]
    try:
        count = "SELECT count(*) AS n FROM task WHERE run_id = $1 AND state = $2"

        def deferred() -> bool:
            rows = pg(url, count, run_id, "DEFERRED")
            return bool(rows) and rows[0]["n"] == sensors

        wait_until(deferred, 60, what="every sensor to defer")

        def held() -> bool:  # the triggerer started (it exits if the server is down then)
            rows = pg(url, "SELECT coalesce(sum(triggers), 0) AS n FROM triggerer")
            return bool(rows) and rows[0]["n"] == sensors

        wait_until(held, 60, what="the triggerer to hold every sensor's wait")
        # 1. A restart while every sensor waits in the triggerer.
        pg_cluster.restart()
        for i in range(sensors // 2):
            (inbox / f"f{i}").write_text("x")

        def instances_running() -> bool:
            rows = pg(url, count, run_id, "SUCCESS")
            return bool(rows) and rows[0]["n"] >= sensors + 1 + 50

        # 2. The second half lands while the server is up; then a stop mid fan-out that
        # outlasts the stale TTL and the backoff cap.
        for i in range(sensors // 2, sensors):
            (inbox / f"f{i}").write_text("x")
        wait_until(instances_running, 120, what="the fan-out to be under way")
        pg_cluster.stop()
        time.sleep(OUTAGE)  # the outage under test (a span, not a wait): ride it out
        for p in procs:
            assert p.poll() is None, logs_of(logs)
        pg_cluster.start()
        wait_until(
            lambda: run_state(url, run_id) in ("SUCCESS", "FAILED"), 240, what="the run to end"
        )
        texts = logs_of(logs)
        bad = pg(
            url,
            "SELECT t.task_id, t.map_index, t.state, t.attempt, "
            "(SELECT string_agg(e.message, ' | ') FROM task_event e WHERE e.task_row = t.id) "
            "AS log FROM task t WHERE t.run_id = $1 "
            "AND (t.state <> 'SUCCESS' OR t.attempt <> 1)",
            run_id,
        )
        shown = [f"{b['task_id']}[{b['map_index']}] {b['state']}: {b['log']}" for b in bad]
        assert bad == [], "\n".join(s for s in shown if "FAILED" in s)[:4000]  # nothing lost
        assert run_state(url, run_id) == "SUCCESS", texts
        errors = pg(
            url,
            "SELECT message FROM task_event e JOIN task t ON t.id = e.task_row "
            "WHERE t.run_id = $1 AND (e.message LIKE '%worker error%' OR e.message LIKE '%lost%')",
            run_id,
        )
        assert errors == [], errors
        for name, text in texts.items():
            # Logged once per loop and outage, not per try: each "unavailable" line has its
            # "back after" line, and there are few of them (a handful of loops, two outages).
            down, back = text.count("database unavailable"), text.count("database back after")
            assert 1 <= down == back <= 40, (name, down, back, text[-3000:])
            assert "Traceback" not in text, (name, text[-3000:])
        assert any("database back after" in t for t in texts.values()), texts
    finally:
        for p in procs:
            stop_process(p)


FAN_IN_DAG = """
from executor import DAG

dag = DAG("wide")
roots = [dag.task(lambda ctx, i=i: i, task_id=f"r{{i:05d}}") for i in range({width})]


@dag.task(parents=roots)
def gather(ctx):
    return len(ctx.inputs)
"""


@pytest.mark.timeout(600)
def test_no_deadlock_when_4_workers_complete_a_10000_wide_fan_in(tmp_path: Path) -> None:
    # deadlock_timeout short: a deadlock would be found (and logged) within 50 ms.
    settings = {"deadlock_timeout": "50ms", "log_lock_waits": "on"}
    with PgCluster.started(settings=settings) as cluster:
        width = 10_000
        dag_file = tmp_path / "wide.py"
        dag_file.write_text(textwrap.dedent(FAN_IN_DAG).format(width=width))
        url = cluster.dsn
        run_id = create_run(url, dag_file, "wide")
        logs = [tmp_path / f"w{i}.log" for i in range(4)]
        procs = [
            start("worker", url, log, "--slots", "8", "--poll-interval", "0.05") for log in logs
        ]
        try:
            wait_until(
                lambda: run_state(url, run_id) in ("SUCCESS", "FAILED"), 540, interval=1.0,
                what="the fan-in run to end",
            )  # fmt: skip
            assert run_state(url, run_id) == "SUCCESS"
            done = pg(
                url, "SELECT output FROM task WHERE run_id = $1 AND task_id = 'gather'", run_id
            )
            assert done[0]["output"] == str(width)
        finally:
            for p in procs:
                stop_process(p)
        server_log = cluster.log_text()
        assert "deadlock detected" not in server_log, server_log[-5000:]
        for text in logs_of(logs).values():
            assert not re.search("deadlock", text, re.IGNORECASE), text[-3000:]


LOCK_DAG = """
from executor import DAG

dag = DAG("locked")
prev = None
for i in range({n}):
    t = dag.task(lambda ctx, i=i: i, task_id=f"t{{i:02d}}", parents=[prev] if prev else [])
    prev = t
"""


@pytest.mark.timeout(240)
def test_sqlite_locked_beyond_the_busy_timeout_fails_no_task(
    tmp_path: Path, db_path: Path, db_url: str
) -> None:
    dag_file = tmp_path / "locked.py"
    dag_file.write_text(textwrap.dedent(LOCK_DAG).format(n=30))
    run_id = create_run(db_url, dag_file, "locked")
    log = tmp_path / "worker.log"
    worker = start("worker", db_url, log, "--poll-interval", "0.05", SLOTLESS_SQLITE_BUSY_MS="100")
    holder = sqlite3.connect(db_path, isolation_level=None, timeout=30)
    try:
        for _ in range(3):  # three times, each ten times the busy timeout
            wait_until(
                lambda: (
                    sql(db_path, "SELECT count(*) AS n FROM task WHERE state = 'SUCCESS'")[0]["n"]
                    > 0
                ),
                60,
            )
            holder.execute("BEGIN EXCLUSIVE")
            time.sleep(1.0)  # the span the lock is held, not a wait for something
            holder.execute("COMMIT")
        wait_until(
            lambda: (
                sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", run_id)[0]["state"]
                in ("SUCCESS", "FAILED")
            ),
            120,
            what="the run to end",
        )
        text = log.read_text()
        assert (
            sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", run_id)[0]["state"]
            == "SUCCESS"
        ), text
        bad = sql(db_path, "SELECT task_id FROM task WHERE state <> 'SUCCESS' OR attempt <> 1")
        assert bad == [], bad
        assert "database is locked" in text  # the lock was met, and ridden out
    finally:
        holder.close()
        stop_process(worker)
