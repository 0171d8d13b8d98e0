"""PostgreSQL: claims and no-op tasks per second over 1, 2 and 4 worker processes, and the
time from a trigger firing to its task starting on a worker (LISTEN/NOTIFY versus polling).

    python -m benchmarks.postgres [--dsn postgresql://postgres@127.0.0.1:5432/test]
                                  [--workers 1,2,4] [--tasks 3000] [--slots 8]
                                  [--waits 300] [--fire-every 0.03] [--repeat 3]

Every phase runs in a fresh schema of the named database (dropped afterwards), with real
``slotless worker`` / ``slotless triggerer`` processes started for it. Claims and tasks
figures are the median of ``--repeat`` runs (every run is kept in the JSON).

- claims: K processes claim rows of one run of N no-op tasks with ``Store.claim(owner, 10)``
  (``FOR UPDATE SKIP LOCKED``, nothing executed), all starting at the same instant, until
  none is left; claims/s = N / (last claim that got rows - first claim). No row may be
  claimed twice.
- tasks: K ``slotless worker --slots S`` processes run N no-op mapped instances (a source,
  N instances, a fan-in); tasks/s = N / (last instance ended - first instance started),
  both stamped by the store with the database's clock.
- fire_to_start: W tasks each ``ctx.defer`` on their own file; the benchmark creates the
  files one every ``--fire-every`` s in random order; one triggerer (poke interval 0.1 s)
  fires them, 2 workers (poll interval 0.5 s) run the resumed method, which stamps the
  time it started. Latency = that stamp - the time of the DEFERRED -> PENDING transition
  (the start of the triggerer's transaction, on the database's clock; same host, so the
  two clocks agree to a fraction of a millisecond). Run once with LISTEN/NOTIFY and once
  with it off (``?listen=0``: workers only poll), to show what the wake-ups buy.

- many_hosts: ``--many-workers`` worker processes (3) and
  ``--many-triggerers`` triggerers (2) on one run of ``--many-waits`` deferrable file
  sensors (10,000) over ``--many-paths`` distinct paths (6,000, so equal waits share a
  check), polled every ``--many-interval`` s (10), all parents of one ``all_done`` task;
  workers with ``--many-slots`` slots (32; a list such as 8,32 runs the phase once for
  each, the last is the headline). A worker claims at most its free slots per exchange,
  so slots bound how many deferrals one transaction writes. defers_per_s = waits /
  (first claim of a sensor -> last sensor DEFERRED), both stamped by the store. Once
  every wait is loaded, every file lands at once (written before, renamed in a burst);
  burst_10000_all_fired_s = last file landed -> last sensor out of DEFERRED (the
  transition's timestamp), and each sensor's delay is that transition - its file's
  landing (p50/p99). Each wait's checks fall due at the phase of the interval at which
  it was loaded, so a delay lies between the time to check and write its fire and the
  interval plus that; fires_spread_s (first fire to last) shows how spread the phases
  were. ``--only many_hosts`` runs this phase alone and keeps the other phases' figures
  of the existing JSON.

Target: fire_to_start p99 under 100 ms with LISTEN/NOTIFY.
Targets: defers_per_s >= 2,000; burst_10000_all_fired_s <= interval + 1 s.
Writes benchmarks/results/postgres.json and postgres.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import calibration, common

NAME = "postgres"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
TARGET_P99_MS = 100.0
TARGET_DEFERS_PER_S = 2000.0
PHASES = ("claims", "tasks", "fire_to_start", "many_hosts")
DAY = date(2026, 4, 25)

DAG_SOURCE = '''"""Benchmark DAGs for PostgreSQL."""
import time
from pathlib import Path

from executor import DAG
from triggers.files import FileTrigger

N = {n}
WAITS = {waits}
INBOX = Path({inbox!r})

roots = DAG("bench_pg_roots")
for i in range(N):
    roots.task(lambda ctx: None, task_id=f"t{{i:05d}}")

fan = DAG("bench_pg_fanout")


@fan.task
def source(ctx):
    return list(range(N))


@fan.task(expand=source, map_cap=N)
def child(ctx):
    return None


@fan.task(parents=[child], trigger_rule="all_done")
def total(ctx):
    return len(ctx.inputs["child"])


waits = DAG("bench_pg_waits")


def make(i):
    def wait(ctx):
        ctx.defer(
            FileTrigger(path=str(INBOX / f"f{{i:05d}}"), poke_interval=0.1),
            method="resume",
            timeout=600,
        )

    def resume(ctx):
        return {{"started": time.time()}}

    spec = waits.task(wait, task_id=f"w{{i:05d}}")
    spec.method(resume)


for i in range(WAITS):
    make(i)
'''

MANY_SOURCE = '''"""Many hosts: deferrable file sensors sharing paths, one task after them all."""
from pathlib import Path

from executor import DAG
from triggers.files import FileTrigger

WAITS = {waits}
PATHS = {paths}
INTERVAL = {interval}
INBOX = Path({inbox!r})

many = DAG("bench_pg_many")
sensors = [
    many.sensor(
        f"s{{i:05d}}",
        FileTrigger(path=str(INBOX / f"p{{i % PATHS:05d}}"), poke_interval=INTERVAL),
        timeout=3600,
    )
    for i in range(WAITS)
]
many.task(lambda ctx: None, task_id="after", parents=sensors, trigger_rule="all_done")
'''


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.postgres",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("SLOTLESS_TEST_PG_DSN") or DEFAULT_DSN,
        help=f"PostgreSQL server and database (default $SLOTLESS_TEST_PG_DSN or {DEFAULT_DSN})",
    )
    p.add_argument("--workers", default="1,2,4", help="worker process counts (default 1,2,4)")
    p.add_argument("--tasks", type=int, default=3000, help="no-op tasks per run (default 3000)")
    p.add_argument("--slots", type=int, default=8, help="slots per worker (default 8)")
    p.add_argument("--waits", type=int, default=300, help="deferred tasks to fire (default 300)")
    p.add_argument("--fire-every", type=float, default=0.03, help="seconds between two files")
    p.add_argument(
        "--repeat", type=int, default=3, help="runs of each claims/tasks figure (median kept)"
    )
    p.add_argument(
        "--only",
        choices=PHASES,
        help="run this phase alone; the others' figures are kept from the existing JSON",
    )
    p.add_argument("--many-waits", type=int, default=10_000, help="many_hosts: sensors")
    p.add_argument("--many-paths", type=int, default=6_000, help="many_hosts: distinct paths")
    p.add_argument("--many-interval", type=float, default=10.0, help="many_hosts: poke interval")
    p.add_argument("--many-workers", type=int, default=3, help="many_hosts: worker processes")
    p.add_argument("--many-triggerers", type=int, default=2, help="many_hosts: triggerers")
    p.add_argument(
        "--many-slots", default="32", help="many_hosts: slots per worker (a list: a run each)"
    )
    p.add_argument("--workdir", help="where DAG files go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--results", type=Path, default=common.RESULTS, help="output folder")
    p.add_argument("--claimer", help=argparse.SUPPRESS)  # internal: one claiming process
    p.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- plumbing ------------------------------------------------------------------------------


def with_params(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), *params.items()]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


class Schema:
    """A fresh schema for one phase; ``url`` points at it (search_path)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.name = f"bench_{secrets.token_hex(4)}"
        self.url = with_params(dsn, search_path=self.name)

    async def __aenter__(self) -> Schema:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"CREATE SCHEMA {self.name}")
        finally:
            await conn.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"DROP SCHEMA {self.name} CASCADE")
        finally:
            await conn.close()


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(common.REPO), os.environ.get("PYTHONPATH")])
        ),
    }
    env.pop("SLOTLESS_DB", None)
    out = open(log, "w")  # noqa: SIM115 - kept by the child
    return subprocess.Popen(args, cwd=common.REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def slotless(*args: str, log: Path) -> subprocess.Popen:
    return spawn([sys.executable, "-m", "slotless", *args], log)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


async def wait_run(conn: Any, run_id: str, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await conn.fetchval("SELECT state FROM dag_run WHERE run_id = $1", run_id) == "RUNNING":
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} did not end within {timeout:g} s")
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a worker process died; see its log")
        await asyncio.sleep(0.05)


# -- claims --------------------------------------------------------------------------------


async def claimer(url: str, start_at: float) -> None:
    """One claiming process: claim 10 at a time until nothing is left; report on stdout."""
    from executor.store import open_store

    store = await open_store(url)
    owner = f"claimer-{os.getpid()}"
    claimed = transactions = 0
    await asyncio.sleep(max(0.0, start_at - time.time()))
    t0 = t1 = time.time()
    while rows := await store.exchange.exchange([], owner, 10):
        claimed += len(rows)
        transactions += 1
        t1 = time.time()  # the window ends with the last claim that got rows
    await store.close()
    print(json.dumps({"claimed": claimed, "transactions": transactions, "t0": t0, "t1": t1}))


async def claims(dsn: str, folder: Path, dag_file: Path, k: int) -> dict[str, Any]:
    import asyncpg

    from executor.loader import load_dag
    from executor.store import open_store

    async with Schema(dsn) as schema:
        store = await open_store(schema.url)
        dag = load_dag(str(dag_file), "bench_pg_roots")
        n = len(dag.tasks)
        await store.runs.create_run(dag, DAY)
        await store.close()
        start_at = time.time() + 2.0 + 0.3 * k  # every process imported and connected by then
        procs = [
            spawn(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.postgres",
                    "--claimer",
                    schema.url,
                    "--start-at",
                    str(start_at),
                ],
                folder / f"claimer-{k}-{i}.log",
            )
            for i in range(k)
        ]
        for p in procs:
            p.wait(120)
        reports = []
        for i in range(k):
            text = (folder / f"claimer-{k}-{i}.log").read_text()
            try:
                reports.append(json.loads(text.splitlines()[-1]))
            except (IndexError, ValueError):
                raise SystemExit(f"claiming process {i} of {k} failed:\n{text}") from None
        conn = await asyncpg.connect(schema.url)
        try:
            twice = await conn.fetchval(
                "SELECT count(*) FROM (SELECT task_row FROM task_event WHERE to_state = 'RUNNING'"
                " GROUP BY task_row HAVING count(*) > 1) AS x"
            )
        finally:
            await conn.close()
    total = sum(r["claimed"] for r in reports)
    if total != n or twice:
        raise SystemExit(f"claims: {total} of {n} claimed, {twice} rows claimed twice")
    seconds = max(r["t1"] for r in reports) - min(r["t0"] for r in reports)
    return {
        "workers": k,
        "claimed": total,
        "claimed_twice": twice,
        "seconds": round(seconds, 3),
        "claims_per_s": round(total / seconds, 1),
        "claim_transactions_per_s": round(sum(r["transactions"] for r in reports) / seconds, 1),
    }


