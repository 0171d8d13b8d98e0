"""The ``slotless`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from executor.catalogue import (
    DEFAULT_PARSE_TIMEOUT,
    DEFAULT_RESCAN,
    dags_folder,
    keep_scanning,
    scan,
)
from executor.dag import DagError
from executor.loader import DagImportError, load_dag
from executor.pools import DEFAULT as DEFAULT_QUEUE
from executor.pools import parse_queues
from executor.states import RUN_TERMINAL, RunState
from executor.store import SchemaTooNew, Store, open_store
from executor.store import UnknownBackend as _UnknownBackend
from executor.store.catalogue import UnknownDag
from executor.worker import Worker

from .control import add_commands as add_control_commands
from .events import add_commands as add_event_commands
from .pools import add_commands as add_pool_commands
from .respond import add_commands as add_respond_commands
from .schedule_shown import schedule_shown

USER_ERRORS = (
    DagImportError,
    DagError,
    UnknownDag,
    _UnknownBackend,
    SchemaTooNew,
    sqlite3.DatabaseError,
    ValueError,
    OSError,  # a missing file, a database server that does not answer
)

out = Console()
err = Console(stderr=True)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        code: int = _loop_runner()(args.func(args))
        _leave_stuck_task_threads(code)
        return code
    except USER_ERRORS as exc:
        print(f"slotless: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _leave_stuck_task_threads(code: int) -> None:
    """A task thread past its execution timeout cannot be stopped, and Python joins every
    thread at exit: once the command is done, exit without waiting for such a thread."""
    stuck = [t for t in threading.enumerate() if t.name.startswith("slot")]
    for t in stuck:
        t.join(0.2)
    if any(t.is_alive() for t in stuck):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _loop_runner() -> Any:
    """uvloop where installed (``pip install slotless[uvloop]``), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slotless", description=__doc__)
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    def db_opt(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--db", help="database URL (default: $SLOTLESS_DB or sqlite:///slotless.db)"
        )

    run = sub.add_parser("run", help="run a DAG file once, in this process, until it ends")
    run.add_argument("file")
    db_opt(run)
    run.add_argument("--dag", help="the DAG id, if the file defines several")
    run.add_argument("--slots", type=_slots, default=8)
    run.add_argument("--isolation", choices=["thread", "process"], default="thread")
    run.add_argument("--logical-date", type=_date, default=None, help="YYYY-MM-DD (default today)")
    run.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    run.set_defaults(func=cmd_run)

    worker = sub.add_parser("worker", help="serve as a worker: claim and run tasks of any run")
    db_opt(worker)
    worker.add_argument("--slots", type=_slots, default=8)
    worker.add_argument("--isolation", choices=["thread", "process"], default="thread")
    worker.add_argument("--poll-interval", type=float, default=0.5)
    worker.add_argument("--heartbeat-interval", type=float, default=5.0)
    worker.add_argument(
        "--stale-after",
        type=float,
        default=30.0,
        help="seconds without heartbeat after which a hung worker counts as dead (a killed "
        "one is noticed within a second or so: its liveness lock is released)",
    )
    worker.add_argument(
        "--queues",
        default="default",
        metavar="Q1,Q2",
        help="claim only tasks of these queues (default: default); declare others with "
        "slotless queues add",
    )
    _metrics_opts(worker)
    _dags_opts(worker)
    worker.set_defaults(func=cmd_worker)

    trig = sub.add_parser("triggerer", help="serve as a triggerer: hold and check deferred waits")
    db_opt(trig)
    trig.add_argument(
        "--lease-ttl",
        type=float,
        default=15.0,
        help="seconds after which a hung triggerer's shards are taken over (a killed one's "
        "are taken within a second or so: its liveness lock is released)",
    )
    trig.add_argument(
        "--reconcile-every",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="full reconcile with the rows, and orphan repair, this often (default 60)",
    )
    trig.add_argument(
        "--event-retention",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="how long events are kept, e.g. 7d (the default), 12h, 90s",
    )
    trig.add_argument(
        "--cleanup-every",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how often orphan trigger rows and old events are deleted",
    )
    # Push sources (docs/operations.md, "Push instead of polling").
    trig.add_argument(
        "--push-safety-interval",
        type=float,
        default=300.0,
        help="seconds between polls of a wait whose push source is live (missed pushes)",
    )
    trig.add_argument(
        "--push",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wake waits from push sources (inotify, SQS, NOTIFY); --no-push polls every wait",
    )
    _metrics_opts(trig)
    _dags_opts(trig)
    trig.set_defaults(func=cmd_triggerer)

    status = sub.add_parser(
        "status", help="runs by state; waiting tasks (what for, how long); triggerers"
    )
    db_opt(status)
    status.add_argument("--limit", type=int, default=20, help="runs, and tasks per waiting state")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    logs = sub.add_parser("logs", help="a task's log: transitions, log lines, errors")
    logs.add_argument("run_id")
    logs.add_argument("task_id", help="TASK or TASK[INDEX] for one instance of a mapped task")
    db_opt(logs)
    logs.set_defaults(func=cmd_logs)

    ui = sub.add_parser(
        "ui", help="serve the web page of runs, tasks and their logs (read-only without --token)"
    )
    db_opt(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=8765)
    ui.add_argument("--refresh", type=float, default=2.0, help="seconds between live refreshes")
    _token_opt(ui)
    _dags_opts(ui)
    ui.set_defaults(func=cmd_ui)

    up = sub.add_parser(
        "up", help="a worker, a triggerer and the web page on one database; Ctrl-C stops all"
    )
    up.add_argument("files", nargs="*", metavar="DAG_FILE", help="start one run of each")
    db_opt(up)
    up.add_argument("--slots", type=_slots, default=8)
    up.add_argument("--host", default="127.0.0.1", help="the web page's address")
    up.add_argument("--port", type=int, default=8765, help="the web page's port")
    _token_opt(up)
    up.add_argument("--worker-metrics-port", type=int, default=None)
    up.add_argument("--triggerer-metrics-port", type=int, default=None)
    _dags_opts(up)
    up.set_defaults(func=cmd_up)

    dags = sub.add_parser("dags", help="the DAG catalogue: list DAGs and broken files, pause")
    dags_sub = dags.add_subparsers(required=True, metavar="ACTION")
    dags_list = dags_sub.add_parser(
        "list", help="DAGs (paused, schedule, last run) and broken files with their errors"
    )
    db_opt(dags_list)
    dags_list.add_argument(
        "--dags",
        metavar="DIR",
        help="parse this folder's changed DAG files first (default: $SLOTLESS_DAGS, if set)",
    )
    dags_list.add_argument(
        "--parse-timeout",
        type=float,
        default=DEFAULT_PARSE_TIMEOUT,
        metavar="SECONDS",
        help=f"time limit to import one file (default {DEFAULT_PARSE_TIMEOUT:g})",
    )
    dags_list.add_argument("--json", action="store_true", help="print one JSON object")
    dags_list.set_defaults(func=cmd_dags_list)
    for action, paused in (("pause", True), ("unpause", False)):
        sp = dags_sub.add_parser(action, help=f"{action} a DAG (its runs are not touched)")
        sp.add_argument("dag_id", metavar="DAG")
        db_opt(sp)
        sp.set_defaults(func=cmd_dags_pause, paused=paused)

    trig_run = sub.add_parser(
        "trigger",
        help="start a run of a catalogued DAG for the running worker; once per --run-key",
    )
    trig_run.add_argument("dag_id", metavar="DAG")
    trig_run.add_argument("--logical-date", type=_date, help="YYYY-MM-DD (default today)")
    trig_run.add_argument("--conf", metavar="JSON", help="a JSON object, checked against params")
    trig_run.add_argument(
        "--run-key",
        metavar="KEY",
        help="at most one run per DAG and key (default: the date and a random part)",
    )
    trig_run.add_argument("--force", action="store_true", help="trigger a paused DAG anyway")
    db_opt(trig_run)
    trig_run.add_argument(
        "--dags", metavar="DIR", help="parse this folder's changed DAG files first"
    )
    trig_run.add_argument(
        "--parse-timeout",
        type=float,
        default=DEFAULT_PARSE_TIMEOUT,
        metavar="SECONDS",
        help=f"time limit to import the DAG's file (default {DEFAULT_PARSE_TIMEOUT:g})",
    )
    trig_run.add_argument("--json", action="store_true", help="print one JSON object")
    trig_run.set_defaults(func=cmd_trigger)

    back = sub.add_parser(
        "backfill",
        help="a run of a scheduled DAG for each past interval from --from to --to; follows them",
    )
    back.add_argument("dag_id", metavar="DAG")
    back.add_argument(
        "--from",
        dest="date_from",
        required=True,
        metavar="D1",
        help="the first logical date: YYYY-MM-DD or an ISO datetime, on the DAG's clock",
    )
    back.add_argument(
        "--to",
        dest="date_to",
        required=True,
        metavar="D2",
        help="the last logical date, included (a date: its whole day)",
    )
    back.add_argument(
        "--max-active",
        type=_slots,
        metavar="N",
        help="at most N of its runs at once, the rest wait queued (default: max_active_runs)",
    )
    back.add_argument(
        "--rerun-failed",
        action="store_true",
        help="a new run for each interval whose run ended FAILED (default: left alone)",
    )
    back.add_argument(
        "--no-wait", action="store_true", help="create the runs and exit, without following them"
    )
    back.add_argument("--json", action="store_true", help="print one JSON object")
    db_opt(back)
    back.add_argument("--dags", metavar="DIR", help="parse this folder's changed DAG files first")
    back.add_argument(
        "--parse-timeout",
        type=float,
        default=DEFAULT_PARSE_TIMEOUT,
        metavar="SECONDS",
        help=f"time limit to import one file (default {DEFAULT_PARSE_TIMEOUT:g})",
    )
    back.set_defaults(func=cmd_backfill)

    add_control_commands(sub, db_opt)
    add_event_commands(sub, db_opt)
    add_respond_commands(sub, db_opt)
    add_pool_commands(sub, db_opt)

    bench = sub.add_parser(
        "bench",
        help="run a benchmark (source checkout): JSON and PNG in benchmarks/results/",
        description="Run benchmarks/NAME.py; options after NAME go to the benchmark "
        "(slotless bench NAME --help lists them).",
    )
    bench.add_argument("name", choices=BENCHES)
    bench.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")
    bench.set_defaults(func=cmd_bench)
    return p


BENCHES = ("slots", "capacity", "dedup", "fanout", "throughput", "schedules", "events")


async def cmd_bench(args: argparse.Namespace) -> int:
    """``python -m benchmarks.NAME OPTIONS`` from the checkout this slotless runs from.

    A process of its own: each benchmark runs its own event loops (and subprocesses), and
    Ctrl-C reaches it directly.
    """
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / f"{args.name}.py").is_file():
        raise FileNotFoundError(
            f"slotless bench needs the source checkout: {root / 'benchmarks'} has no "
            f"{args.name}.py (benchmarks are not part of the installed package)"
        )
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        f"benchmarks.{args.name}",
        *args.options,
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
    )
    return await proc.wait()


