"""Held triggers: a class whose ``run()`` is held open for the whole wait (``held = True``).

Airflow's triggers (``triggers/airflow.py``) are written that way: ``run()`` loops and
sleeps inside itself until it yields its event. Such a check gets one asyncio Task for as
long as it is in the table, however many tasks wait on it (de-duplication is the table's,
as for every check); the Task is cancelled, and the generator closed (so its cleanup runs),
when the check leaves the table: it fired or failed, its last subscriber left, its shard
moved to another triggerer, or the triggerer stops.

Its first event or exception is settled like any check's result (settling.py); a
``run()`` that returns without an event fails its tasks (it would never fire). A held
Task does not count against the runner's concurrency and has no check timeout: it is
waiting, not checking. This is Airflow's cost model (a coroutine per wait, about 2 KB),
chosen for compatibility; slotless's own triggers are checked from the schedule instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from triggers.checking import CheckContext

from .checks import Check
from .settling import Settler


class HeldTriggerEnded(RuntimeError):
    """``run()`` of a held trigger returned without yielding an event."""


class Holder:
    def __init__(
        self,
        settler: Settler,
        ctx: CheckContext,
        running: set[Check],
        *,
        wake: asyncio.Event,
        clock: Callable[[], float],
    ) -> None:
        self._settler = settler
        self._running = running  # the checks in flight, the runner's too (see CheckRunner)
        self._ctx = ctx
        self._wake = wake
        self._clock = clock
        self.tasks: dict[str, asyncio.Task[None]] = {}  # poke_hash -> its held run()

    def __len__(self) -> int:
        return len(self.tasks)

    def start(self, check: Check) -> None:
        """Hold ``check``'s run() until it yields, fails, or the check is forgotten."""
        check.running = True  # off the schedule while held: its entries are stale
        self._running.add(check)
        name = f"held {check.trigger.blame()}"
        self.tasks[check.poke_hash] = asyncio.create_task(self._hold(check), name=name)

    def forget(self, check: Check) -> None:
        """The check left the table: stop holding it (the generator's cleanup runs)."""
        task = self.tasks.get(check.poke_hash)
        if task is not None and task is not asyncio.current_task():
            self.tasks.pop(check.poke_hash, None)
            task.cancel()
        self._running.discard(check)

    async def stop(self) -> None:
        tasks = list(self.tasks.values())
        self.tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _hold(self, check: Check) -> None:
        me = asyncio.current_task()
        result: Any
        try:
            agen = check.trigger.run(self._ctx)
            try:
                result = await anext(agen)
            except StopAsyncIteration:
                result = HeldTriggerEnded(
                    f"{check.trigger.blame()}.run() returned without yielding an event"
                )
            except Exception as exc:
                result = exc
            # Closed before the result is settled: the wait has ended either way, and a
            # trigger's cleanup() must run before its tasks move on.
            with contextlib.suppress(Exception):
                await agen.aclose()  # type: ignore[attr-defined]
        finally:
            if self.tasks.get(check.poke_hash) is me:
                del self.tasks[check.poke_hash]
            check.running = False
            self._running.discard(check)
        self._settler.settle(check, result, self._clock())
        self._wake.set()