# -- tasks ---------------------------------------------------------------------------------


async def tasks(dsn: str, folder: Path, dag_file: Path, k: int, slots: int) -> dict[str, Any]:
    import asyncpg

    from executor.loader import load_dag
    from executor.store import open_store

    async with Schema(dsn) as schema:
        store = await open_store(schema.url)
        procs = [
            slotless(
                "worker",
                "--db",
                schema.url,
                "--slots",
                str(slots),
                log=folder / f"tasks-{k}-{i}.log",
            )
            for i in range(k)
        ]
        try:
            await asyncio.sleep(2.0)  # let them start: process startup is not measured
            dag = load_dag(str(dag_file), "bench_pg_fanout")
            run_id = await store.runs.create_run(dag, DAY, dag_file=str(dag_file))
            conn = await asyncpg.connect(schema.url)
            try:
                await wait_run(conn, run_id, procs, timeout=600)
                facts = await conn.fetchrow(
                    "SELECT count(*) AS n, count(*) FILTER (WHERE state = 'SUCCESS') AS ok,"
                    " min(started_at) AS first, max(ended_at) AS last FROM task"
                    " WHERE run_id = $1 AND task_id = 'child' AND map_index >= 0",
                    run_id,
                )
                run = await conn.fetchrow("SELECT * FROM dag_run WHERE run_id = $1", run_id)
                per_worker = await conn.fetch(
                    "SELECT worker_id, count(*) AS n FROM slot_usage GROUP BY worker_id"
                )
            finally:
                await conn.close()
        finally:
            stop(procs)
            await store.close()
    if run["state"] != "SUCCESS" or facts["ok"] != facts["n"]:
        raise SystemExit(f"tasks: run ended {run['state']}, {facts['ok']} of {facts['n']} ok")
    seconds = facts["last"] - facts["first"]
    return {
        "workers": k,
        "slots_per_worker": slots,
        "tasks": facts["n"],
        "seconds": round(seconds, 3),
        "tasks_per_s": round(facts["n"] / seconds, 1),
        "run_s": round(run["ended_at"] - run["created_at"], 3),
        "tasks_per_worker": sorted(r["n"] for r in per_worker),
    }