def _metrics_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port"
    )
    sp.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")


def _slots(text: str) -> int:
    # Checked here, before a run is created: zero slots would leave it RUNNING forever.
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1: {text!r}")
    return n


def _duration(text: str) -> float:
    from executor.durations import seconds

    try:
        value = seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert value is not None
    return value


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None


async def cmd_run(args: argparse.Namespace) -> int:
    dag = load_dag(args.file, args.dag)
    dag.validate()
    store = await open_store(args.db)
    try:
        run_id = await store.runs.create_run(
            dag, args.logical_date or date.today(), dag_file=str(Path(args.file).resolve())
        )
        from triggerer.service import Triggerer

        triggerer = Triggerer(store.views)
        worker = Worker(
            store,
            slots=args.slots,
            isolation=args.isolation,
            dags={dag.dag_id: dag},
            poll_interval=0.05,
            on_defer=triggerer.poke,
            # This process runs the whole DAG: every queue it names (issue 14).
            queues=sorted({DEFAULT_QUEUE} | {t.queue for t in dag.tasks.values()}),
        )
        ended = asyncio.Event()
        view = None
        if not args.json and err.is_terminal:
            from .progress import follow

            # The live view goes to the terminal; a piped stdout keeps what tasks print.
            view = asyncio.create_task(
                follow(store, run_id, err, ended, redirect_stdout=out.is_terminal)
            )
        sidecar = asyncio.create_task(triggerer.run())
        try:
            await asyncio.gather(worker.run(), _watch(store, run_id, worker))
        finally:
            ended.set()
            if view is not None:
                await view
            triggerer.stop()
            await sidecar
        info = await store.views.run_info(run_id)
        assert info is not None
        tasks = await store.views.run_tasks(run_id)
        if args.json:
            print(
                json.dumps(
                    {
                        "dag_id": dag.dag_id,
                        "run_id": run_id,
                        "state": info["state"],
                        "tasks": {t["task_id"]: t["state"] for t in tasks},
                    }
                )
            )
        else:
            _summary(run_id, info, tasks, await store.views.mapped_counts(run_id))
            if info["state"] == RunState.PAUSED:
                print(f"{info['state_reason']}\ngo on with: slotless resume {run_id}")
        return 0 if info["state"] == "SUCCESS" else 1
    finally:
        await store.close()


