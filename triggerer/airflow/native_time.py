"""The native DateTimeTrigger checks of one process on one timer.

Every distinct instant waited for is an entry in one heap; one task sleeps until the
earliest of them, re-reading the wall clock when it wakes and at least every
:data:`CLOCK_S` (a long sleep would not notice the clock being stepped), so a held instant
costs its heap entry and nothing per second, however many are held. Airflow's
DateTimeTrigger sleeps in every trigger, and wakes each second for its last 20 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Any

from triggers.airflow import airflow_trigger_class

from .plans import DATETIME

CLOCK_S = 60.0  # the wall clock is read at least this often while instants are held
# Entries of waits gone (a cleared task instance) are dropped lazily; the heap is rebuilt
# when more than this many were cancelled since, and they are half of it.
COMPACT_AT = 1024


class TimeHub:
    """:meth:`until` returns once the wall clock reaches an instant."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._sooner = asyncio.Event()  # an entry earlier than the one slept for
        self._task: asyncio.Task[None] | None = None
        # Waits cancelled since the heap was last rebuilt (their entries stay until then,
        # or until they come due; some may be gone already: a hint, not a count).
        self._cancels = 0
        self.wakes = 0  # times the timer woke (for tests: not once per instant)

    def __len__(self) -> int:
        """Instants waited for (walks the heap: for tests and status, not per check)."""
        return sum(1 for _, _, fut in self._heap if not fut.done())

    async def until(self, due: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (due, next(self._seq), fut))
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="airflow native timer")
        if self._heap[0][2] is fut:
            self._sooner.set()
        try:
            await fut
        except asyncio.CancelledError:
            self._cancels += 1
            if self._cancels > COMPACT_AT and self._cancels * 2 > len(self._heap):
                self._heap = [e for e in self._heap if not e[2].done()]
                heapq.heapify(self._heap)
                self._cancels = 0
            raise

    async def _run(self) -> None:
        while True:
            heap = self._heap  # rebuilt by a compaction
            now = time.time()
            while heap and (heap[0][0] <= now or heap[0][2].done()):
                _, _, fut = heapq.heappop(heap)
                if not fut.done():
                    fut.set_result(None)
            left = min(heap[0][0] - now, CLOCK_S) if heap else CLOCK_S
            self._sooner.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sooner.wait(), left)
            self.wakes += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for _, _, fut in self._heap:
            fut.cancel()
        self._heap.clear()


async def time_events(
    hub: TimeHub, moment: datetime, end_from_trigger: bool
) -> AsyncGenerator[Any, None]:
    """At ``moment``: the DateTimeTrigger's own event (its payload, the moment in UTC), or
    ``TaskSuccessEvent`` when it ends the task from the trigger."""
    from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

    # Built, not run: its ``moment`` is the payload Airflow's run() yields (pendulum, UTC).
    trigger = airflow_trigger_class(DATETIME)(moment=moment, end_from_trigger=end_from_trigger)
    await hub.until(moment.timestamp())
    yield TaskSuccessEvent() if end_from_trigger else TriggerEvent(trigger.moment)
