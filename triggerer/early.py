"""Early checks: a check pushed by name while a call of it is in flight is checked again
at once, alongside that call, one call per class, instead of after it.

A safety poll's call lists whole folders (10,000 S3 waits: ten listings of 1,000 keys,
seconds on a busy server): a wait whose object lands meanwhile would wait for that
listing, then run again. The early call answers it from what the push said (an S3
notification's size, a fresh directory read). Only an event from it is acted on, and only
while the check is still held: the call in flight settles everything else (the push hub
runs the check once more after it), and whichever of the two fires first drops the
check, so the other's event is ignored (no double fire).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from triggers.base import BaseTrigger, TriggerEvent
from triggers.checking import CheckContext

from .checks import Check, CheckTable
from .running import CallTimes, call_checks
from .settling import Settled, Settler


class EarlyChecks:
    def __init__(
        self,
        table: CheckTable,
        settler: Settler,
        ctx: CheckContext,
        running: set[Check],
        *,
        clock: Callable[[], float],
        batch_size: int,
        check_timeout: float,
        fenced: Callable[[], bool] = lambda: False,
        call_times: CallTimes,
    ) -> None:
        self._table = table
        self._settler = settler
        self._ctx = ctx
        self._running = running  # the checks in flight (the runner's and the holder's)
        self._clock = clock
        self._batch_size = batch_size
        self._check_timeout = check_timeout
        self._fenced = fenced
        self._call_times = call_times
        self._early: set[str] = set()  # poke_hashes with an early call in flight: one each
        self.tasks: set[asyncio.Task[None]] = set()

    def check(self, hashes: Iterable[str]) -> None:
        """Check these pushed checks early, those of them whose call is in flight."""
        by_class: dict[type[BaseTrigger], list[Check]] = {}
        by_hash = self._table.by_hash
        for poke_hash in hashes:
            check = by_hash.get(poke_hash)
            if check is None or check not in self._running or poke_hash in self._early:
                continue
            self._early.add(poke_hash)
            by_class.setdefault(check.cls, []).append(check)
        size = self._batch_size
        for cls, checks in by_class.items():
            for i in range(0, len(checks), size):
                task = asyncio.create_task(self._run(cls, checks[i : i + size]))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _run(self, cls: type[BaseTrigger], checks: list[Check]) -> None:
        try:
            if self._fenced():
                return  # the calls in flight and the runs after them cover these checks
            began = time.perf_counter()
            try:
                async with asyncio.timeout(self._check_timeout):
                    results = list(await call_checks(cls, checks, self._ctx))
            except Exception:  # the same checks are in flight: their own call says it
                return
            if (hook := self._call_times.hook) is not None:
                hook(cls.classpath(), len(checks), time.perf_counter() - began)
            if len(results) != len(checks):
                return
            now = self._clock()
            settled: Settled = []
            for check, result in zip(checks, results, strict=True):
                if isinstance(result, TriggerEvent):
                    self._settler.settle_into(check, result, now, settled)
            if settled:  # an event reschedules nothing; settle_into's contract all the same
                self._table.schedule_many(settled)
        finally:
            self._early.difference_update(c.poke_hash for c in checks)