async def _watch(store: Store, run_id: str, worker: Worker) -> None:
    """Stop the worker once the run has ended (or paused: on_task_failure="pause", it waits
    for a person) and its callbacks and notifications were delivered or given up (they are
    retried with backoff: docs/dag-patterns.md); what it holds is finished first."""
    settled = asyncio.Event()
    chained = worker.on_exchange

    def on_exchange(recorded: list[Any], claimed: list[Any]) -> None:
        if chained is not None:
            chained(recorded, claimed)
        # Outcomes recorded and nothing new to run: the run may have ended in that
        # transaction. Look now: waiting for the next poll was a tenth of a second at the
        # end of every run (an eighth of a 1,000-task chain's time).
        if recorded and not claimed:
            settled.set()

    worker.on_exchange = on_exchange
    while True:
        settled.clear()  # before the read: an exchange that ends the run meanwhile wakes us
        info = await store.views.run_info(run_id)
        if info is None or info["state"] in RUN_TERMINAL or info["state"] == RunState.PAUSED:
            callbacks = await store.callbacks.run_callbacks(run_id)
            if all(c["state"] in ("DONE", "FAILED") for c in callbacks):
                worker.stop()
                return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.25):
                await settled.wait()


def _summary(run_id: str, info: Any, tasks: list[Any], mapped: dict[str, dict[str, int]]) -> None:
    table = Table(title=f"{run_id}: {info['state']}")
    for col in ("task", "state", "attempts", "duration"):
        table.add_column(col)
    for t in tasks:
        state = t["state"]
        if t["task_id"] in mapped:
            state += (
                " ("
                + ", ".join(f"{n} {s.lower()}" for s, n in sorted(mapped[t["task_id"]].items()))
                + ")"
            )
        dur = ""
        if t["started_at"] and t["ended_at"]:
            dur = f"{t['ended_at'] - t['started_at']:.2f} s"
        table.add_row(t["task_id"], state, str(t["attempt"]), dur)
    out.print(table)


