"""Watching the triggerer's own event loop: lag, and who blocked it.

A coroutine ticks every ``interval``; how late each tick wakes is the loop's lag. A
thread beside the loop notices when ticks stop, looks at the loop thread's stack, and
names the trigger class whose code is running there: a blocking call in a trigger is
found by class, not guessed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

from triggers.base import BaseTrigger

log = logging.getLogger("slotless.triggerer")


class LoopWatch:
    def __init__(
        self,
        interval: float = 0.05,
        block_threshold: float = 0.25,
        on_block: Callable[[str, float], None] | None = None,
    ) -> None:
        self.interval = interval
        self.block_threshold = block_threshold
        self.lags: deque[float] = deque(maxlen=2048)
        self.blocked: Counter[str] = Counter()
        self.on_lag: Callable[[float], None] | None = None  # each lag sample (the metrics)
        self._on_block = on_block
        self._last_tick = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()

    def percentile(self, q: float) -> float:
        if not self.lags:
            return 0.0
        ordered = sorted(self.lags)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    async def run(self) -> None:
        self._loop_thread = threading.get_ident()
        thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        thread.start()
        try:
            while True:
                before = time.monotonic()
                self._last_tick = before
                await asyncio.sleep(self.interval)
                lag = max(0.0, time.monotonic() - before - self.interval)
                self.lags.append(lag)
                if self.on_lag is not None:
                    self.on_lag(lag)
        finally:
            self._stop.set()

    def _watch(self) -> None:
        reported_tick = 0.0
        while not self._stop.wait(self.interval):
            tick = self._last_tick
            stalled = time.monotonic() - tick
            if stalled < self.block_threshold or tick == reported_tick:
                continue
            reported_tick = tick
            culprit = self._culprit() or "unknown (not inside a trigger)"
            self.blocked[culprit] += 1
            log.warning("event loop blocked for %.2f s in %s", stalled, culprit)
            if self._on_block is not None:
                self._on_block(culprit, stalled)

    def _culprit(self) -> str | None:
        frame = sys._current_frames().get(self._loop_thread)
        while frame is not None:
            for name in ("self", "cls"):
                obj = frame.f_locals.get(name)
                cls = obj if isinstance(obj, type) else type(obj)
                if isinstance(cls, type) and issubclass(cls, BaseTrigger):
                    return cls.classpath()
            frame = frame.f_back
        return None
