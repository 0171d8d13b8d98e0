"""Running ``slotless airflow-triggerer``: checks at start, signals, metrics, the engine."""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from executor.metrics import MetricsServer
from triggers.airflow import airflow_trigger_class
from triggers.context import to_thread

from ..watchdog import LoopWatch
from . import boot, comms, status, tasklogs
from .engine import Engine
from .plans import DATETIME
from .rows import AirflowRows

log = logging.getLogger("slotless.airflow")


async def serve(
    *,
    capacity: int,
    interval: float,
    queues: set[str] | None = None,
    metrics_host: str = "127.0.0.1",
    metrics_port: int | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT; 2 (after one line on stderr) when it cannot start."""
    _log_to_stderr()
    # What Airflow's own triggerer process declares (its supervisor; its runner subprocess
    # asks the supervisor instead): Airflow's secrets backends then include its connection
    # table, so a trigger's hook finds connections stored there. This process is both.
    os.environ.setdefault("_AIRFLOW_PROCESS_CONTEXT", "server")
    try:
        version = await to_thread(boot.import_airflow)
        await to_thread(boot.check_database)
        await to_thread(boot.check_select_limit)
        if queues:
            await to_thread(boot.check_queues_enabled)
        await to_thread(_preload)
        # Airflow's triggerer supervisor answers its triggers' Task SDK calls; here, this.
        await to_thread(comms.install)
        # An adapted trigger's own lines, copied to its task instances' trigger logs (after
        # everything that may configure Airflow's logging, which would drop it).
        tasklogs.capture_trigger_lines()
    except boot.Refused as refused:
        print(f"slotless: error: {refused}", file=sys.stderr, flush=True)
        return 2
    rows = await to_thread(AirflowRows, capacity, queues)
    engine = Engine(rows, interval=interval)
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        # As Airflow's triggerer: the first signal stops cleanly, a second one at once.
        if engine.stopping.is_set():
            log.warning("second signal: exiting now, without waiting for cleanup")
            os._exit(1)
        engine.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    server = None
    if metrics_port is not None:
        registry = CollectorRegistry()
        registry.register(EngineCollector(engine))
        server = MetricsServer(
            registry,
            metrics_host,
            metrics_port,
            routes={"/status": functools.partial(_status, engine)},
        )
        await server.start()
    log.info("serving Airflow %s's triggers (capacity %d)", version, capacity)
    # The triggerer's loop watchdog: a trigger that blocks the loop is logged, with where.
    watching = asyncio.create_task(LoopWatch().run())
    try:
        await engine.run()
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        if server is not None:
            await server.stop()
    return 0


async def _status(engine: Engine, request: web.Request) -> web.Response:
    """What this instance holds, grouped by check (``slotless status --airflow``)."""
    try:
        checks = status.bounded(request.query.get("checks"), status.CHECKS_SHOWN)
        tasks = status.bounded(request.query.get("tasks"), status.TASKS_SHOWN)
    except ValueError:
        return web.json_response(
            {"error": "checks and tasks must be whole numbers, e.g. /status?checks=100&tasks=5"},
            status=400,
        )
    return web.json_response(status.snapshot(engine, checks=checks, tasks=tasks))


def _preload() -> None:
    """The natively checked classes' module, imported before the loop needs it (a native
    timer builds Airflow's DateTimeTrigger for its payload)."""
    if importlib.util.find_spec("airflow.providers.standard") is not None:
        airflow_trigger_class(DATETIME)
    if importlib.util.find_spec("greenback") is not None:
        importlib.import_module("greenback")  # here, not on the loop at the first trigger


def _log_to_stderr() -> None:
    """This process's own lines (and the loop watchdog's) at INFO on stderr, whatever
    Airflow's logging config does to the root logger."""
    for name in ("slotless.airflow", "slotless.triggerer"):
        logger = logging.getLogger(name)
        if logger.handlers:
            continue
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


class EngineCollector(Collector):
    """What the engine holds and has done, read at each scrape."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        held = GaugeMetricFamily(
            "slotless_airflow_triggers",
            "Airflow trigger rows checked here (whichever slotless instance Airflow "
            "assigned them to)",
        )
        held.add_metric([], len(e.member))
        yield held
        assigned = GaugeMetricFamily(
            "slotless_airflow_assigned",
            "Airflow trigger rows Airflow assigns to this instance's TriggererJob",
        )
        assigned.add_metric([], len(e.assigned))
        yield assigned
        live = GaugeMetricFamily(
            "slotless_airflow_instances",
            "live slotless instances sharing the conditions (this one included)",
        )
        live.add_metric([], len(e.live))
        yield live
        by_dag = GaugeMetricFamily(
            "slotless_airflow_waiting",
            "task instances waiting on a trigger held here, by DAG",
            labels=["dag_id"],
        )
        counts: dict[str, int] = {}
        for group in list(e.groups.values()):
            for row in list(group.rows.values()):
                if row.dag_id is not None:
                    counts[row.dag_id] = counts.get(row.dag_id, 0) + 1
        for dag_id, n in sorted(counts.items()):
            by_dag.add_metric([dag_id], n)
        yield by_dag
        by_class = GaugeMetricFamily(
            "slotless_airflow_waiting_by_class",
            "task instances waiting on a trigger held here, by DAG and trigger class",
            labels=["dag_id", "classpath"],
        )
        classes = GaugeMetricFamily(
            "slotless_airflow_checks_by_class",
            "distinct checks held, by trigger class",
            labels=["classpath"],
        )
        oldest = GaugeMetricFamily(
            "slotless_airflow_oldest_wait_seconds",
            "seconds since the oldest deferral still waiting on a trigger held here, by DAG",
            labels=["dag_id"],
        )
        pairs: dict[tuple[str, str], int] = {}
        per_class: dict[str, int] = {}
        first: dict[str, float] = {}
        for group in list(e.groups.values()):
            per_class[group.classpath] = per_class.get(group.classpath, 0) + 1
            for row in list(group.rows.values()):
                if row.dag_id is None:
                    continue
                pair = (row.dag_id, group.classpath)
                pairs[pair] = pairs.get(pair, 0) + 1
                if row.since is not None and row.since < first.get(row.dag_id, float("inf")):
                    first[row.dag_id] = row.since
        for (dag_id, classpath), n in sorted(pairs.items()):
            by_class.add_metric([dag_id, classpath], n)
        yield by_class
        for classpath, n in sorted(per_class.items()):
            classes.add_metric([classpath], n)
        yield classes
        now = time.time()
        for dag_id, since in sorted(first.items()):
            oldest.add_metric([dag_id], max(0.0, now - since))
        yield oldest
        checks = GaugeMetricFamily(
            "slotless_airflow_checks",
            "distinct checks held: rows equal in what they wait for are one",
            labels=["kind"],
        )
        kinds = {"file": 0, "time": 0, "s3": 0, "sftp": 0, "external": 0, "adapter": 0}
        for g in e.groups.values():
            kinds[g.plan.kind] = kinds.get(g.plan.kind, 0) + 1
        for kind, n in kinds.items():
            checks.add_metric([kind], n)
        yield checks
        made = CounterMetricFamily(
            "slotless_airflow_native_checks",
            "native checks made (one per group per interval)",
            labels=["kind"],
        )
        for kind in ("file", "s3", "sftp", "external"):
            made.add_metric([kind], e.checks[kind])
        yield made
        checked = CounterMetricFamily(
            "slotless_airflow_first_checks",
            "distinct conditions checked at least once since the start (natively checked)",
        )
        checked.add_metric([], e.first_checks)
        yield checked
        files = CounterMetricFamily(
            "slotless_airflow_file_looks",
            "looks of the native FileTrigger checks: a whole directory listed (one per "
            "directory per interval, or per safety interval while inotify watches it, however "
            "many paths wait there), or a single name (pushed by inotify, or new)",
            labels=["what"],
        )
        files.add_metric(["listing"], e.files.listings)
        files.add_metric(["name"], e.files.lookups)
        yield files
        listings = CounterMetricFamily(
            "slotless_airflow_s3_listings",
            "paginated ListObjectsV2 listings made by the native S3 checks (one per "
            "connection, bucket and directory per interval, however many keys wait there)",
        )
        listings.add_metric([], e.s3.listings)
        yield listings
        readdirs = CounterMetricFamily(
            "slotless_airflow_sftp_listings",
            "directory listings (readdir) made by the native SFTP checks (one per connection "
            "and directory per interval, however many paths wait there)",
        )
        readdirs.add_metric([], e.sftp.listings)
        yield readdirs
        reads = CounterMetricFamily(
            "slotless_airflow_external_reads",
            "reads of Airflow's dag_run and task_instance tables by the native DagStateTrigger "
            "and WorkflowTrigger checks (one per moment, however many groups are due then)",
        )
        reads.add_metric([], e.external.reads)
        yield reads
        submitted = CounterMetricFamily(
            "slotless_airflow_submitted",
            "outcomes written to Airflow, per trigger id",
            labels=["outcome"],
        )
        for outcome in ("event", "failure"):
            submitted.add_metric([outcome], e.submitted[outcome])
        yield submitted
        cycles = CounterMetricFamily(
            "slotless_airflow_cycles", "assignment cycles done against Airflow's database"
        )
        cycles.add_metric([], e.cycles)
        yield cycles
        lines = CounterMetricFamily(
            "slotless_airflow_task_log_lines",
            "lines written to task instances' trigger logs (read by Airflow's UI)",
        )
        lines.add_metric([], e.tasklogs.written)
        yield lines