# -- fire to start -------------------------------------------------------------------------


async def fire_to_start(
    dsn: str, folder: Path, dag_file: Path, inbox: Path, every: float, listen: bool
) -> dict[str, Any]:
    import asyncpg

    from executor.loader import load_dag
    from executor.store import open_store

    for f in inbox.glob("*"):
        f.unlink()
    tag = "notify" if listen else "poll"
    async with Schema(dsn) as schema:
        url = schema.url if listen else with_params(schema.url, listen="0")
        store = await open_store(url)
        procs = [
            slotless("triggerer", "--db", url, log=folder / f"fire-{tag}-triggerer.log"),
            *(
                slotless(
                    "worker",
                    "--db",
                    url,
                    "--slots",
                    "8",
                    "--poll-interval",
                    "0.5",
                    log=folder / f"fire-{tag}-worker-{i}.log",
                )
                for i in range(2)
            ),
        ]
        try:
            await asyncio.sleep(2.0)
            dag = load_dag(str(dag_file), "bench_pg_waits")
            n = len(dag.tasks)
            run_id = await store.runs.create_run(dag, DAY, dag_file=str(dag_file))
            conn = await asyncpg.connect(schema.url)
            try:
                deadline = time.monotonic() + 120
                while (
                    await conn.fetchval(
                        "SELECT count(*) FROM task WHERE run_id = $1 AND state = 'DEFERRED'",
                        run_id,
                    )
                    < n
                ):
                    if time.monotonic() > deadline:
                        raise SystemExit("the waits never all deferred")
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.5)  # the triggerer loads them all
                order = list(range(n))
                random.Random(7).shuffle(order)
                for i in order:
                    tmp = inbox / f"f{i:05d}.part"
                    tmp.write_text("x")
                    tmp.rename(inbox / f"f{i:05d}")
                    await asyncio.sleep(every)
                await wait_run(conn, run_id, procs, timeout=120)
                rows = await conn.fetch(
                    "SELECT t.output, (SELECT max(e.ts) FROM task_event e WHERE e.task_row = t.id"
                    "   AND e.from_state = 'DEFERRED' AND e.to_state = 'PENDING') AS fired"
                    " FROM task t WHERE t.run_id = $1",
                    run_id,
                )
            finally:
                await conn.close()
        finally:
            stop(procs)
            await store.close()
    latencies = sorted((json.loads(r["output"])["started"] - r["fired"]) * 1e3 for r in rows)
    return {
        "mode": tag,
        "waits": len(latencies),
        "fire_every_s": every,
        "p50_ms": round(common.percentile(latencies, 50), 2),
        "p90_ms": round(common.percentile(latencies, 90), 2),
        "p99_ms": round(common.percentile(latencies, 99), 2),
        "max_ms": round(latencies[-1], 2),
        "min_ms": round(latencies[0], 2),
        "latencies_ms": [round(x, 2) for x in latencies],
    }


