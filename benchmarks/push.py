"""Push instead of polling: how soon a pushed wait wakes, and what an idle wait costs.

* files - ``--files`` FileTrigger waits (one file each, over ``--dirs`` directories) on a
  ``--interval`` poll interval, deferred by a real Worker and held by a real Triggerer on
  a SQLite file. Once every inotify watch is live, another process writes all the files
  in one burst and notes when it closed each; a file's latency is from its close to the
  moment its task went DEFERRED -> PENDING (the task_event row).
* s3 - ``--s3-waits`` S3KeyTrigger waits over ``--prefixes`` prefixes of one bucket on
  moto's server (its own process), the bucket publishing ObjectCreated notifications to
  an SQS queue that the connection names (``events_queue``). Idle: the S3 and SQS
  requests made during ``--idle`` seconds once the consumer is live (the safety poll is
  ``--safety`` seconds, so an idle minute holds exactly one). Then another process puts
  every object (8 threads) and notes when each put returned; latency is from there to
  PENDING.

Writes benchmarks/results/push.json and push.png:

    python -m benchmarks.push [--files 1000] [--dirs 10] [--interval 60]
                              [--s3-waits 10000] [--prefixes 10] [--safety 60] [--idle 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote

from benchmarks import calibration
from benchmarks.common import (
    load_row,
    percentile,
    print_table,
    result_document,
    save_figure,
    subplots,
    write_json,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.exchanging import run_counts  # noqa: E402

from benchmarks.batching import MotoProcess  # noqa: E402

DAY = date(2024, 1, 2)


def _load_note(summary: dict[str, Any]) -> str:
    """What the JSON's reader should know of the machine: said from what was measured."""
    busy = summary.get("other_processes_cpus_busy") or 0.0
    if busy > 0.2:
        return (
            f"other processes kept {busy:.2f} of the 2 CPUs busy while this ran "
            "(see machine_load): latencies include their noise"
        )
    return f"quiet machine: other processes kept {busy:.2f} CPUs busy (see machine_load)"


def _waits_dag(dag_id: str, make: Any) -> Any:
    from executor import DAG

    dag = DAG(dag_id)

    @dag.task
    def items(ctx):
        return [str(i) for i in range(make.n)]

    @dag.task(expand=items)
    def wait(ctx):
        ctx.defer(make(int(ctx.item)), method="done", timeout=3600)

    @wait.method
    def done(ctx):
        return None

    return dag


