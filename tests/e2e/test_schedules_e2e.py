"""Schedules run by real `slotless triggerer --dags DIR` processes.

The issue's invariant is "a DAG on ``* * * * *``, two triggerers, one SIGKILLed: exactly one
run per minute over 5 minutes, none missed, none doubled". The clock is shrunk, the
invariant kept: a schedule of every second, lease TTL 2 s, 4 intervals before a triggerer
is killed and 8 after, on PostgreSQL. Runs must cover consecutive intervals with no gap and no
duplicate. Also: a broken DAG file beside a scheduled one is listed with its error while
the good DAG keeps running on schedule, and a paused DAG creates no run.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support import pg
from support.helpers import REPO, async_wait_until, cli, cli_env, stop_process

from executor.store import Store, open_store

pg_server, pg_url = pg.pg_server, pg.pg_url  # fixtures
pytestmark = pytest.mark.slow

EVERY = 1  # seconds between intervals (the shrunk minute)


def every_interval(dag_id: str, start: datetime, *, catchup: bool = True) -> str:
    return f"""
from datetime import datetime, timedelta
from executor import DAG

dag = DAG("{dag_id}", schedule=timedelta(seconds={EVERY}), catchup={catchup},
          start_date=datetime.fromisoformat("{start.isoformat()}"), max_active_runs=1000)

@dag.task
def noop(ctx):
    return None
"""


def start_triggerer(url: str, dags: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "slotless", "triggerer", "--db", url, "--dags", str(dags),
         "--lease-ttl", "2", "--rescan", "0.5"],
        cwd=REPO, env=cli_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip


async def run_keys(store: Store, dag_id: str) -> list[str]:
    async with store.db.read() as tx:
        rows = await tx.fetch("list_runs", n=100_000)
    return sorted(r["run_key"] for r in rows if r["dag_id"] == dag_id)


def gaps(keys: list[str]) -> list[tuple[str, str]]:
    moments = [datetime.strptime(k, "%Y-%m-%dT%H:%M:%SZ") for k in keys]
    return [
        (keys[i], keys[i + 1])
        for i in range(len(keys) - 1)
        if moments[i + 1] - moments[i] != timedelta(seconds=EVERY)
    ]


async def test_two_triggerers_one_killed_one_run_per_interval(pg_url: str, tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    (dags / "ticker.py").write_text(every_interval("ticker", start))
    (dags / "broken.py").write_text("import not_a_module_anywhere\n")
    store = await open_store(pg_url)
    procs = [start_triggerer(pg_url, dags, tmp_path / f"t{i}.log") for i in range(2)]
    try:

        async def both_hold_shards() -> bool:
            async with store.db.read() as tx:
                rows = await tx.fetch("list_triggerers")
            return len([r for r in rows if r["shards"]]) == 2

        await async_wait_until(
            both_hold_shards, 30, interval=0.1, what="two triggerers holding shards"
        )
        await async_wait_until(
            lambda: _count_at_least(store, 4), 30, interval=0.1, what="the first runs"
        )
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        killed_at = len(await run_keys(store, "ticker"))
        await async_wait_until(
            lambda: _count_at_least(store, killed_at + 8),
            60,
            interval=0.1,
            what="runs after the kill",
        )
        keys = await run_keys(store, "ticker")
    finally:
        for p in procs:
            if p.poll() is None:
                stop_process(p)
        await store.close()
    assert keys[0] == start.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert len(keys) == len(set(keys))  # the unique key makes a double impossible; said anyway
    assert gaps(keys) == [], (tmp_path / "t1.log").read_text()
    listing = cli("dags", "list", "--db", pg_url, "--json")
    assert listing.returncode == 0, listing.stderr
    [broken] = json.loads(listing.stdout)["broken_files"]
    assert broken["file"].endswith("broken.py") and "not_a_module_anywhere" in broken["error"]


async def _count_at_least(store: Store, n: int) -> bool:
    return len(await run_keys(store, "ticker")) >= n


async def test_a_paused_dag_creates_no_run_and_unpausing_does_not_flood(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    dags = tmp_path / "dags"
    dags.mkdir()
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    (dags / "quiet.py").write_text(every_interval("quiet", start, catchup=False))
    listing = cli("dags", "list", "--db", url, "--dags", str(dags))
    assert listing.returncode == 0, listing.stderr
    assert cli("dags", "pause", "quiet", "--db", url).returncode == 0
    proc = start_triggerer(url, dags, tmp_path / "t.log")
    store = await open_store(url)
    try:

        async def holds_every_shard() -> bool:
            async with store.db.read() as tx:
                rows = await tx.fetch("list_triggerers")
            return any(r["shards"] == 64 for r in rows)

        await async_wait_until(
            holds_every_shard, 30, interval=0.1, what="the triggerer holding every shard"
        )
        # Paused: several intervals pass and no run is created (the triggerer holds no wait).
        until = time.monotonic() + 3 * EVERY
        while time.monotonic() < until:
            assert await run_keys(store, "quiet") == []
            await asyncio.sleep(0.2)  # the span watched, not a wait for something
        assert cli("dags", "unpause", "quiet", "--db", url).returncode == 0
        await async_wait_until(
            lambda: _has_runs(store, "quiet", 3), 30, interval=0.1, what="runs after unpausing"
        )
        keys = await run_keys(store, "quiet")
    finally:
        stop_process(proc)
        await store.close()
    # Without catchup, an hour of missed intervals is not a flood: the first run is recent.
    first = datetime.strptime(keys[0], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert datetime.now(UTC) - first < timedelta(seconds=30), keys[:3]


async def _has_runs(store: Store, dag_id: str, n: int) -> bool:
    return len(await run_keys(store, dag_id)) >= n


async def test_an_s3_start_condition_starts_one_run_per_key_and_never_twice(
    tmp_path: Path,
) -> None:
    from support.servers import MotoS3Server, s3_conn_uri

    moto = MotoS3Server().start()
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "landing.py").write_text(
        """
