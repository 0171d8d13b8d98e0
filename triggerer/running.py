"""Running checks: due checks off the schedule into calls, and each result into the outbox.

The schedule is the queue: a due check stays there until a call can take it, instead of
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
import gc
import json
import time
import traceback
from collections.abc import Callable, Generator, Iterable
from typing import Any

from triggers.base import BaseTrigger, TransientError, TriggerEvent, clip
from triggers.checking import CheckContext, check_once

from .checks import Check, CheckTable
from .store import Fire, Waits
from .writing import Outbox

# Bounds on a wait's sampled check log (see _log_check): lines past the first CHANGED_LINES
# checks come only at powers of two, and each line is clipped to LOG_LINE characters.
CHANGED_LINES = 64
LOG_LINE = 1000

TRANSIENT = (TransientError, OSError, TimeoutError, ConnectionError)
# While a connection's checks back off, one of them (its probe) retries at least this
# often, so a server that comes back is seen within seconds; its first success resets
# the backoff of every wait on that connection (BaseTrigger.connection_key).
PROBE_EVERY = 5.0

# A check due at least this often keeps its trigger object between checks (at most
# KEEP_MODELS of them, the oldest let go first): 19,000 waits on a 5 s interval would
# otherwise validate their JSON again 3,800 times a second (~2-3 us each). A million waits
# on a minute keep none, so their memory stays a compact record each.
KEEP_INTERVAL = 30.0
KEEP_MODELS = 32_768

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
        outbox: Outbox,
        *,
        wake: asyncio.Event,
        clock: Callable[[], float],
        max_concurrency: int,
        wave: int,
        batch_size: int,
        check_timeout: float,
        max_backoff: float,
        fenced: Callable[[], bool] = lambda: False,
        round_size: int = 500,
    ) -> None:
        self._table = table
        self._ctx = ctx
        self._outbox = outbox
        self._wake = wake  # set when a call ends: its checks are back on the schedule
        self._clock = clock
        self._max_concurrency = max_concurrency
        self._wave = wave
        self._batch_size = batch_size
        self._check_timeout = check_timeout
        self._max_backoff = max_backoff
        # True while our leases may have lapsed: a call dispatched before a pause does
        # not start after it (the renewal first says whether the shard is still ours).
        self._fenced = fenced
        self._round_size = round_size  # plain checks per round (~2 ms of work)
        self._sem = asyncio.Semaphore(max_concurrency)
        self.calls = 0  # check calls in flight (one call may check a batch)
        self.running: set[Check] = set()  # read by the watchdog's thread: who blocks the loop
        self.current: Check | None = None  # the check being called in a round, likewise
        self.tasks: set[asyncio.Task[None]] = set()
        self.checks_done = 0
        # connection key -> poke_hashes backing off on it; the first is the probe.
        self._backing_off: dict[str, dict[str, None]] = {}
        self.checks_failed = 0
        self.events_fired = 0
        self.unloadable = 0  # checks whose kwargs, loaded unvalidated, failed to validate
        # How each class is checked (asked once: two class calls a check add up at 3,800/s).
        self._ways: dict[type[BaseTrigger], str] = {}
        self._since_young_collection = 0  # checks dispatched since (see dispatch())
        # poke_hash -> (the check, its trigger) for frequent checks (see KEEP_INTERVAL).
        self._kept: dict[str, tuple[Check, BaseTrigger]] = {}
        # Called after each check call with (trigger classpath, triggers checked, seconds).
        self.on_check_call: Callable[[str, int, float], None] | None = None
        # Starts holding a check whose class is `held` (triggerer/holding.py).
        self.hold: Callable[[Check], None] | None = None
        # poke_hashes with an early call in flight (check_early): one at a time each.
        self._early: set[str] = set()

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
            if way is _HELD and self.hold is not None:
                self.hold(check)  # waits, not checks: no room taken
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
        hook = self.on_check_call
        settled: list[tuple[float, Check]] = []
        waiting: tuple[Check, Any, Any] | None = None
        slice_end = time.perf_counter() + _ROUND_SLICE
        try:
            for i, check in enumerate(checks):
                began = time.perf_counter()
                if began >= slice_end:
                    self._hand_on(checks[i:])
                    break
                try:
                    model = self._model(check)
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
                self._settle(check, result, self._clock(), settled)
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

    def _model(self, check: Check) -> BaseTrigger:
        """The check's trigger for this check: kept from the last one if it is frequent,
        else built from its JSON (and kept, if frequent). Let go by ``check.release()``."""
        kept = self._kept.get(check.poke_hash)
        if kept is not None and kept[0] is check:
            return check.use(kept[1])
        model = check.model()
        if check.interval <= KEEP_INTERVAL:
            if len(self._kept) >= KEEP_MODELS:
                # The oldest out (a dropped check's entry among them).
                del self._kept[next(iter(self._kept))]
            self._kept[check.poke_hash] = (check, model)
        return model

    def _drop(self, check: Check) -> None:
        """The check is over (fired, failed): out of the table, its kept trigger too."""
        self._table.drop(check)
        kept = self._kept.get(check.poke_hash)
        if kept is not None and kept[0] is check:
            del self._kept[check.poke_hash]

    def _cannot_load(self, check: Check, exc: Exception) -> None:
        """A check loaded unvalidated whose kwargs fail to validate (a TriggerLoadError
        saying why): its one task fails, as the load would have failed it (loading.py)."""
        self.unloadable += 1
        self.running.discard(check)
        self._drop(check)
        self._outbox.fail(_waits(check), f"cannot load trigger: {exc}")

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
        if self.on_check_call is not None:
            self.on_check_call(check.cls.classpath(), 1, time.perf_counter() - began)
        check.running = False
        self.running.discard(check)
        settled: list[tuple[float, Check]] = []
        self._settle(check, result, self._clock(), settled)
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

    def check_early(self, hashes: Iterable[str]) -> None:
        """Checks pushed by name while a call of theirs is in flight are checked again
        at once, alongside it, one call per class, instead of after it.

        A safety poll's call lists whole folders (10,000 S3 waits: ten listings of 1,000
        keys, seconds on a busy server): a wait whose object lands meanwhile would wait
        for that listing, then run again. The early call answers it from what the push
        said (an S3 notification's size, a fresh directory read). Only an event from it
        is acted on, and only while the check is still held: the call in flight settles
        everything else as before (the hub runs the check once more after it), and
        whichever of the two fires first drops the check, so the other's event is
        ignored (no double fire).
        """
        by_class: dict[type[BaseTrigger], list[Check]] = {}
        by_hash = self._table.by_hash
        for poke_hash in hashes:
            check = by_hash.get(poke_hash)
            if check is None or check not in self.running or poke_hash in self._early:
                continue
            self._early.add(poke_hash)
            by_class.setdefault(check.cls, []).append(check)
        size = self._batch_size
        for cls, checks in by_class.items():
            for i in range(0, len(checks), size):
                task = asyncio.create_task(self._run_early(cls, checks[i : i + size]))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _run_early(self, cls: type[BaseTrigger], checks: list[Check]) -> None:
        try:
            if self._fenced():
                return  # the calls in flight and the runs after them cover these checks
            began = time.perf_counter()
            try:
                async with asyncio.timeout(self._check_timeout):
                    results = list(await self._call(cls, checks))
            except Exception:  # the same checks are in flight: their own call says it
                return
            if self.on_check_call is not None:
                self.on_check_call(cls.classpath(), len(checks), time.perf_counter() - began)
            if len(results) != len(checks):
                return
            now = self._clock()
            settled: list[tuple[float, Check]] = []
            for check, result in zip(checks, results, strict=True):
                if isinstance(result, TriggerEvent):
                    self._settle(check, result, now, settled)
            if settled:  # an event reschedules nothing; _settle's contract all the same
                self._table.schedule_many(settled)
        finally:
            self._early.difference_update(c.poke_hash for c in checks)

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
                    self._model(check)
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
        settled: list[tuple[float, Check]] = []
        for check, result in zip(checks, results, strict=True):
            check.running = False
            self.running.discard(check)
            self._settle(check, result, now, settled)
        self._table.schedule_many(settled)
        self._wake.set()

    async def _call(self, cls: type[BaseTrigger], checks: list[Check]) -> Any:
        models = [c.model() for c in checks]
        if len(checks) > 1 or (cls.is_batched() and not cls.is_push()):
            return await cls.poke_many(models, self._ctx)
        # No push_wait: the call is already bounded by check_timeout.
        return [await check_once(models[0], self._ctx)]

    def settle(self, check: Check, result: Any, now: float) -> None:
        """Settle one check's result from outside a round (a held trigger's event): fire,
        fail, or put it back on the schedule."""
        settled: list[tuple[float, Check]] = []
        self._settle(check, result, now, settled)
        self._table.schedule_many(settled)

    def _settle(
        self, check: Check, result: Any, now: float, settled: list[tuple[float, Check]]
    ) -> None:
        """Act on one result; a check to run again is appended to ``settled`` (its next
        due time), for the caller to put back on the schedule with the rest of its batch."""
        try:
            if self._table.by_hash.get(check.poke_hash) is not check:
                return  # dropped meanwhile (shard lost, every subscriber gone)
            try:
                self._settle_result(check, result, now, settled)
            except Exception as exc:  # the trigger's own code (payload, next_check_at) failed
                self.checks_failed += 1
                self._drop(check)
                self._outbox.fail(
                    _waits(check), f"cannot handle the result of {_where(check)}: "
                                   f"{type(exc).__name__}: {exc}"
                )  # fmt: skip
        finally:
            check.release()  # the record keeps no model between checks (see _model)

    def _settle_result(
        self, check: Check, result: Any, now: float, settled: list[tuple[float, Check]]
    ) -> None:
        check.checks += 1
        self.checks_done += 1
        if result is None:  # not yet: the hot path, no string built unless it is logged
            check.failures = 0
            if self._backing_off:  # a server was down: this success may end its outage
                self._connection_back(check, now)
            n = check.checks
            if n & (n - 1) == 0 or check.last_result is not check.interval:
                self._outbox.log(
                    check.subscribers,
                    f"checked {_where(check)}: not yet; next in {check.interval:g} s",
                )
            check.last_result = check.interval
            settled.append((self._next_at(check, now), check))
            return
        where = _where(check)
        if isinstance(result, TriggerEvent):
            self._connection_back(check, now)
            if result.error:
                msg = f"trigger {where} reported an error: {result.error}"
            else:
                msg = f"trigger fired: {where} (after {check.checks} checks)"
            payload = json.dumps(result.payload)  # before anything is dropped: it may fail
            self._drop(check)
            self.events_fired += 1
            self._outbox.fire(
                Fire(_waits(check), payload, msg, error=msg if result.error else None)
            )
            return
        if isinstance(result, BaseException) and not isinstance(result, TRANSIENT):
            self.checks_failed += 1
            self._drop(check)
            tb = "".join(traceback.format_exception(result)).rstrip()
            self._outbox.fail(
                _waits(check), f"trigger {where} raised {type(result).__name__}: {result}\n{tb}"
            )
            return
        if isinstance(result, BaseException):
            self.checks_failed += 1
            check.failures += 1
            delay = min(self._max_backoff, check.interval * 2 ** min(check.failures, 10))
            if self._is_probe(check):
                delay = min(delay, max(PROBE_EVERY, check.interval))
            line = (
                f"check of {where} failed ({type(result).__name__}: {result}); "
                f"retry {check.failures} in {delay:g} s"
            )
            self._log_check(check, line, force=check.failures == 1)
            settled.append((now + delay, check))
            return
        # Anything else is "not yet" too (a poke returning a falsy non-None value).
        check.failures = 0
        self._connection_back(check, now)
        line = f"checked {where}: not yet; next in {check.interval:g} s"
        self._log_check(check, line)
        settled.append((self._next_at(check, now), check))

    def _next_at(self, check: Check, now: float) -> float:
        """Its own interval, or the push layer's say (the slow safety poll of a check whose
        source is live; at once for one pushed while it ran)."""
        watcher = self._table.watcher
        if watcher is not None:
            at = watcher.next_check(check, now)
            if at is not None:
                return at
        return check.model().next_check_at(now, check.interval)

    def _is_probe(self, check: Check) -> bool:
        """Note a check backing off on its connection; whether it is that connection's probe
        (the first one, or the next when the probe is gone)."""
        key = check.trigger.connection_key()
        if key is None:
            return False
        waiting = self._backing_off.setdefault(key, {})
        waiting[check.poke_hash] = None
        for poke_hash in list(waiting):
            if self._table.by_hash.get(poke_hash) is not None:
                return poke_hash == check.poke_hash
            del waiting[poke_hash]  # fired, failed or unsubscribed meanwhile
        return True

    def _connection_back(self, check: Check, now: float) -> None:
        """A check on a connection succeeded: its waits backing off are checked at once."""
        key = check.trigger.connection_key()
        waiting = self._backing_off.pop(key, None) if key is not None else None
        if not waiting:
            return
        for poke_hash in waiting:
            other = self._table.by_hash.get(poke_hash)
            if other is not None and other is not check and other.failures and not other.running:
                other.failures = 0
                self._table.schedule(other, now)

    def _log_check(self, check: Check, line: str, force: bool = False) -> None:
        # Sampled so that a six-hour wait stays readable: checks 1, 2, 4, 8, 16, ..., and a
        # changed result, but only for the first CHANGED_LINES checks: a result that differs
        # every time (a message with a counter) must not write a line per check for 14 hours.
        # So a wait gets at most CHANGED_LINES + log2(checks) lines of LOG_LINE characters.
        n = check.checks
        if n & (n - 1) == 0 or ((force or line != check.last_result) and n <= CHANGED_LINES):
            self._outbox.log(check.subscribers, clip(line, LOG_LINE))
        check.last_result = line


# How a class is checked: its run() held open, in poke_many batches, through its push
# wait (check_once), or by poke.
_HELD, _BATCHED, _PUSH, _POKE = "held", "batched", "push", "poke"


def _way_of(cls: type[BaseTrigger]) -> str:
    if cls.held:
        return _HELD
    if cls.is_batched() and not cls.is_push():
        return _BATCHED
    return _PUSH if cls.is_push() else _POKE


def _where(check: Check) -> str:
    return check.model().describe()


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


def _waits(check: Check) -> Waits:
    """The tasks a check answers, each with the trigger row it waits on."""
    return {row: sub.trigger_id for row, sub in check.subscribers.items()}
