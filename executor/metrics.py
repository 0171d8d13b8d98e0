"""Prometheus metrics over HTTP: the endpoint, the store-wide gauges, the worker's own.

Every process serves ``GET /metrics`` (aiohttp, prometheus-client's text exposition) on
``--metrics-port``. Two kinds of metrics:

* the process's own: a worker's slots, claims, attempts and slot-seconds (here), a
  triggerer's checks, events, shards and loop lag (``triggerer/metrics.py``);
* store-wide gauges read from the database just before a scrape (at most once a second):
  runs and tasks by state, the longest waits and how much of their timeout they used,
  shards nobody holds. Every process reports the same values for these; aggregate them
  with ``max()``, never ``sum()``.

The full list, with suggested alerts, is in docs/operations.md ("Metrics and alerts").
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .states import State
from .store import Pools, Views

if TYPE_CHECKING:
    from .outcomes import Outcome
    from .worker import Worker

log = logging.getLogger("slotless.metrics")

# No *_created series: they double every counter's lines and no alert here needs them.
disable_created_metrics()

# A triggerer whose heartbeat is older than this does not count as live.
TRIGGERER_LIVE_AFTER = 30.0


class MetricsPortError(ValueError):
    """The metrics port cannot be listened on (most often: another process has it)."""


Refresher = Callable[[], Awaitable[None]]


class MetricsServer:
    """``GET /metrics`` for one registry; ``refreshers`` run before each scrape."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str = "127.0.0.1",
        port: int = 9100,
        refreshers: list[Refresher] | None = None,
        routes: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] | None = None,
    ) -> None:
        self.registry = registry
        # Other GET paths served beside /metrics (the Airflow triggerer's /status snapshot).
        self.routes = dict(routes or {})
        self.host = host
        self.port = port
        self.refreshers = list(refreshers or [])
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/", self._index)
        for path, handler in self.routes.items():
            app.router.add_get(path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            if exc.errno == errno.EADDRINUSE:
                raise MetricsPortError(
                    f"metrics port {self.port} is already in use on {self.host} "
                    "(another process listens there; pick another --metrics-port)"
                ) from None
            raise MetricsPortError(
                f"cannot serve metrics on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        self._runner = runner
        for addr in runner.addresses:  # the real port, when 0 asked for any free one
            if isinstance(addr, tuple):
                self.port = addr[1]
                break

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        for refresh in self.refreshers:
            try:
                await refresh()
            except Exception:
                log.exception("refreshing metrics failed; serving the last values")
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(text="slotless metrics: /metrics\n")


class StoreCollector(Collector):
    """Store-wide gauges, read before a scrape (at most every ``min_interval`` seconds)."""

    def __init__(self, views: Views, pools: Pools, min_interval: float = 1.0) -> None:
        self.views = views
        self.pools = pools
        self.min_interval = min_interval
        self._last = float("-inf")
        self._families: list[Metric] = []
        self._ok = 0.0

    async def refresh(self) -> None:
        if time.monotonic() - self._last < self.min_interval:
            return
        self._last = time.monotonic()
        try:
            self._families = await self._read()
            self._ok = 1.0
        except Exception:
            self._ok = 0.0
            raise

    def collect(self) -> Iterator[Metric]:
        yield from self._families
        yield GaugeMetricFamily(
            "slotless_store_up", "1 if the last read of the store for metrics worked", self._ok
        )

    async def _read(self) -> list[Metric]:
        views = self.views
        now = views.clock()
        runs = GaugeMetricFamily("slotless_runs", "DAG runs by state", labels=["state"])
        for state, n in sorted((await views.run_states()).items()):
            runs.add_metric([state], n)
        tasks = GaugeMetricFamily(
            "slotless_tasks",
            "Task instances of unfinished runs by state (a mapped task counts its instances)",
            labels=["state"],
        )
        counts = await views.live_task_states()
        for state in State:
            tasks.add_metric([state.value], counts.get(state.value, 0))
        oldest = GaugeMetricFamily(
            "slotless_task_waiting_oldest_seconds",
            "How long the longest-waiting task in a waiting state has waited: DEFERRED and "
            "SENSING since the wait began, RETRYING since the first failure of a retry "
            "episode still going (running retry attempts included); 0 if none",
            labels=["state"],
        )
        ratio = GaugeMetricFamily(
            "slotless_task_wait_timeout_ratio_max",
            "The largest share of its own timeout any current wait has used (1 = timing out)",
            labels=["state"],
        )
        summary = await views.waiting_summary(now)
        for state in ("DEFERRED", "SENSING"):
            s = summary.get(state)
            started = s.oldest if s else None
            oldest.add_metric([state], 0.0 if started is None else max(0.0, now - started))
            ratio.add_metric([state], (s.timeout_ratio if s else None) or 0.0)
        since = await views.retrying_since()
        oldest.add_metric(["RETRYING"], 0.0 if since is None else max(0.0, now - since))
        leases = await views.shard_leases()
        live = [r for r in leases if r.owner is not None and (r.expires_at or 0) >= now]
        unowned = GaugeMetricFamily(
            "slotless_shards_unowned",
            "Trigger shards no live triggerer holds: DEFERRED waits in them are not checked",
            len(leases) - len(live),
        )
        triggerers = GaugeMetricFamily(
            "slotless_triggerers_live",
            f"Triggerers whose heartbeat is under {TRIGGERER_LIVE_AFTER:g} s old",
            sum(
                1 for r in await views.list_triggerers() if now - r.seen_at <= TRIGGERER_LIVE_AFTER
            ),
        )
        return [runs, tasks, oldest, ratio, unowned, triggerers, *await _pools(self.pools)]


async def _pools(pools: Pools) -> list[Metric]:
    """Each pool's size, slots in use and tasks ready; queues nobody serves."""
    size = GaugeMetricFamily(
        "slotless_pool_slots", "Slots of each pool (the default pool is unlimited: +Inf)",
        labels=["pool"],
    )  # fmt: skip
    used = GaugeMetricFamily(
        "slotless_pool_slots_used", "Slots of each pool held by RUNNING tasks", labels=["pool"]
    )
    ready = GaugeMetricFamily(
        "slotless_pool_tasks_ready",
        "Tasks of each pool ready to run (claimable now; held back when the pool is full)",
        labels=["pool"],
    )
    for p in await pools.pools():
        size.add_metric([p.name], float("inf") if p.slots is None else p.slots)
        used.add_metric([p.name], p.used)
        ready.add_metric([p.name], p.ready)
    workers = GaugeMetricFamily(
        "slotless_queue_workers", "Live workers serving each queue", labels=["queue"]
    )
    queued = GaugeMetricFamily(
        "slotless_queue_tasks_ready", "Tasks of each queue ready to run", labels=["queue"]
    )
    for q in await pools.queues():
        workers.add_metric([q.name], q.workers)
        queued.add_metric([q.name], q.ready)
    return [size, used, ready, workers, queued]


class WorkerMetrics:
    """A worker's own metrics; hooks itself into ``worker.on_exchange``."""

    def __init__(self, worker: Worker, registry: CollectorRegistry) -> None:
        self.worker = worker
        self.claims = Counter(
            "slotless_worker_claims", "Tasks this worker claimed", registry=registry
        )
        self.attempts = Counter(
            "slotless_worker_attempts",
            "Turns in a slot this worker finished, by outcome "
            "(success, error, defer, reschedule, sensor_timeout)",
            ["outcome"],
            registry=registry,
        )
        self.slot_seconds = Counter(
            "slotless_slot_seconds",
            "Seconds this worker's slots were held, by why: execute, poke (a poke-mode "
            "sensor sleeping in its slot), resume (a deferred task back from its wait)",
            ["kind"],
            registry=registry,
        )
        for kind in ("execute", "poke", "resume"):
            self.slot_seconds.labels(kind)
        slots = Gauge("slotless_worker_slots", "Slots of this worker", registry=registry)
        slots.set_function(lambda: worker.slots)
        busy = Gauge("slotless_worker_slots_busy", "Slots holding a task now", registry=registry)
        busy.set_function(lambda: worker.busy_slots)
        info = Gauge("slotless_worker_info", "This worker's id", ["worker_id"], registry=registry)
        info.labels(worker.worker_id).set(1)
        worker.on_exchange = self.on_exchange
        registry.register(_WorkerLiveness(worker))

    def on_exchange(self, recorded: list[Outcome], claimed: list[Any]) -> None:
        if claimed:
            self.claims.inc(len(claimed))
        for o in recorded:
            self.attempts.labels(o.kind.value).inc()
            if o.slot is not None:
                self.slot_seconds.labels(o.slot.kind).inc(
                    max(0.0, o.slot.ended_at - o.slot.started_at)
                )


class _WorkerLiveness(Collector):
    """Counts the worker keeps itself (its liveness)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "slotless_worker_lost_workers",
            "Other workers found dead by their liveness lock, whose attempts this one took back",
            self.worker.lost_workers,
        )
        yield CounterMetricFamily(
            "slotless_worker_attempts_lost",
            "Attempts of this worker found taken back when it heartbeat (after a pause, a "
            "network cut, a cancel): stopped where the slot can be (process isolation)",
            self.worker.attempts_lost,
        )


def store_registry(views: Views, pools: Pools) -> tuple[CollectorRegistry, StoreCollector]:
    """A fresh registry holding the store-wide gauges."""
    registry = CollectorRegistry(auto_describe=False)
    collector = StoreCollector(views, pools)
    registry.register(collector)
    return registry, collector


@asynccontextmanager
async def worker_metrics(
    worker: Worker, host: str, port: int | None
) -> AsyncIterator[MetricsServer | None]:
    """Serve ``worker``'s metrics while the block runs (nothing if ``port`` is None)."""
    if port is None:
        yield None
        return
    registry, collector = store_registry(worker.store.views, worker.store.pools)
    WorkerMetrics(worker, registry)
    server = MetricsServer(registry, host, port, [collector.refresh])
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