def _pending_times(db: Path, run_id: str) -> dict[int, float]:
    """map_index -> when the wait went DEFERRED -> PENDING."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT t.map_index, MIN(e.ts) FROM task t JOIN task_event e ON e.task_row = t.id "
            "WHERE t.run_id = ? AND t.task_id = 'wait' AND t.map_index >= 0 "
            "AND e.from_state = 'DEFERRED' AND e.to_state = 'PENDING' GROUP BY t.map_index",
            (run_id,),
        ).fetchall()
    return {int(i): float(ts) for i, ts in rows}


def _summary(latencies: list[float]) -> dict[str, Any]:
    xs = sorted(latencies)
    return {
        "n": len(xs),
        "p50_s": round(percentile(xs, 50), 4),
        "p90_s": round(percentile(xs, 90), 4),
        "p99_s": round(percentile(xs, 99), 4),
        "max_s": round(xs[-1], 4) if xs else None,
    }


async def _serve(store: Any, dag: Any, config: Any) -> tuple[Any, Any, list[asyncio.Task]]:
    from executor.worker import Worker
    from triggerer.service import Triggerer

    triggerer = Triggerer(store.views, config=config)
    worker = Worker(
        store, slots=32, dags={dag.dag_id: dag}, poll_interval=0.05, on_defer=triggerer.poke
    )
    tasks = [asyncio.create_task(triggerer.run()), asyncio.create_task(worker.run())]
    return triggerer, worker, tasks


def _record_pushes(triggerer: Any) -> dict[str, float]:
    """When the triggerer first heard of each topic (wraps the hub's push: measuring only)."""
    heard: dict[str, float] = {}
    hub = triggerer.push
    real = hub._push

    def push(held: Any, topics: Any) -> None:
        topics = list(topics)
        now = time.time()
        for t in topics:
            if t is not None and t not in heard:
                heard[t] = now
        real(held, topics)

    hub._push = push
    return heard


async def _until(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def files_benchmark(n: int, dirs: int, interval: float, tmp: Path) -> dict[str, Any]:
    from executor.store import open_store
    from triggerer.service import TriggererConfig
    from triggers.files import FileTrigger

    root = tmp / "landing"
    paths = [str(root / f"d{i % dirs:02d}" / f"f{i:05d}.csv") for i in range(n)]
    for d in range(dirs):
        (root / f"d{d:02d}").mkdir(parents=True)

    def make(i: int) -> FileTrigger:
        return FileTrigger(path=paths[i], poke_interval=interval)

    make.n = n  # type: ignore[attr-defined]
    dag = _waits_dag("push_files_bench", make)
    db = tmp / "files.db"
    store = await open_store(f"sqlite:///{db}")
    config = TriggererConfig(lease_every=0.5, sync_every=0.2, push=True)
    triggerer, worker, tasks = await _serve(store, dag, config)
    try:
        run_id = await store.runs.create_run(dag, DAY)
        t0 = time.perf_counter()

        async def all_deferred() -> bool:
            return (await run_counts(store, run_id)).get("DEFERRED", 0) >= n

        await _until(all_deferred, 600, "every file wait deferred")
        deferred_s = time.perf_counter() - t0

        async def live() -> bool:
            s = triggerer.push.sources
            return len(s) == dirs and all(s.values())

        await _until(live, 60, "every watch live")
        await asyncio.sleep(1.0)  # the checks the watches' start asked for are done
        checks_before = triggerer.checks_done
        # The burst, from another process: writes each file, notes when it closed it.
        writer = textwrap.dedent(
            """
            import json, sys, time
            out = {}
            for i, p in enumerate(json.load(sys.stdin)):
                with open(p, "w") as f:
                    f.write("x")
                out[i] = time.time()
            print(json.dumps(out))
            """
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            writer,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        stdout, _ = await proc.communicate(json.dumps(paths).encode())
        closed = {int(k): v for k, v in json.loads(stdout).items()}

        async def all_woken() -> bool:
            return (await run_counts(store, run_id)).get("DEFERRED", 0) == 0

        await _until(all_woken, 600, "every file wait woken")
        pending = _pending_times(db, run_id)
        lat = [pending[i] - closed[i] for i in range(n)]
        return {
            "waits": n,
            "directories": dirs,
            "interval_s": interval,
            "watches": dirs,
            "seconds_until_all_deferred": round(deferred_s, 2),
            "burst_s": round(max(closed.values()) - min(closed.values()), 3),
            "checks_during_burst": triggerer.checks_done - checks_before,
            "closed_to_pending": _summary(lat),
            "latencies_s": [round(x, 4) for x in lat],
        }
    finally:
        worker.stop()
        triggerer.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()


async def s3_benchmark(
    n: int, prefixes: int, interval: float, safety: float, idle: float, tmp: Path
) -> dict[str, Any]:
    import boto3

    from executor.store import open_store
    from triggerer.service import TriggererConfig
    from triggers.s3 import S3KeyTrigger

    bucket, queue = "push-bench", "push-bench-events"
    keys = [f"landing/p{i % prefixes:02d}/obj-{i:05d}.csv" for i in range(n)]
    with MotoProcess() as moto:
        creds = {
            "endpoint_url": moto.endpoint,
            "aws_access_key_id": "bench",
            "aws_secret_access_key": "bench",
            "region_name": "us-east-1",
        }
        s3 = boto3.client("s3", **creds)
        sqs = boto3.client("sqs", **creds)
        s3.create_bucket(Bucket=bucket)
        url = sqs.create_queue(QueueName=queue)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "QueueConfigurations": [
                    {"QueueArn": arn["Attributes"]["QueueArn"], "Events": ["s3:ObjectCreated:*"]}
                ]
            },
        )
        sqs.purge_queue(QueueUrl=url)
        import os

        os.environ["SLOTLESS_CONN_BENCH_S3E"] = (
            f"s3://bench:bench@?endpoint_url={quote(moto.endpoint, safe='')}"
            f"&region_name=us-east-1&events_queue={quote(url, safe='')}"
        )

        def make(i: int) -> S3KeyTrigger:
            return S3KeyTrigger(
                bucket=bucket, key=keys[i], conn_id="bench_s3e", poke_interval=interval
            )

        make.n = n  # type: ignore[attr-defined]
        dag = _waits_dag("push_s3_bench", make)
        db = tmp / "s3.db"
        store = await open_store(f"sqlite:///{db}")
        config = TriggererConfig(
            lease_every=0.5, sync_every=0.2, push=True, push_safety_interval=safety
        )
        triggerer, worker, tasks = await _serve(store, dag, config)
        try:
            run_id = await store.runs.create_run(dag, DAY)
            t0 = time.perf_counter()

            async def all_deferred() -> bool:
                return (await run_counts(store, run_id)).get("DEFERRED", 0) >= n

            await _until(all_deferred, 900, "every S3 wait deferred")
            deferred_s = time.perf_counter() - t0

            async def live() -> bool:
                return any(triggerer.push.sources.values())

            await _until(live, 60, "the queue consumer live")
            heard = _record_pushes(triggerer)
            await asyncio.sleep(5.0)  # the checks the consumer's start asked for are done
            moto.reset()
            await asyncio.sleep(idle)
            counts = moto.counts()
            sqs_requests = sum(v for k, v in counts.items() if k.startswith("sqs:"))
            s3_requests = sum(v for k, v in counts.items() if not k.startswith("sqs:"))
            per_minute = 60.0 / idle
            checks_before = triggerer.checks_done
            putter = textwrap.dedent(
                """
                import json, sys, time, boto3
                from concurrent.futures import ThreadPoolExecutor
                spec = json.load(sys.stdin)
                s3 = boto3.client("s3", **spec["creds"])
                def put(i):
                    s3.put_object(Bucket=spec["bucket"], Key=spec["keys"][i], Body=b"x")
                    return i, time.time()
                with ThreadPoolExecutor(8) as pool:
                    out = dict(pool.map(put, range(len(spec["keys"]))))
                print(json.dumps(out))
                """
            )
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", putter, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            spec = {"creds": creds, "bucket": bucket, "keys": keys}
            stdout, _ = await proc.communicate(json.dumps(spec).encode())
            put_at = {int(k): v for k, v in json.loads(stdout).items()}

            async def all_woken() -> bool:
                return (await run_counts(store, run_id)).get("DEFERRED", 0) == 0

            await _until(all_woken, 900, "every S3 wait woken")
            pending = _pending_times(db, run_id)
            lat = [pending[i] - put_at[i] for i in range(n)]
            to_push = [
                heard[f"{bucket}/{keys[i]}"] - put_at[i]
                for i in range(n)
                if f"{bucket}/{keys[i]}" in heard
            ]
            after = moto.counts()
            return {
                "waits": n,
                "prefixes": prefixes,
                "interval_s": interval,
                "safety_interval_s": safety,
                "seconds_until_all_deferred": round(deferred_s, 2),
                "idle_window_s": idle,
                "idle_requests_by_operation": counts,
                "s3_requests_per_idle_minute": round(s3_requests * per_minute, 1),
                "sqs_requests_per_idle_minute": round(sqs_requests * per_minute, 1),
                "puts_s": round(max(put_at.values()) - min(put_at.values()), 2),
                "checks_during_puts": triggerer.checks_done - checks_before,
                "s3_lists_during_puts": after.get("ListObjectsV2", 0)
                - counts.get("ListObjectsV2", 0),
                "put_to_pending": _summary(lat),
                "put_to_consumer_heard": _summary(to_push),
                "latencies_s": [round(x, 4) for x in lat],
            }
        finally:
            worker.stop()
            triggerer.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await store.close()


def plot(doc: dict[str, Any]) -> Path:
    fig, (ax1, ax2) = subplots(2, width=6.0)
    for ax, part, label in (
        (ax1, doc["files"], "file closed -> task PENDING"),
        (ax2, doc["s3"], "object put -> task PENDING"),
    ):
        if part is None:
            ax.set_visible(False)
            continue
        xs = sorted(x * 1000 for x in part.pop("latencies_s"))
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.plot(xs, ys)
        key = "closed_to_pending" if "closed_to_pending" in part else "put_to_pending"
        p99 = part[key]["p99_s"] * 1000
        ax.axvline(p99, linestyle="--", color="grey")
        ax.set_title(f"{label}\n{part['waits']:,} waits, p99 {p99:.0f} ms", fontsize=10)
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of waits")
        ax.grid(alpha=0.3)
    fig.suptitle("Push instead of polling. " + calibration.caption(doc), fontsize=9)
    return save_figure(fig, "push")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="slotless-push-") as tmp:
        files = None
        s3 = None
        if args.files:
            files = await files_benchmark(args.files, args.dirs, args.interval, Path(tmp))
        if args.s3_waits:
            s3 = await s3_benchmark(
                args.s3_waits, args.prefixes, args.interval, args.safety, args.idle, Path(tmp)
            )
    return {"files": files, "s3": s3}


