"""Running checks: due checks off the schedule into calls, and each result into the outbox.

The schedule is the queue: a due check stays there until a call can take it, instead of
waiting as a Task of its own (100,000 waiting Tasks would cost memory and stall the loop
in garbage collection). A round starts at most ``wave`` calls and never lets more than
``max_concurrency`` be in flight; a class that implements ``poke_many`` is checked in
batches of up to ``batch_size``.

Each result is settled at once by the :class:`~triggerer.settling.Settler`; a held class's
check goes to the :class:`~triggerer.holding.Holder` instead of a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Generator
from typing import Any

from triggers.base import BaseTrigger
from triggers.checking import CheckContext, check_once

from .checks import Check, CheckTable
from .settling import Settled, Settler

# Called after each check call with (trigger classpath, triggers checked, seconds).
CallHook = Callable[[str, int, float], None]


class CallTimes:
    """Where each check call's duration goes: ``hook``, once the metrics attach one
    (metrics.py); none until then, and no classpath is looked up for it."""

    __slots__ = ("hook",)

    def __init__(self) -> None:
        self.hook: CallHook | None = None


# Rounds of plain checks started per dispatch (each ~2 ms of work at 500 cheap checks).
_ROUNDS_PER_PASS = 2
# A round that has run this long hands the rest of its checks to a new round, which runs
# in the loop's next pass: on a slow or busy machine 500 checks are not 2 ms, and the
# loop's other work (loading, writing, timers) must not wait behind them.
_ROUND_SLICE = 0.005
# Checks dispatched between two collections of the young generation (see dispatch()).
_CHECKS_PER_YOUNG_COLLECTION = 4096


class CheckRunner:
    def __init__(
        self,
        table: CheckTable,
        ctx: CheckContext,
        settler: Settler,
        *,
        wake: asyncio.Event,
        clock: Callable[[], float],
        max_concurrency: int,
        wave: int,
        batch_size: int,
        check_timeout: float,
        hold: Callable[[Check], None] | None = None,
        running: set[Check] | None = None,
        call_times: CallTimes | None = None,
        fenced: Callable[[], bool] = lambda: False,
        renew: Callable[[], None] = lambda: None,
        sync_every: float = 1.0,
        check_tick: float = 0.01,
        round_size: int = 500,
    ) -> None:
        self._table = table
        self._ctx = ctx
        self._settler = settler
        self._models = settler.models  # one cache: a check the settler drops leaves it
        self._wake = wake  # set when a call ends: its checks are back on the schedule
        self._clock = clock
        self._max_concurrency = max_concurrency
        self._wave = wave
        self._batch_size = batch_size
        self._check_timeout = check_timeout
        # Starts holding a check whose class is `held` (triggerer/holding.py).
        self._hold = hold
        # True while our leases may have lapsed: a call dispatched before a pause does
        # not start after it (the renewal first says whether the shard is still ours).
        self._fenced = fenced
        self._renew = renew  # asks the leases for a renewal now (see checking())
        self._sync_every = sync_every  # the longest the checking loop sleeps when idle
        self._check_tick = check_tick  # due checks are gathered this long
        self._round_size = round_size  # plain checks per round (~2 ms of work)
        self._sem = asyncio.Semaphore(max_concurrency)
        self._call_times = call_times or CallTimes()
        self.calls = 0  # check calls in flight (one call may check a batch)
        # The checks in flight, the holder's too: read by the watchdog's thread (who blocks
        # the loop) and by the early checks (which are in flight).
        self.running: set[Check] = set() if running is None else running
        self.current: Check | None = None  # the check being called in a round, likewise
        self.tasks: set[asyncio.Task[None]] = set()
        # How each class is checked (asked once: two class calls a check add up at 3,800/s).
        self._ways: dict[type[BaseTrigger], str] = {}
        self._since_young_collection = 0  # checks dispatched since (see dispatch())

    async def checking(self) -> None:
        """The checking loop: dispatch what is due, then sleep until the next check is due,
        a call ends or a load adds checks (``wake``)."""
        while True:
            # Cleared first, so that a call ending or a load meanwhile wakes the wait below.
            self._wake.clear()
            if self._fenced():
                # Woken after a pause (or renewals fail): learn which shards are still ours
                # before checking anything; the lease loop wakes us when it knows.
                self._renew()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._wake.wait()
                continue
            if self.dispatch(self._clock()):
                await asyncio.sleep(0)  # let the dispatched checks start
                continue
            if self.full:
                wait = 1.0  # the next call to end wakes us
            else:
                nxt = self._table.next_due()
                wait = self._sync_every if nxt is None else max(0.0, nxt - self._clock())
                # Checks due within a tick are gathered: a wake-up serves dozens of them
                # (3,800 checks/s spread evenly would otherwise be 3,800 wake-ups, each
                # costing more than the checks it runs).
                wait = max(wait, self._check_tick)
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that
                # races the event being set, and stop() then waits for this loop forever.
                async with asyncio.timeout(min(wait, 1.0)):
                    await self._wake.wait()

    def blame(self, culprit: str) -> list[int]:
        """Called from the watchdog's thread when a stall is seen: the waits of the checks
        of that class running now (they will have ended when the stall is measured)."""
        current = self.current
        checks = [*list(self.running), *([current] if current is not None else [])]
        return [row for c in checks if c.trigger.blame() == culprit for row in list(c.subscribers)]

    @property
    def full(self) -> bool:
        return self.calls >= self._max_concurrency

    def dispatch(self, now: float) -> bool:
        """Start the checks due at ``now`` that there is room for; whether any was started.

        Checks of a class that batches go out in ``poke_many`` calls, one Task each. Any
        other due check joins a *round*: one Task that calls its checks one after the
        other, each as a plain call. A check that finishes without waiting (a cheap one)
        is settled at once and costs no Task, future or timeout of its own; one that
        waits keeps the round's Task for itself, and the rest of the round goes on in a
        new Task (its coroutine has started in that Task: it must finish there).
        """
        # At most `wave` new Tasks per round of this loop: Tasks alive at a collection of
        # the young generations are promoted to the old one, and the more are promoted,
        # the sooner a full collection comes.
        room = min(self._max_concurrency - self.calls, self._wave)
        if room <= 0:
            return False
        size = self._batch_size
        groups: dict[type[BaseTrigger], list[Check]] = {}
        plain: list[Check] = []
        rounds = 0
        started = False
        ways = self._ways
        popped = 0
        for check in self._table.pop_due(now, 10 * size):
            started = True
            popped += 1
            cls = check.cls
            way = ways.get(cls)
            if way is None:
                way = ways[cls] = _way_of(cls)
            if way is _HELD and self._hold is not None:
                self._hold(check)  # waits, not checks: no room taken
                continue
            check.running = True
            if way is _BATCHED:
                self.running.add(check)
                group = groups.setdefault(cls, [])
                if not group:
                    room -= 1  # a new call
                group.append(check)
                if len(group) == size:
                    self._start_call(cls, group)
                    groups[cls] = []
            else:
                if not plain:
                    room -= 1  # a new round
                plain.append(check)
                if len(plain) == self._round_size:
                    self._start_round(plain)
                    plain = []
                    rounds += 1
                    # The rounds started now run in the loop's next pass, one after
                    # the other: a few at a time keep that pass short (loop lag).
                    if rounds >= _ROUNDS_PER_PASS:
                        break
            if room <= 0:
                break
        if plain:
            self._start_round(plain)
        for cls, group in groups.items():
            if group:
                self._start_call(cls, group)
        self._since_young_collection += popped
        if self._since_young_collection >= _CHECKS_PER_YOUNG_COLLECTION:
            # A check allocates tracked objects (its log line, its result) and
            # frees old ones, and CPython lowers the young generation's count at every
            # free, whatever the freed object's age: the count stays under its threshold
            # while the young list grows (~764,000 objects at a million waits, then one
            # collection of 100-230 ms). Collected every few thousand checks it stays a
            # few milliseconds, and the tuples it finds, holding no container, are
            # untracked there rather than promoted.
            self._since_young_collection = 0
            gc.collect(0)
        return started

    def _start_round(self, checks: list[Check]) -> None:
        self.calls += 1
        task = asyncio.create_task(self._run_round(checks))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_round(self, checks: list[Check]) -> None:
        """Call each check in turn (see :meth:`dispatch`), settling the ones that finish."""
        if self._fenced():  # dispatched before a pause: not started after it
            self._put_back(checks)
            return
        hook = self._call_times.hook
        settled: Settled = []
        waiting: tuple[Check, Any, Any] | None = None
        slice_end = time.perf_counter() + _ROUND_SLICE
        try:
            for i, check in enumerate(checks):
                began = time.perf_counter()
                if began >= slice_end:
                    self._hand_on(checks[i:])
                    break
                try:
                    model = self._models.model(check)
                except Exception as exc:  # its kwargs, loaded unvalidated, are invalid
                    check.running = False
                    self._cannot_load(check, exc)
                    continue
                self.current = check
                try:
                    way = self._ways.get(check.cls)
                    if way is _PUSH or (way is _HELD and check.cls.is_push()):
                        coro = check_once(model, self._ctx)
                    else:
                        coro = model.poke(self._ctx)
                    step = coro.send(None)
                except StopIteration as done:
                    result: Any = done.value
                except Exception as exc:  # the trigger's own failure: its check's result
                    result = exc
                else:
                    waiting = (check, coro, step)
                    rest = checks[i + 1 :]
                    if rest:
                        self._hand_on(rest)
                    break
                finally:
                    self.current = None
                if hook is not None:
                    hook(check.cls.classpath(), 1, time.perf_counter() - began)
                check.running = False
                self._settler.settle_into(check, result, self._clock(), settled)
        finally:
            if settled:
                self._table.schedule_many(settled)
            if waiting is None:
                self.calls -= 1
                self._wake.set()
        if waiting is not None:
            check, coro, step = waiting
            self.running.add(check)
            await self._finish(check, _Resume(coro, step))

    def _cannot_load(self, check: Check, exc: Exception) -> None:
        self.running.discard(check)
        self._settler.cannot_load(check, exc)

    def _hand_on(self, rest: list[Check]) -> None:
        """The rest of a round whose Task a waiting check keeps: a new round if there is
        room, else back on the schedule (they are due: the next dispatch takes them)."""
        if self.calls < self._max_concurrency:
            self._start_round(rest)
            return
        for check in rest:
            check.running = False
        self._table.schedule_many([(check.due, check) for check in rest])
        self._wake.set()

    async def _finish(self, check: Check, rest: _Resume) -> None:
        """The part of a check after its first wait, in the Task it started in."""
        began = time.perf_counter()
        result: Any
        try:
            async with asyncio.timeout(self._check_timeout):
                result = await rest
        except asyncio.CancelledError:
            rest.close()
            raise
        except TimeoutError:
            result = TimeoutError(f"check took longer than {self._check_timeout:g} s")
        except Exception as exc:
            result = exc
        finally:
            self.calls -= 1
        if (hook := self._call_times.hook) is not None:
            hook(check.cls.classpath(), 1, time.perf_counter() - began)
        check.running = False
        self.running.discard(check)
        settled: Settled = []
        self._settler.settle_into(check, result, self._clock(), settled)
        self._table.schedule_many(settled)
        self._wake.set()

    def _put_back(self, checks: list[Check]) -> None:
        """Checks of a call fenced at its start (our leases may have lapsed): due again at
        once, run after the renewal says which shards are still ours."""
        self.calls -= 1
        now = self._clock()
        for check in checks:
            check.running = False
            self.running.discard(check)
            if self._table.by_hash.get(check.poke_hash) is check:
                self._table.schedule(check, now)
        self._wake.set()

    def _start_call(self, cls: type[BaseTrigger], checks: list[Check]) -> None:
        self.calls += 1
        task = asyncio.create_task(self._run_checks(cls, checks))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_checks(self, cls: type[BaseTrigger], checks: list[Check]) -> None:
        async with self._sem:
            if self._fenced():
                self._put_back(checks)
                return
            loaded = []
            for check in checks:
                try:
                    self._models.model(check)
                except Exception as exc:  # its kwargs, loaded unvalidated, are invalid
                    check.running = False
                    self._cannot_load(check, exc)
                else:
                    loaded.append(check)
            checks = loaded
            if not checks:
                self.calls -= 1
                self._wake.set()
                return
            results: list[Any]
            began = time.perf_counter()
            try:
                # asyncio.timeout: unlike wait_for on 3.11, no extra Task per call.
                async with asyncio.timeout(self._check_timeout):
                    results = list(await call_checks(cls, checks, self._ctx))
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
            if (hook := self._call_times.hook) is not None:
                hook(cls.classpath(), len(checks), time.perf_counter() - began)
        self.calls -= 1
        now = self._clock()
        settled: Settled = []
        for check, result in zip(checks, results, strict=True):
            check.running = False
            self.running.discard(check)
            self._settler.settle_into(check, result, now, settled)
        self._table.schedule_many(settled)
        self._wake.set()


# How a class is checked: its run() held open, in poke_many batches, through its push
# wait (check_once), or by poke.
_HELD, _BATCHED, _PUSH, _POKE = "held", "batched", "push", "poke"


def _way_of(cls: type[BaseTrigger]) -> str:
    if cls.held:
        return _HELD
    if cls.is_batched() and not cls.is_push():
        return _BATCHED
    return _PUSH if cls.is_push() else _POKE


async def call_checks(cls: type[BaseTrigger], checks: list[Check], ctx: CheckContext) -> Any:
    """One call checking ``checks`` (of class ``cls``): poke_many for a batch, else the one
    check's own way; the results in their order."""
    models = [c.model() for c in checks]
    if len(checks) > 1 or (cls.is_batched() and not cls.is_push()):
        return await cls.poke_many(models, ctx)
    # No push_wait: the call is already bounded by check_timeout.
    return [await check_once(models[0], ctx)]


class _Resume:
    """The rest of a check coroutine that waited at its first step: awaiting this goes
    on where it stopped, passing its waits up to the Task (what ``await`` would do)."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Any, first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self._coro, self._first
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    value = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as done:
                    return done.value

    def close(self) -> None:
        self._coro.close()