async def cmd_worker(args: argparse.Namespace) -> int:
    queues = parse_queues(args.queues)
    store = await open_store(args.db)
    try:
        await store.pools.check_queues(queues)
    except Exception:
        await store.close()
        raise
    worker = Worker(
        store,
        slots=args.slots,
        isolation=args.isolation,
        poll_interval=args.poll_interval,
        heartbeat_interval=args.heartbeat_interval,
        stale_after=args.stale_after,
        queues=queues,
        dag_import_timeout=args.parse_timeout,
    )
    _on_signals(worker.stop)
    try:
        from executor.metrics import worker_metrics

        async with worker_metrics(worker, args.metrics_host, args.metrics_port) as metrics:
            if metrics is not None:
                print(f"slotless worker: metrics on {metrics.url}", file=sys.stderr, flush=True)
            async with _scanning(store, args):
                await worker.run()
    finally:
        await store.close()
    return 0


async def cmd_triggerer(args: argparse.Namespace) -> int:
    from triggerer.service import Triggerer, TriggererConfig

    store = await open_store(args.db)
    if args.push_safety_interval <= 0:
        print("slotless triggerer: --push-safety-interval must be > 0", file=sys.stderr)
        return 2
    config = TriggererConfig(
        lease_ttl=args.lease_ttl,
        lease_every=max(0.2, args.lease_ttl / 5),
        reload_every=args.reconcile_every,
        cleanup_every=args.cleanup_every,
        push=args.push,
        push_safety_interval=args.push_safety_interval,
    )
    if args.event_retention is not None:
        config.event_retention = args.event_retention
    triggerer = Triggerer(store.views, config=config)
    _on_signals(triggerer.stop)
    try:
        from triggerer.metrics import triggerer_metrics

        async with triggerer_metrics(triggerer, args.metrics_host, args.metrics_port) as metrics:
            if metrics is not None:
                print(f"slotless triggerer: metrics on {metrics.url}", file=sys.stderr, flush=True)
            async with _scanning(store, args):
                await triggerer.run()
    finally:
        await store.close()
    return 0


