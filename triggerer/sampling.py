"""The triggerer's last hour, one small row per sample period, for the waits page.

Checks per second, loop lag and what it holds live in the triggerer's memory; the page is
another process. At its heartbeat (every ``lease_every``, triggerer/leasing.py) the
triggerer asks :meth:`Sampler.take` whether a sample is due (every ``sample_every`` s,
30 by default); if so, :meth:`TriggererStore.triggerer_beat` writes that one row in the
beat's transaction and deletes every row older than :data:`KEPT` (an index on the time).
So the cost is one row a period per triggerer, whatever the waits it holds: nothing is
written per wait or per check, and the table holds at most ``KEPT / sample_every`` rows
per triggerer (120 at the defaults).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

KEPT = 3600.0  # seconds of samples kept (the page's sidebar draws the last hour)


@dataclass(frozen=True, slots=True)
class Sample:
    """One row of ``triggerer_sample`` (schema 024_waits_page.sql)."""

    checks_per_s: float  # checks settled per second since the last sample
    lag_p99_ms: float  # loop lag over the watchdog's last ~100 s (2,048 ticks)
    lag_max_ms: float
    waits: int  # waits held (subscriptions)
    checks: int  # distinct conditions held (poke hashes)
    shards: int  # shards leased


@dataclass(frozen=True, slots=True)
class Gauges:
    """What the sampler reads off the triggerer, each a cheap call (no walk of the table)."""

    checks_done: Callable[[], int]
    lags: Callable[[], tuple[float, float]]  # (p99, max) in seconds
    waits: Callable[[], int]
    checks: Callable[[], int]
    shards: Callable[[], int]


class Sampler:
    """Decides when a sample is due and computes it from the counters' deltas."""

    def __init__(
        self, gauges: Gauges, every: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._gauges = gauges
        self._every = every
        self._clock = clock
        self._last_at: float | None = None
        self._last_done = 0
        self._before: tuple[float | None, int] = (None, 0)  # undone by put_back

    def take(self) -> Sample | None:
        """A sample if one is due (the first at the first beat), else None."""
        now = self._clock()
        done = self._gauges.checks_done()
        if self._last_at is not None and now - self._last_at < self._every:
            return None
        span = now - self._last_at if self._last_at is not None else 0.0
        rate = (done - self._last_done) / span if span > 0 else 0.0
        self._before = (self._last_at, self._last_done)
        self._last_at, self._last_done = now, done
        p99, worst = self._gauges.lags()
        return Sample(
            checks_per_s=rate,
            lag_p99_ms=p99 * 1000,
            lag_max_ms=worst * 1000,
            waits=self._gauges.waits(),
            checks=self._gauges.checks(),
            shards=self._gauges.shards(),
        )

    def put_back(self) -> None:
        """The last sample was not written (its beat failed): the next beat samples again,
        over the longer span."""
        self._last_at, self._last_done = self._before