from executor import DAG
from triggers.s3 import S3KeyTrigger

dag = DAG("landing", start_when=S3KeyTrigger(bucket="drop", key="in/*.csv", conn_id="s3t",
                                             poke_interval=0.5))

@dag.task
def load(ctx):
    return ctx.start_event["key"]
"""
    )
    moto.make_bucket("drop", [])
    env = cli_env(SLOTLESS_CONN_S3T=s3_conn_uri(moto.endpoint))
    proc = subprocess.Popen(
        [sys.executable, "-m", "slotless", "triggerer", "--db", url, "--dags", str(dags),
         "--rescan", "0.5"],
        cwd=REPO, env=env, stdout=(tmp_path / "t.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    store = await open_store(url)

    async def armed_at() -> float:
        waits = await store.catalogue.start_waits()
        return waits[0]["armed_at"] if waits else 0.0

    try:
        await async_wait_until(armed_at, 30, interval=0.1, what="the condition armed")
        moto.put("drop", "in/a.csv")
        await async_wait_until(lambda: _has_runs(store, "landing", 1), 30, what="a run for a.csv")
        moto.put("drop", "in/b.csv")
        moto.put("drop", "in/c.csv")
        moto.put("drop", "in/notes.txt")  # does not match the glob
        await async_wait_until(lambda: _has_runs(store, "landing", 3), 30, what="b and c")
        # The listing keeps finding the same three objects: each finding is a fire that
        # re-arms the wait; wait for three of them, then no fourth run may exist.
        for _ in range(3):
            seen = await armed_at()
            await async_wait_until(
                functools.partial(_later, armed_at, seen), 30, interval=0.05, what="a re-fire"
            )
        keys = await run_keys(store, "landing")
        async with store.db.read() as tx:
            events = [json.loads(r["start_event"]) for r in await tx.fetch("list_runs", n=10)]
    finally:
        stop_process(proc)
        await store.close()
        moto.stop()
    assert keys == ["s3://drop/in/a.csv", "s3://drop/in/b.csv", "s3://drop/in/c.csv"]
    assert sorted(e["key"] for e in events) == ["in/a.csv", "in/b.csv", "in/c.csv"]


async def _later(read: Callable[[], Awaitable[float]], seen: float) -> bool:
    return await read() > seen