@contextlib.asynccontextmanager
async def _scanning(store: Store, args: argparse.Namespace) -> AsyncIterator[None]:
    """Keep the catalogue up to date with ``--dags DIR`` (or $SLOTLESS_DAGS) meanwhile."""
    folder = dags_folder(args.dags)
    if folder is None:
        yield
        return
    if not folder.is_dir():
        raise NotADirectoryError(f"DAG folder {folder} is not a directory")
    name = args.func.__name__.removeprefix("cmd_")

    def say(line: str) -> None:
        print(f"slotless {name}: {line}", file=sys.stderr, flush=True)

    task = asyncio.create_task(
        keep_scanning(store, folder, every=args.rescan, timeout=args.parse_timeout, say=say)
    )
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _token_opt(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--token",
        default=None,
        help="let an operator who signs in with this token pause and trigger DAGs from the web "
        "page, and allow writes through the JSON API (Authorization: Bearer TOKEN); a "
        "comma-separated list of NAME:TOKEN pairs names who wrote (default: "
        "$SLOTLESS_UI_TOKEN; without one the page and the API are read-only). The "
        "environment variable keeps it out of the process list",
    )


def _dags_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--dags",
        metavar="DIR",
        help="keep the DAG catalogue up to date with this folder (default: $SLOTLESS_DAGS)",
    )
    sp.add_argument(
        "--rescan",
        type=float,
        default=DEFAULT_RESCAN,
        metavar="SECONDS",
        help=f"how often to look for changed DAG files (default {DEFAULT_RESCAN:g})",
    )
    sp.add_argument(
        "--parse-timeout",
        type=float,
        default=DEFAULT_PARSE_TIMEOUT,
        metavar="SECONDS",
        help=f"time limit to import one file (default {DEFAULT_PARSE_TIMEOUT:g})",
    )


def _on_signals(stop: Any) -> None:
    import signal

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


async def cmd_status(args: argparse.Namespace) -> int:
    from .status import status_command

    return await status_command(args)


