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

Target (issue 7): fire_to_start p99 under 100 ms with LISTEN/NOTIFY.
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

from . import common

NAME = "postgres"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
TARGET_P99_MS = 100.0
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
    while rows := await store.claim(owner, 10):
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
        await store.create_run(dag, DAY)
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
            run_id = await store.create_run(dag, DAY, dag_file=str(dag_file))
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
            run_id = await store.create_run(dag, DAY, dag_file=str(dag_file))
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
    out: dict[str, Any] = {"claims": [], "tasks": []}
    for k in counts:
        samples = []
        for i in range(args.repeat):
            common.console.print(f"claims with {k} process(es), {i + 1} of {args.repeat}")
            samples.append(await claims(args.dsn, folder, dag_file, k))
        out["claims"].append(median_of(samples, "claims_per_s"))
    for k in counts:
        samples = []
        for i in range(args.repeat):
            common.console.print(f"no-op tasks with {k} worker(s), {i + 1} of {args.repeat}")
            samples.append(await tasks(args.dsn, folder, dag_file, k, args.slots))
        out["tasks"].append(median_of(samples, "tasks_per_s"))
    for listen in (True, False):
        common.console.print(f"fire to start, {'LISTEN/NOTIFY' if listen else 'polling only'}")
        out["notify" if listen else "poll"] = await fire_to_start(
            args.dsn, folder, dag_file, inbox, args.fire_every, listen
        )
    return out


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
    fig, (ax1, ax2) = common.subplots(2)
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
    return common.save_figure(fig, NAME, results)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.claimer:
        asyncio.run(claimer(args.claimer, args.start_at))
        return 0
    with common.workdir(args.workdir, args.keep) as folder, common.MachineLoad() as load:
        detail = asyncio.run(main_async(args, folder))
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
        },
        common.REPO,
    )
    doc["server"] = server_facts(args.dsn)
    doc["load"] = load.summary
    doc["fire_to_start_p50_ms"] = detail["notify"]["p50_ms"]
    doc["fire_to_start_p99_ms"] = detail["notify"]["p99_ms"]
    doc["fire_to_start_target_p99_ms"] = TARGET_P99_MS
    doc["fire_to_start_polling_p50_ms"] = detail["poll"]["p50_ms"]
    doc["fire_to_start_polling_p99_ms"] = detail["poll"]["p99_ms"]
    doc["tasks_per_s"] = {str(t["workers"]): t["tasks_per_s"] for t in detail["tasks"]}
    doc["claims_per_s"] = {str(c["workers"]): c["claims_per_s"] for c in detail["claims"]}
    doc["detail"] = detail
    json_path = common.write_json(NAME, doc, args.results)
    png_path = plot(doc, args.results)
    rows = [
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
    rows += [(f"tasks/s, {k} worker(s)", f"{v:,.0f}") for k, v in doc["tasks_per_s"].items()]
    rows += [(f"claims/s, {k} process(es)", f"{v:,.0f}") for k, v in doc["claims_per_s"].items()]
    rows.append(common.load_row(load.summary))
    common.print_table("PostgreSQL", rows, caption=f"{json_path}\n{png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
