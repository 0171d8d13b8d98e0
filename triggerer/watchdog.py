"""Watching the triggerer's own event loop: lag, and who blocked it.

A coroutine ticks every ``interval``; how late each tick wakes is the loop's lag. A
thread beside the loop notices when ticks stop, looks at the loop thread's stack, and
names the trigger class whose code is running there: a blocking call in a trigger is
found by class, not guessed. A stall is logged when it passes the threshold and again,
with its true length, when it ends. A stall inside an import names the module imported
(a trigger's code importing lazily on the loop).

A held trigger (an Airflow trigger's run(), open for the whole wait) that loops without
waiting between its tries never blocks the loop for long, yet keeps it busy: its host
times the trigger's steps (triggers/loopmeter.py), and a class whose code ran for at
least ``busy_share`` of a ``busy_window`` is named in a WARNING (a provider trigger
retrying a missing connection at once, say).

Trigger modules are imported in the registry's import thread (triggers/registry.py), not
on the loop; the watchdog also reports an import there that runs past ``SLOW_IMPORT``
seconds, with the module's name, while it runs (the registry logs its length when done).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from typing import Any

from triggers import loopmeter, registry
from triggers.base import BaseTrigger

log = logging.getLogger("slotless.triggerer")


class LoopWatch:
    def __init__(
        self,
        interval: float = 0.05,
        block_threshold: float = 0.25,
        on_block: Callable[[str, float, Any], None] | None = None,
        blame: Callable[[str], Any] | None = None,
        busy_window: float = 10.0,
        busy_share: float = 0.3,
    ) -> None:
        self.interval = interval
        self.block_threshold = block_threshold
        self.busy_window = busy_window
        self.busy_share = busy_share
        self.busy: Counter[str] = Counter()  # windows a held trigger kept the loop busy,
        # by its class
        self.lags: deque[float] = deque(maxlen=2048)
        self.blocked: Counter[str] = Counter()  # stalls, by trigger class
        self.blocked_seconds: defaultdict[str, float] = defaultdict(float)  # once ended
        self.slow_imports: Counter[str] = Counter()  # imports seen past SLOW_IMPORT, by module
        self.on_lag: Callable[[float], None] | None = None  # each lag sample (the metrics)
        # blame(culprit) is called when a stall is seen (who is running then: the checks
        # have ended by the time it ends); on_block(culprit, length, blamed) when it ends.
        self._on_block = on_block
        self._blame = blame
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
        # A stall is announced when it passes the threshold (it may never end) and reported
        # again, with its true length, when the loop ticks again: the length is measured
        # from the loop's last tick before the stall to its first one after.
        stalled_since: float | None = None  # the last tick before the stall in progress
        culprit = ""
        blamed: Any = None
        import_seen: tuple[str, float] | None = None  # the slow import already reported
        loopmeter.take()  # what ran before this watch is not this window's
        window_began = time.monotonic()
        while not self._stop.wait(self.interval):
            if (elapsed := time.monotonic() - window_began) >= self.busy_window:
                self._busy_report(loopmeter.take(), elapsed)
                window_began = time.monotonic()
            importing = registry.importing()
            if importing is not None and importing != import_seen:
                module, since = importing
                if time.monotonic() - since >= registry.SLOW_IMPORT:
                    import_seen = importing
                    self.slow_imports[module] += 1
                    log.warning(
                        "importing module %s for %.1f s so far, in the import thread (the "
                        "event loop goes on; waits of its classes start once it is done)",
                        module,
                        time.monotonic() - since,
                    )
            tick = self._last_tick
            if stalled_since is not None and tick != stalled_since:
                length = max(0.0, tick - stalled_since - self.interval)
                self.blocked_seconds[culprit] += length
                log.warning("event loop was blocked for %.2f s in %s", length, culprit)
                if self._on_block is not None:
                    self._on_block(culprit, length, blamed)
                stalled_since = None
            stalled = time.monotonic() - tick
            if stalled_since is not None or stalled < self.block_threshold:
                continue
            stalled_since = tick
            culprit = self._culprit() or "unknown (not inside a trigger)"
            self.blocked[culprit] += 1
            blamed = self._blame(culprit) if self._blame is not None else None
            log.warning(
                "event loop blocked for %.2f s so far in %s (at %s)",
                stalled, culprit, self._where(),
            )  # fmt: skip

    def _where(self, depth: int = 4) -> str:
        """The loop thread's innermost Python frames, for a stall no trigger is blamed for
        (the loop's own work: loading, writing; a collection shows as the frame that
        allocated, or a gc callback)."""
        frame = sys._current_frames().get(self._loop_thread)
        where: list[str] = []
        while frame is not None and len(where) < depth:
            code = frame.f_code
            where.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
        return " < ".join(where) or "no frame"

    def _busy_report(self, spent: dict[str, float], seconds: float) -> None:
        for who, busy in spent.items():
            if busy >= self.busy_share * seconds:
                self.busy[who] += 1
                log.warning(
                    "held trigger %s ran on the event loop for %.1f s of the last %.1f s "
                    "(%.0f%%; a run() that loops without waiting: a failure retried at once?)",
                    who, busy, seconds, 100 * busy / seconds,
                )  # fmt: skip

    def _culprit(self) -> str | None:
        """The trigger whose code runs on the loop's thread now (a stall inside an import
        names the module)."""
        frame = sys._current_frames().get(self._loop_thread)
        module = None  # the outermost module being imported, if the stall is an import
        while frame is not None:
            code = frame.f_code
            if code.co_name == "_find_and_load" and "importlib" in code.co_filename:
                name = frame.f_locals.get("name")
                if isinstance(name, str):
                    module = name
            for name in ("self", "cls"):
                obj = frame.f_locals.get(name)
                who = None
                if isinstance(obj, BaseTrigger):
                    who = obj.blame()  # a host (AirflowTrigger) names the class it runs
                elif isinstance(obj, type) and issubclass(obj, BaseTrigger):
                    who = obj.classpath()
                if who is not None:
                    return who if module is None else f"{who} (importing module {module})"
            frame = frame.f_back
        return None if module is None else f"importing module {module}"
