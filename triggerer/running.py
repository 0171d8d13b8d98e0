"""Running checks: due checks off the heap into calls, and each result into the outbox.

The heap is the queue: a due check stays there until a call can take it, instead of
waiting as a Task of its own (100,000 waiting Tasks would cost memory and stall the loop
in garbage collection). A round starts at most ``wave`` calls and never lets more than
``max_concurrency`` be in flight; a class that implements ``poke_many`` is checked in
batches of up to ``batch_size``.

A result is settled at once: an event fires every task waiting on the check; an
exception that is not :data:`TRANSIENT` fails them, with the traceback in their log; a
transient one is retried with backoff; "not yet" schedules the next check. Check logs
are sampled so that a six-hour wait stays readable.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections.abc import Callable
from typing import Any

from triggers.base import BaseTrigger, TransientError, TriggerEvent
from triggers.checking import CheckContext, check_once

from .checks import Check, CheckTable
from .store import Fire, Waits
from .writing import Outbox

TRANSIENT = (TransientError, OSError, TimeoutError, ConnectionError)


class CheckRunner:
    def __init__(
        self,
        table: CheckTable,
        ctx: CheckContext,
        outbox: Outbox,
        *,
        wake: asyncio.Event,
        clock: Callable[[], float],
        max_concurrency: int,
        wave: int,
        batch_size: int,
        check_timeout: float,
        max_backoff: float,
    ) -> None:
        self._table = table
        self._ctx = ctx
        self._outbox = outbox
        self._wake = wake  # set when a call ends: its checks are back on the heap
        self._clock = clock
        self._max_concurrency = max_concurrency
        self._wave = wave
        self._batch_size = batch_size
        self._check_timeout = check_timeout
        self._max_backoff = max_backoff
        self._sem = asyncio.Semaphore(max_concurrency)
        self.calls = 0  # check calls in flight (one call may check a batch)
        self.running: set[Check] = set()  # read by the watchdog's thread: who blocks the loop
        self.tasks: set[asyncio.Task[None]] = set()
        self.checks_done = 0
        self.checks_failed = 0
        self.events_fired = 0
        # Called after each check call with (trigger classpath, triggers checked, seconds).
        self.on_check_call: Callable[[str, int, float], None] | None = None

    @property
    def full(self) -> bool:
        return self.calls >= self._max_concurrency

    def dispatch(self, now: float) -> bool:
        """Start the checks due at ``now`` that there is room for; whether any was started."""
        # At most `wave` calls per round: Tasks alive at a collection of the young
        # generations are promoted to the old one, and the more are promoted, the
        # sooner a full collection (a stall at 100,000 waits) comes.
        room = min(self._max_concurrency - self.calls, self._wave)
        if room <= 0:
            return False
        size = self._batch_size
        groups: dict[type[BaseTrigger], list[Check]] = {}
        started = False
        for check in self._table.pop_due(now, 10 * size):
            started = True
            check.running = True
            self.running.add(check)
            cls = type(check.trigger)
            if cls.is_batched() and not cls.is_push():
                group = groups.setdefault(cls, [])
                if not group:
                    room -= 1  # a new call
                group.append(check)
                if len(group) == size:
                    self._start_call(cls, group)
                    groups[cls] = []
            else:
                room -= 1
                self._start_call(cls, [check])
            if room <= 0:
                break
        for cls, group in groups.items():
            if group:
                self._start_call(cls, group)
        return started

    def _start_call(self, cls: type[BaseTrigger], checks: list[Check]) -> None:
        self.calls += 1
        task = asyncio.create_task(self._run_checks(cls, checks))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_checks(self, cls: type[BaseTrigger], checks: list[Check]) -> None:
        async with self._sem:
            results: list[Any]
            began = time.perf_counter()
            try:
                # asyncio.timeout: unlike wait_for on 3.11, no extra Task per call.
                async with asyncio.timeout(self._check_timeout):
                    results = list(await self._call(cls, checks))
                if len(results) != len(checks):
                    raise RuntimeError(
                        f"{cls.classpath()}.poke_many returned {len(results)} "
                        f"results for {len(checks)} triggers"
                    )
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                late = TimeoutError(f"check took longer than {self._check_timeout:g} s")
                results = [late] * len(checks)
            except Exception as exc:
                results = [exc] * len(checks)
            if self.on_check_call is not None:
                self.on_check_call(cls.classpath(), len(checks), time.perf_counter() - began)
        self.calls -= 1
        now = self._clock()
        for check, result in zip(checks, results, strict=True):
            check.running = False
            self.running.discard(check)
            self._settle(check, result, now)
        self._wake.set()

    async def _call(self, cls: type[BaseTrigger], checks: list[Check]) -> Any:
        if len(checks) > 1 or (cls.is_batched() and not cls.is_push()):
            return await cls.poke_many([c.trigger for c in checks], self._ctx)
        # No push_wait: the call is already bounded by check_timeout.
        return [await check_once(checks[0].trigger, self._ctx)]

    def _settle(self, check: Check, result: Any, now: float) -> None:
        if self._table.by_hash.get(check.poke_hash) is not check:
            return  # dropped meanwhile (shard lost, every subscriber gone)
        try:
            self._settle_result(check, result, now)
        except Exception as exc:  # the trigger's own code (payload, next_check_at) failed
            self.checks_failed += 1
            self._table.drop(check)
            self._outbox.fail(
                _waits(check), f"cannot handle the result of {check.trigger.describe()}: "
                               f"{type(exc).__name__}: {exc}"
            )  # fmt: skip

    def _settle_result(self, check: Check, result: Any, now: float) -> None:
        check.checks += 1
        self.checks_done += 1
        where = check.trigger.describe()
        if isinstance(result, TriggerEvent):
            if result.error:
                msg = f"trigger {where} reported an error: {result.error}"
            else:
                msg = f"trigger fired: {where} (after {check.checks} checks)"
            payload = json.dumps(result.payload)  # before anything is dropped: it may fail
            self._table.drop(check)
            self.events_fired += 1
            self._outbox.fire(
                Fire(_waits(check), payload, msg, error=msg if result.error else None)
            )
            return
        if isinstance(result, BaseException) and not isinstance(result, TRANSIENT):
            self.checks_failed += 1
            self._table.drop(check)
            tb = "".join(traceback.format_exception(result)).rstrip()
            self._outbox.fail(
                _waits(check), f"trigger {where} raised {type(result).__name__}: {result}\n{tb}"
            )
            return
        if isinstance(result, BaseException):
            self.checks_failed += 1
            check.failures += 1
            delay = min(self._max_backoff, check.interval * 2 ** min(check.failures, 10))
            line = (
                f"check of {where} failed ({type(result).__name__}: {result}); "
                f"retry {check.failures} in {delay:g} s"
            )
            self._log_check(check, line, force=check.failures == 1)
            self._table.schedule(check, now + delay)
            return
        check.failures = 0
        line = f"checked {where}: not yet; next in {check.interval:g} s"
        self._log_check(check, line)
        self._table.schedule(check, check.trigger.next_check_at(now, check.interval))

    def _log_check(self, check: Check, line: str, force: bool = False) -> None:
        # Sampled so that a six-hour wait stays readable: checks 1, 2, 4, 8, 16, ...
        n = check.checks
        if force or n & (n - 1) == 0 or line != check.last_result:
            self._outbox.log(check.subscribers, line)
        check.last_result = line


def _waits(check: Check) -> Waits:
    """The tasks a check answers, each with the trigger row it waits on."""
    return {row: sub.trigger_id for row, sub in check.subscribers.items()}
