"""A triggerer's Prometheus metrics, served on ``slotless triggerer --metrics-port``.

Read from the running :class:`~triggerer.service.Triggerer` at scrape time (its check
table, counters, shards and loop watch), plus two histograms fed as things happen: the
duration of each check call (one call may check a batch) and each loop-lag sample. The
store-wide gauges of :mod:`executor.metrics` are served beside them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from executor.metrics import MetricsServer, store_registry
from executor.store import Pools

if TYPE_CHECKING:
    from .service import Triggerer

CHECK_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
SUBSCRIBER_BUCKETS = (1, 2, 5, 10, 100, 1000, 10000)


class TriggererCollector(Collector):
    """What the triggerer holds and has done, read from it at scrape time."""

    def __init__(self, triggerer: Triggerer) -> None:
        self.t = triggerer
        # waits sharing a check -> checks, as counted before the last scrape (refresh)
        self._sharing: Counter[int] = Counter()

    async def refresh(self) -> None:
        """Count the checks by how many waits share each, a 64th of the table at a time:
        a scrape is served on the triggerer's loop, and a million checks counted at once
        held it for ~0.9 s."""
        sharing: Counter[int] = Counter()
        for checks in self.t.table.by_hash.value_chunks():
            sharing.update(len(c.subscribers) for c in checks)
            await asyncio.sleep(0)
        self._sharing = sharing

    def collect(self) -> Iterator[Metric]:
        t = self.t
        table = t.table
        yield GaugeMetricFamily(
            "slotless_triggerer_triggers",
            "Waits (deferred tasks) this triggerer holds",
            table.subscriptions,
        )
        yield GaugeMetricFamily(
            "slotless_triggerer_distinct_checks",
            "Distinct checks (poke hashes) this triggerer runs for them",
            len(table),
        )
        sharing = self._sharing
        buckets = [
            (str(b), float(sum(checks for n, checks in sharing.items() if n <= b)))
            for b in SUBSCRIBER_BUCKETS
        ]
        buckets.append(("+Inf", float(sharing.total())))
        yield GaugeHistogramMetricFamily(
            "slotless_triggerer_subscribers_per_check",
            "Distinct checks by how many waiting tasks share each",
            buckets=buckets,
            gsum_value=float(sum(n * checks for n, checks in sharing.items())),
        )
        yield GaugeMetricFamily(
            "slotless_triggerer_shards", "Trigger shards this triggerer holds", len(t.shards)
        )
        yield CounterMetricFamily(
            "slotless_triggerer_checks", "Checks run (one per trigger checked)", t.checks_done
        )
        yield CounterMetricFamily(
            "slotless_triggerer_checks_failed",
            "Checks that raised (transient ones are retried with backoff)",
            t.checks_failed,
        )
        yield CounterMetricFamily(
            "slotless_triggerer_events_fired",
            "Checks whose condition held (each fires every task waiting on it)",
            t.events_fired,
        )
        repaired = CounterMetricFamily(
            "slotless_triggerer_repaired",
            "Orphans repaired (triggerer/repair.py), by kind: a DEFERRED task whose trigger row "
            "is missing (failed or timed out), a trigger row nobody waits on (deleted), a "
            "RUNNING task whose owner is unknown (retried), an unloadable trigger row (failed)",
            labels=["kind"],
        )
        for kind, n in sorted(t.repaired.items()):
            repaired.add_metric([kind], n)
        yield repaired
        blocked = CounterMetricFamily(
            "slotless_triggerer_blocked",
            "Times the event loop was blocked, by the trigger class running at the time",
            labels=["trigger_class"],
        )
        for cls, n in sorted(dict(t.watch.blocked).items()):
            blocked.add_metric([cls], n)
        yield blocked
        blocked_s = CounterMetricFamily(
            "slotless_triggerer_blocked_seconds",
            "Seconds the event loop was blocked (each stall counted when it ended), by class",
            labels=["trigger_class"],
        )
        for cls, secs in sorted(dict(t.watch.blocked_seconds).items()):
            blocked_s.add_metric([cls], secs)
        yield blocked_s
        yield CounterMetricFamily(
            "slotless_triggerer_takeovers",
            "Triggerers found dead by their liveness lock whose shards this one freed",
            t.takeovers,
        )
        yield CounterMetricFamily(
            "slotless_triggerer_shards_lost",
            "Shards this triggerer found taken by another when it renewed (it had paused)",
            t.shards_lost,
        )
        sources = list(t.push.sources.values())
        push = GaugeMetricFamily(
            "slotless_triggerer_push_sources",
            "Push sources open (inotify watches, S3 event queues, LISTEN), live or polled",
            labels=["state"],
        )
        push.add_metric(["live"], sum(sources))
        push.add_metric(["polled"], len(sources) - sum(sources))
        yield push
        yield CounterMetricFamily(
            "slotless_triggerer_pushes",
            "Changes heard from push sources (each wakes the checks of its topic)",
            t.push.pushes,
        )
        info = GaugeMetricFamily(
            "slotless_triggerer_info", "This triggerer's id", labels=["triggerer_id"]
        )
        info.add_metric([t.id], 1)
        yield info


def triggerer_registry(triggerer: Triggerer) -> tuple[CollectorRegistry, list]:
    """A registry with the triggerer's metrics and the store-wide gauges; its refreshers."""
    views = triggerer.views
    registry, store_collector = store_registry(views, Pools(views.db, views.clock))
    collector = TriggererCollector(triggerer)
    registry.register(collector)
    check_duration = Histogram(
        "slotless_triggerer_check_duration_seconds",
        "Duration of one check call (a batched call checks many triggers), by trigger class",
        ["trigger_class"],
        buckets=CHECK_BUCKETS,
        registry=registry,
    )
    loop_lag = Histogram(
        "slotless_triggerer_loop_lag_seconds",
        "How late the event loop ran a timer that should have fired at once",
        buckets=LAG_BUCKETS,
        registry=registry,
    )
    triggerer.on_check_call = lambda cls, n, seconds: check_duration.labels(cls).observe(seconds)
    triggerer.watch.on_lag = loop_lag.observe
    return registry, [store_collector.refresh, collector.refresh]


@asynccontextmanager
async def triggerer_metrics(
    triggerer: Triggerer, host: str, port: int | None
) -> AsyncIterator[MetricsServer | None]:
    """Serve ``triggerer``'s metrics while the block runs (nothing if ``port`` is None)."""
    if port is None:
        yield None
        return
    registry, refreshers = triggerer_registry(triggerer)
    server = MetricsServer(registry, host, port, refreshers)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