def headline(parts: dict[str, Any]) -> dict[str, float | None]:
    """One run's headline figures."""
    f, s = parts["files"], parts["s3"]
    return {
        "file_push_p50_s": f["closed_to_pending"]["p50_s"] if f else None,
        "file_push_p99_s": f["closed_to_pending"]["p99_s"] if f else None,
        "s3_push_p50_s": s["put_to_pending"]["p50_s"] if s else None,
        "s3_push_p99_s": s["put_to_pending"]["p99_s"] if s else None,
        "s3_requests_per_idle_minute": s["s3_requests_per_idle_minute"] if s else None,
        "sqs_requests_per_idle_minute": s["sqs_requests_per_idle_minute"] if s else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--dirs", type=int, default=10)
    p.add_argument("--interval", type=float, default=60.0)
    p.add_argument("--s3-waits", type=int, default=10000)
    p.add_argument("--prefixes", type=int, default=10)
    p.add_argument("--safety", type=float, default=60.0)
    p.add_argument("--idle", type=float, default=60.0)
    calibration.add_repeats_argument(p)
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    with calibration.Recording(Path(tempfile.gettempdir())) as rec:
        outs = rec.repeat(args.repeats, lambda i: asyncio.run(main_async(args)), headline)
    # The run with the median file latency (else S3's) gives the details and the plot;
    # each headline figure is its median over the runs.
    parts = outs[rec.kept("file_push_p99_s" if args.files else "s3_push_p99_s")]
    doc = result_document("push", argv, vars(args), REPO)
    doc["note"] = _load_note(rec.load)
    doc["machine_load"] = rec.load
    doc.update(parts)
    doc.update(rec.medians())
    doc.update(rec.fields())
    png = plot(doc)  # takes the raw latencies out of the document
    path = write_json("push", doc)
    rows = [
        (
            "file closed -> PENDING p50 / p99",
            f"{doc['file_push_p50_s']} / {doc['file_push_p99_s']} s",
        ),
        ("object put -> PENDING p50 / p99", f"{doc['s3_push_p50_s']} / {doc['s3_push_p99_s']} s"),
        ("S3 requests per idle minute", str(doc["s3_requests_per_idle_minute"])),
        ("SQS requests per idle minute", str(doc["sqs_requests_per_idle_minute"])),
        *calibration.repeat_rows(doc["repeats"]),
        calibration.calibration_row(doc["calibration"]),
        load_row(rec.load),
    ]
    print_table("push", rows, caption=f"{path} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