# -- many hosts --------------------------------------------------------------------------


async def many_hosts(
    dsn: str, folder: Path, args: argparse.Namespace, slots: int
) -> dict[str, Any]:
    import asyncpg

    from executor.loader import load_dag
    from executor.store import open_store

    inbox = folder / "many-inbox"
    inbox.mkdir(exist_ok=True)
    for f in inbox.glob("*"):
        f.unlink()
    waits, paths = args.many_waits, min(args.many_paths, args.many_waits)
    dag_file = common.write_dag_file(
        folder,
        "bench_pg_many",
        MANY_SOURCE.format(waits=waits, paths=paths, interval=args.many_interval, inbox=str(inbox)),
    )
    async with Schema(dsn) as schema:
        store = await open_store(schema.url)
        procs = [
            *(
                # Polled, as its figures were measured (push is on by default now).
                slotless(
                    "triggerer",
                    "--db",
                    schema.url,
                    "--no-push",
                    log=folder / f"many-triggerer-{i}.log",
                )
                for i in range(args.many_triggerers)
            ),
            *(
                slotless(
                    "worker",
                    "--db",
                    schema.url,
                    "--slots",
                    str(slots),
                    log=folder / f"many-worker-{i}.log",
                )
                for i in range(args.many_workers)
            ),
        ]
        conn = await asyncpg.connect(schema.url)
        try:
            await asyncio.sleep(3.0)  # process startup and the shards' first split
            dag = load_dag(str(dag_file), "bench_pg_many")
            cpu0 = _cpu_by_role(procs, args.many_triggerers)
            run_id = await store.runs.create_run(dag, DAY, dag_file=str(dag_file))
            deadline = time.monotonic() + 600
            while await conn.fetchval(
                "SELECT count(*) FROM task WHERE run_id = $1 AND task_id LIKE 's%'"
                " AND state <> 'DEFERRED'",
                run_id,
            ):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise SystemExit("many_hosts: the sensors never all deferred; see the logs")
                await asyncio.sleep(0.1)
            cpu1 = _cpu_by_role(procs, args.many_triggerers)
            deferring = await conn.fetchrow(
                "SELECT min(e.ts) FILTER (WHERE e.to_state = 'RUNNING') AS first,"
                " max(e.ts) FILTER (WHERE e.to_state = 'DEFERRED') AS last"
                " FROM task_event e JOIN task t ON t.id = e.task_row"
                " WHERE t.run_id = $1 AND t.task_id LIKE 's%' AND e.kind = 'transition'",
                run_id,
            )
            # Every wait held by a triggerer (and checked once) before the files land.
            while (
                await conn.fetchval(
                    "SELECT COALESCE(sum(triggers), 0) FROM triggerer"
                    " WHERE seen_at > extract(epoch FROM now()) - 5"
                )
                < waits
            ):
                if time.monotonic() > deadline:
                    raise SystemExit("many_hosts: the triggerers never held every wait")
                await asyncio.sleep(0.2)
            # Written beforehand under other names: the burst is the renames alone.
            for i in range(paths):
                (inbox / f"p{i:05d}.part").write_text("x")
            await asyncio.sleep(2.0)
            landed: list[float] = []
            for i in range(paths):
                (inbox / f"p{i:05d}.part").rename(inbox / f"p{i:05d}")
                landed.append(time.time())
            last_landed = landed[-1]
            while await conn.fetchval(
                "SELECT count(*) FROM task WHERE run_id = $1 AND state = 'DEFERRED'", run_id
            ):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise SystemExit("many_hosts: sensors left DEFERRED; see the logs")
                await asyncio.sleep(0.05)
            await wait_run(conn, run_id, procs, timeout=120)
            fired = await conn.fetch(
                "SELECT t.task_id, e.ts, e.to_state FROM task_event e"
                " JOIN task t ON t.id = e.task_row"
                " WHERE t.run_id = $1 AND t.task_id LIKE 's%' AND e.kind = 'transition'"
                "   AND e.from_state = 'DEFERRED'",
                run_id,
            )
            run = await conn.fetchrow("SELECT * FROM dag_run WHERE run_id = $1", run_id)
        finally:
            await conn.close()
            stop(procs)
            await store.close()
    if len(fired) != waits or any(r["to_state"] != "SUCCESS" for r in fired):
        raise SystemExit(f"many_hosts: {len(fired)} of {waits} sensors fired, not all SUCCESS")
    delays = sorted(r["ts"] - landed[int(r["task_id"][1:]) % paths] for r in fired)
    defer_s = deferring["last"] - deferring["first"]
    return {
        "workers": args.many_workers,
        "triggerers": args.many_triggerers,
        "slots_per_worker": slots,
        "waits": waits,
        "paths": paths,
        "interval_s": args.many_interval,
        "defer_s": round(defer_s, 3),
        "defers_per_s": round(waits / defer_s, 1),
        # CPU seconds each role used from the run's creation to its last sensor deferred.
        "defer_cpu_s": {k: round(cpu1[k] - cpu0[k], 2) for k in cpu0},
        "burst_s": round(last_landed - landed[0], 3),
        "all_fired_s": round(max(r["ts"] for r in fired) - last_landed, 3),
        # First to last fire: how spread the checks' phases were (each at its load's).
        "fires_spread_s": round(max(r["ts"] for r in fired) - min(r["ts"] for r in fired), 3),
        "run_ended_s": round(run["ended_at"] - last_landed, 3),
        "run_state": run["state"],
        "delay_p50_s": round(common.percentile(delays, 50), 3),
        "delay_p99_s": round(common.percentile(delays, 99), 3),
        "delay_max_s": round(delays[-1], 3),
        "delays_s": [round(x, 3) for x in delays[:: max(1, len(delays) // 2000)]],
    }


def _cpu_by_role(procs: list[subprocess.Popen], triggerers: int) -> dict[str, float]:
    """CPU seconds used so far by the triggerer processes and by the worker processes."""
    import psutil

    def cpu(p: subprocess.Popen) -> float:
        t = psutil.Process(p.pid).cpu_times()
        return t.user + t.system

    return {
        "triggerers": sum(cpu(p) for p in procs[:triggerers]),
        "workers": sum(cpu(p) for p in procs[triggerers:]),
    }


# -- the whole benchmark -------------------------------------------------------------------


async def main_async(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    counts = [int(k) for k in args.workers.split(",")]
    inbox = folder / "inbox"
    inbox.mkdir(exist_ok=True)
    dag_file = common.write_dag_file(
        folder,
        "bench_pg",
        DAG_SOURCE.format(n=args.tasks, waits=args.waits, inbox=str(inbox)),
    )
    out: dict[str, Any] = {}
    phases = [args.only] if args.only else PHASES
    if "claims" in phases:
        out["claims"] = []
        for k in counts:
            samples = []
            for i in range(args.repeat):
                common.console.print(f"claims with {k} process(es), {i + 1} of {args.repeat}")
                samples.append(await claims(args.dsn, folder, dag_file, k))
            out["claims"].append(median_of(samples, "claims_per_s"))
    if "tasks" in phases:
        out["tasks"] = []
        for k in counts:
            samples = []
            for i in range(args.repeat):
                common.console.print(f"no-op tasks with {k} worker(s), {i + 1} of {args.repeat}")
                samples.append(await tasks(args.dsn, folder, dag_file, k, args.slots))
            out["tasks"].append(median_of(samples, "tasks_per_s"))
    if "fire_to_start" in phases:
        for listen in (True, False):
            common.console.print(f"fire to start, {'LISTEN/NOTIFY' if listen else 'polling only'}")
            out["notify" if listen else "poll"] = await fire_to_start(
                args.dsn, folder, dag_file, inbox, args.fire_every, listen
            )
    if "many_hosts" in phases:
        common.console.print(
            f"many hosts: {args.many_waits:,} waits, {args.many_workers} workers, "
            f"{args.many_triggerers} triggerers"
        )
        runs = []
        for slots in [int(k) for k in args.many_slots.split(",")]:
            common.console.print(f"  {slots} slots per worker")
            runs.append(await many_hosts(args.dsn, folder, args, slots))
        out["many_hosts"] = runs[-1]
        out["many_hosts_runs"] = runs
    return out


def repeated_figures(detail: dict[str, Any], repeat: int) -> list[dict[str, float | None]]:
    """Each repeat's claims/s and tasks/s per worker count (``--repeat`` runs of each);
    fire -> start and many hosts are measured once, in the first."""
    runs: list[dict[str, float | None]] = [{} for _ in range(repeat)]
    for phase, key in (("claims", "claims_per_s"), ("tasks", "tasks_per_s")):
        for row in detail.get(phase, []):
            for i, value in enumerate(row.get(f"{key}_samples", [])):
                runs[i][f"{key}_{row['workers']}"] = value
    if "notify" in detail:
        runs[0]["fire_to_start_p99_ms"] = detail["notify"]["p99_ms"]
    if "many_hosts" in detail:
        runs[0]["defers_per_s"] = detail["many_hosts"]["defers_per_s"]
    return runs


def median_of(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The sample with the median ``key``, carrying every sample's ``key``."""
    ordered = sorted(samples, key=lambda s: s[key])
    return {**ordered[len(ordered) // 2], f"{key}_samples": [s[key] for s in samples]}


def server_facts(dsn: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            names = ("server_version", "max_connections", "shared_buffers", "synchronous_commit")
            return {n: await conn.fetchval(f"SHOW {n}") for n in names}
        finally:
            await conn.close()

    return asyncio.run(read())


def plot(doc: dict[str, Any], results: Path) -> Path:
    """A panel per phase measured (a phase run alone, with no earlier figures: its own)."""
    detail = doc["detail"]
    panels = [
        draw
        for draw, key in (
            (_plot_rates, "tasks"),
            (_plot_fire, "notify"),
            (_plot_many, "many_hosts"),
        )
        if key in detail
    ]
    fig, axes = common.subplots(max(2, len(panels)))
    for draw, ax in zip(panels, axes, strict=False):
        draw(doc, ax)
    return common.save_figure(fig, NAME, results)


def _plot_rates(doc: dict[str, Any], ax1: Any) -> None:
    ks = [t["workers"] for t in doc["detail"]["tasks"]]
    width = 0.38
    xs = range(len(ks))
    ax1.bar(
        [x - width / 2 for x in xs],
        [t["tasks_per_s"] for t in doc["detail"]["tasks"]],
        width,
        label="no-op tasks/s (slotless worker, 8 slots each)",
        color="#4c72b0",
    )
    ax1.bar(
        [x + width / 2 for x in xs],
        [c["claims_per_s"] for c in doc["detail"]["claims"]],
        width,
        label="claims/s (claim 10 per transaction)",
        color="#55a868",
    )
    ax1.set_xticks(list(xs), [str(k) for k in ks])
    ax1.set_xlabel("worker processes")
    ax1.set_ylabel("per second")
    ax1.set_title(
        f"PostgreSQL {doc['server']['server_version'].split()[0]}, "
        f"{doc['machine']['cpu_count']} CPUs shared with the server"
    )
    ax1.legend(loc="upper left", fontsize=8)


def _plot_fire(doc: dict[str, Any], ax2: Any) -> None:
    for mode, color in (("notify", "#c44e52"), ("poll", "#8172b2")):
        lat = doc["detail"][mode]["latencies_ms"]
        ys = [(i + 1) / len(lat) for i in range(len(lat))]
        d = doc["detail"][mode]
        label = (
            f"{'LISTEN/NOTIFY' if mode == 'notify' else 'polling every 0.5 s'}: "
            f"p50 {d['p50_ms']:.0f} ms, p99 {d['p99_ms']:.0f} ms"
        )
        ax2.plot(lat, ys, color=color, label=label)
    ax2.axvline(TARGET_P99_MS, ls="--", color="grey", lw=1, label="target p99: 100 ms")
    ax2.set_xscale("log")
    ax2.set_xlabel("trigger fired -> task started on a worker (ms, log scale)")
    ax2.set_ylabel("fraction of tasks")
    ax2.set_title(f"{doc['detail']['notify']['waits']} deferred tasks, 1 triggerer, 2 workers")
    ax2.legend(loc="lower right", fontsize=8)


def _plot_many(doc: dict[str, Any], ax3: Any) -> None:
    many = doc["detail"]["many_hosts"]
    runs = doc["detail"].get("many_hosts_runs") or [many]
    for run, color in zip(runs, ("#8172b2", "#dd8452", "#55a868", "#c44e52"), strict=False):
        delays = run["delays_s"]
        ys = [(i + 1) / len(delays) for i in range(len(delays))]
        ax3.plot(
            delays,
            ys,
            color=color,
            label=f"{run['slots_per_worker']} slots: defer {run['defers_per_s']:,.0f}/s; "
            f"fired p50 {run['delay_p50_s']:.1f} s, p99 {run['delay_p99_s']:.1f} s",
        )
    target = many["interval_s"] + 1.0
    ax3.axvline(target, ls="--", color="grey", lw=1, label=f"interval + 1 s = {target:g} s")
    ax3.set_xlabel("file landed -> sensor out of DEFERRED (s)")
    ax3.set_ylabel("fraction of sensors")
    ax3.set_title(
        f"{many['waits']:,} waits on {many['paths']:,} files, "
        f"{many['interval_s']:g} s interval; {many['workers']} workers, "
        f"{many['triggerers']} triggerers",
        fontsize=9,
    )
    ax3.legend(loc="lower right", fontsize=8)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.claimer:
        asyncio.run(claimer(args.claimer, args.start_at))
        return 0
    previous: dict[str, Any] = {}
    if args.only:
        # One phase rerun: the others' figures (and their commands) are kept as they were.
        path = args.results / f"{NAME}.json"
        previous = json.loads(path.read_text()) if path.exists() else {}
    with common.workdir(args.workdir, args.keep) as folder, calibration.Recording(folder) as rec:
        detail = asyncio.run(main_async(args, folder))
    for figures in repeated_figures(detail, args.repeat):
        rec.add(figures)
    doc = common.result_document(
        NAME,
        argv,
        {
            "workers": args.workers,
            "tasks": args.tasks,
            "slots": args.slots,
            "waits": args.waits,
            "fire_every_s": args.fire_every,
            "repeat": args.repeat,
            "many_waits": args.many_waits,
            "many_paths": args.many_paths,
            "many_interval_s": args.many_interval,
            "many_workers": args.many_workers,
            "many_triggerers": args.many_triggerers,
            "many_slots": args.many_slots,
        },
        common.REPO,
    )
    doc["server"] = server_facts(args.dsn)
    doc.update(rec.fields())
    if previous:
        kept = {k: v for k, v in previous.items() if k not in doc}
        # Each phase says the command, load and commit it was measured with.
        runs = dict(previous.get("phase_runs") or {})
        if not runs:
            runs["claims,tasks,fire_to_start"] = {
                k: previous.get(k) for k in ("command", "date", "git", "load", "params")
            }
        runs[args.only] = {k: doc[k] for k in ("command", "date", "git", "load", "params")}
        doc = {**kept, **doc, "phase_runs": runs}
        doc["detail"] = {**previous.get("detail", {}), **detail}
    else:
        doc["detail"] = detail
    detail = doc["detail"]
    if "notify" in detail:
        doc["fire_to_start_p50_ms"] = detail["notify"]["p50_ms"]
        doc["fire_to_start_p99_ms"] = detail["notify"]["p99_ms"]
        doc["fire_to_start_target_p99_ms"] = TARGET_P99_MS
        doc["fire_to_start_polling_p50_ms"] = detail["poll"]["p50_ms"]
        doc["fire_to_start_polling_p99_ms"] = detail["poll"]["p99_ms"]
    if "tasks" in detail:
        doc["tasks_per_s"] = {str(t["workers"]): t["tasks_per_s"] for t in detail["tasks"]}
    if "claims" in detail:
        doc["claims_per_s"] = {str(c["workers"]): c["claims_per_s"] for c in detail["claims"]}
    if "many_hosts" in detail:
        m = detail["many_hosts"]
        doc["defers_per_s"] = m["defers_per_s"]
        doc["defers_target_per_s"] = TARGET_DEFERS_PER_S
        doc[f"burst_{m['waits']}_all_fired_s"] = m["all_fired_s"]
        doc["burst_all_fired_target_s"] = m["interval_s"] + 1.0
        doc["burst_delay_p50_s"] = m["delay_p50_s"]
        doc["burst_delay_p99_s"] = m["delay_p99_s"]
        doc["burst_fires_spread_s"] = m["fires_spread_s"]
        doc["defers_per_s_by_slots"] = {
            str(r["slots_per_worker"]): r["defers_per_s"] for r in detail["many_hosts_runs"]
        }
    json_path = common.write_json(NAME, doc, args.results)
    png_path = plot(doc, args.results)
    rows = []
    if "fire_to_start_p50_ms" in doc:
        rows += [
            (
                "fire -> start p50 / p99 (LISTEN/NOTIFY)",
                f"{doc['fire_to_start_p50_ms']:.1f} / {doc['fire_to_start_p99_ms']:.1f} ms",
            ),
            (
                "fire -> start p50 / p99 (polling 0.5 s)",
                f"{doc['fire_to_start_polling_p50_ms']:.1f} / "
                f"{doc['fire_to_start_polling_p99_ms']:.1f} ms",
            ),
        ]
    rows += [
        (f"tasks/s, {k} worker(s)", f"{v:,.0f}") for k, v in doc.get("tasks_per_s", {}).items()
    ]
    rows += [
        (f"claims/s, {k} process(es)", f"{v:,.0f}") for k, v in doc.get("claims_per_s", {}).items()
    ]
    for m in detail.get("many_hosts_runs", []):
        rows += [
            (
                f"deferrals/s ({m['workers']} workers x {m['slots_per_worker']} slots)",
                f"{m['defers_per_s']:,.0f}",
            ),
            (
                f"burst of {m['waits']:,}: last file -> last fired",
                f"{m['all_fired_s']:.2f} s (interval {m['interval_s']:g} s)",
            ),
            (
                "  CPU s while deferring: workers / triggerers",
                f"{m['defer_cpu_s']['workers']:.1f} / {m['defer_cpu_s']['triggerers']:.1f}",
            ),
            ("  per task p50 / p99", f"{m['delay_p50_s']:.2f} / {m['delay_p99_s']:.2f} s"),
            ("  first fire -> last fire", f"{m['fires_spread_s']:.2f} s"),
            ("  last file -> run ended", f"{m['run_ended_s']:.2f} s"),
        ]
    rows += calibration.repeat_rows(doc["repeats"])
    rows.append(calibration.calibration_row(doc["calibration"]))
    rows.append(common.load_row(rec.load))
    common.print_table("PostgreSQL", rows, caption=f"{json_path}\n{png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