async def cmd_trigger(args: argparse.Namespace) -> int:
    from .trigger import trigger_command

    return await trigger_command(args)


async def cmd_backfill(args: argparse.Namespace) -> int:
    from .backfill import backfill_command

    return await backfill_command(args)


async def cmd_ui(args: argparse.Namespace) -> int:
    from .web import serve_ui

    if dags_folder(args.dags) is None:
        return await serve_ui(args)
    store = await open_store(args.db)
    try:
        async with _scanning(store, args):
            return await serve_ui(args)
    finally:
        await store.close()


async def cmd_up(args: argparse.Namespace) -> int:
    from .up import up

    return await up(args)


async def cmd_dags_list(args: argparse.Namespace) -> int:
    folder = dags_folder(args.dags)
    # Without a folder to parse this only reads: a mistyped --db must not leave a new file.
    store = await open_store(args.db, create=folder is not None)
    try:
        if folder is not None:
            await scan(store, folder, timeout=args.parse_timeout)
        dags = await store.catalogue.catalogue_dags()
        broken = await store.catalogue.broken_files()
    finally:
        await store.close()
    if args.json:
        print(
            json.dumps(
                {
                    "dags": [
                        {k: d[k] for k in _DAG_FIELDS}
                        | {"paused": bool(d["paused"]), **schedule_shown(d)}
                        for d in dags
                    ],
                    "broken_files": [
                        {"file": b["path"], "error": b["parse_error"]} for b in broken
                    ],
                }
            )
        )
        return 0
    table = Table(title=f"{len(dags)} DAGs")
    for col in ("dag", "file", "paused", "schedule", "next run", "last run"):
        table.add_column(col, overflow="fold")
    for d in dags:
        last = d["last_run_state"] or "-"
        if d["parse_error"]:
            last += " (file broken, see below)"
        if d["start_error"]:
            last += f"; cannot start: {d['start_error']}"
        shown = schedule_shown(d)
        starts = shown["schedule_words"] or "-"
        if d["waiting_for"]:
            starts += f"; when {d['waiting_for']}"
        table.add_row(
            d["dag_id"],
            d["file"],
            "yes" if d["paused"] else "no",
            starts,
            shown["next_run"] or "-",
            last,
        )
    out.print(table)
    if broken:
        errors = Table(title=f"{len(broken)} broken DAG files")
        errors.add_column("file")
        errors.add_column("error", overflow="fold")
        for b in broken:
            errors.add_row(b["path"], b["parse_error"])
        out.print(errors)
    return 0


_DAG_FIELDS = (
    "dag_id", "file", "schedule", "timezone", "next_logical_date", "parse_error", "last_run_state",
    "waiting_for", "start_error",
)  # fmt: skip


async def cmd_dags_pause(args: argparse.Namespace) -> int:
    store = await open_store(args.db, create=False)
    try:
        await store.catalogue.set_paused(args.dag_id, args.paused)
    finally:
        await store.close()
    print(f"{args.dag_id}: {'paused' if args.paused else 'unpaused'}")
    return 0


async def cmd_logs(args: argparse.Namespace) -> int:
    task_id, map_index = args.task_id, -1
    if task_id.endswith("]") and "[" in task_id:
        task_id, _, idx = task_id[:-1].partition("[")
        map_index = int(idx)
    store = await open_store(args.db, create=False)
    try:
        events = await store.views.task_log(args.run_id, task_id, map_index)
    finally:
        await store.close()
    if events is None:
        print(f"slotless: error: no task {args.task_id!r} in run {args.run_id!r}", file=sys.stderr)
        return 2
    for e in events:
        ts = datetime.fromtimestamp(e["ts"]).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        if e["kind"] == "transition":
            line = f"{e['from_state']} -> {e['to_state']}: {e['message']}"
        else:
            line = e["message"]
        print(f"{ts} [attempt {e['attempt']}] {e['kind']:<10} {line}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
