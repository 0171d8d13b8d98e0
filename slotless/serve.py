"""The long-running processes: ``slotless worker | triggerer | ui | up``.

A worker and a triggerer serve the same way: Prometheus metrics on ``--metrics-port``,
the DAG folder (``--dags`` or $SLOTLESS_DAGS) kept in the catalogue, until SIGTERM or
Ctrl-C; :func:`_serve` is that once. The page (:mod:`.web`) and ``up`` (:mod:`.up`) are
imported when their command runs: aiohttp alone is a fifth of a second of every other
command's start otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from executor.catalogue import dags_folder, keep_scanning
from executor.pools import parse_queues
from executor.store import Store, open_store
from executor.worker import Worker

from .opening import open_writable
from .options import (
    dags_opts,
    db_opt,
    duration,
    isolation_opt,
    metrics_opts,
    slots,
    token_opt,
    ui_tokens,
)

if TYPE_CHECKING:
    from executor.metrics import MetricsServer


def add_commands(sub: Any) -> None:
    worker = sub.add_parser("worker", help="serve as a worker: claim and run tasks of any run")
    db_opt(worker)
    worker.add_argument("--slots", type=slots, default=8)
    isolation_opt(worker)
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
    metrics_opts(worker)
    dags_opts(worker)
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
        type=duration,
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
    metrics_opts(trig)
    dags_opts(trig)
    trig.set_defaults(func=cmd_triggerer)

    ui = sub.add_parser(
        "ui", help="serve the web page of runs, tasks and their logs (read-only without --token)"
    )
    db_opt(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=8765)
    ui.add_argument("--refresh", type=float, default=2.0, help="seconds between live refreshes")
    token_opt(ui)
    dags_opts(ui)
    ui.set_defaults(func=cmd_ui)

    up = sub.add_parser(
        "up", help="a worker, a triggerer and the web page on one database; Ctrl-C stops all"
    )
    up.add_argument("files", nargs="*", metavar="DAG_FILE", help="start one run of each")
    db_opt(up)
    up.add_argument("--slots", type=slots, default=8)
    isolation_opt(up)
    up.add_argument("--host", default="127.0.0.1", help="the web page's address")
    up.add_argument("--port", type=int, default=8765, help="the web page's port")
    token_opt(up)
    up.add_argument("--worker-metrics-port", type=int, default=None)
    up.add_argument("--triggerer-metrics-port", type=int, default=None)
    dags_opts(up)
    up.set_defaults(func=cmd_up)


async def cmd_worker(args: argparse.Namespace) -> int:
    queues = parse_queues(args.queues)
    store = await open_writable(args.db)
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
    from executor.metrics import worker_metrics

    metrics = worker_metrics(worker, args.metrics_host, args.metrics_port)
    return await _serve("worker", store, args, metrics, worker.run, worker.stop)


async def cmd_triggerer(args: argparse.Namespace) -> int:
    from triggerer.metrics import triggerer_metrics
    from triggerer.service import Triggerer, TriggererConfig

    store = await open_writable(args.db)
    if args.push_safety_interval <= 0:
        await store.close()
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
    metrics = triggerer_metrics(triggerer, args.metrics_host, args.metrics_port)
    return await _serve("triggerer", store, args, metrics, triggerer.run, triggerer.stop)


async def _serve(
    name: str,
    store: Store,
    args: argparse.Namespace,
    metrics: AbstractAsyncContextManager[MetricsServer | None],
    run: Callable[[], Awaitable[None]],
    stop: Callable[[], None],
) -> int:
    """Run a worker or a triggerer until a signal stops it, with its metrics endpoint and
    the catalogue scan alongside; the store is closed whatever happens."""
    _on_signals(stop)
    try:
        async with metrics as served:
            if served is not None:
                print(f"slotless {name}: metrics on {served.url}", file=sys.stderr, flush=True)
            async with scanning(name, store, args):
                await run()
    finally:
        await store.close()
    return 0


@contextlib.asynccontextmanager
async def scanning(name: str, store: Store, args: argparse.Namespace) -> AsyncIterator[None]:
    """Keep the catalogue up to date with ``--dags DIR`` (or $SLOTLESS_DAGS) meanwhile."""
    folder = dags_folder(args.dags)
    if folder is None:
        yield
        return
    if not folder.is_dir():
        raise NotADirectoryError(f"DAG folder {folder} is not a directory")

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


def _on_signals(stop: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


async def cmd_ui(args: argparse.Namespace) -> int:
    from .web import serve_ui

    ui_tokens(args)  # a malformed token list is refused before the page starts
    if dags_folder(args.dags) is None:
        return await serve_ui(args)
    store = await open_store(args.db)
    try:
        async with scanning("ui", store, args):
            return await serve_ui(args)
    finally:
        await store.close()


async def cmd_up(args: argparse.Namespace) -> int:
    from .up import up

    ui_tokens(args)  # refused here, not by the page after the worker and triggerer started
    return await up(args)
