"""The triggerer's memory: one compact record per distinct check, and a schedule of due times.

No coroutine per trigger: a check is a small record (its trigger class and validated
kwargs, its subscribers, when it is due) and a schedule entry, so a million waits cost
memory, not scheduler work. Memory per wait is a budget (1 KiB at a million), so:

* the trigger's pydantic model is not held: a row's kwargs are validated when it loads,
  and the record keeps the class and the kwargs' JSON (equal JSON shared); the model is
  rebuilt (~2 us) only while the check runs (:meth:`Check.model`), then let go;
* a check with one subscriber (the common case) holds it directly, a dict only from two;
* intervals are interned, and the schedule is a **wheel of 10 ms ticks**: each tick a
  list of the poke hashes due in it (the record's own str). An entry costs a pointer,
  scheduling one is an append and taking one a pop: no tuple allocated per check, no
  comparisons of a heap (a heap of ``(due, poke_hash)`` tuples cost ~2 us a check in
  its pops and pushes at 19,000 waits, a fifth of a check). A check is taken in the first
  tick at or after its due time, never before it; the checking loop gathers a tick's
  checks anyway (``check_tick``).

After a load the records are frozen out of the collector's generations
(:func:`freeze_held`), so a full collection never walks the held waits.
"""

from __future__ import annotations

import gc
import heapq
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from triggers.base import BaseTrigger
from triggers.limits import kwargs_over_limit
from triggers.registry import TriggerLoadError, load_trigger

from .splitdict import SplitDict
from .waitref import wait_sum


@dataclass(slots=True)
class Subscriber:
    # The wait's key (triggerer/waitref.py): a task's row id, or a start or run wait packed.
    task_row: int
    trigger_id: int
    interval: float
    resumable: bool


_INTERVALS: dict[float, float] = {}


def _interned(interval: float) -> float:
    """One float object per distinct interval (a million waits share a few)."""
    if len(_INTERVALS) > 4096:  # intervals are few; a flood of odd ones is not kept
        return interval
    return _INTERVALS.setdefault(interval, interval)


class Check:
    """One distinct check: what to check, who waits on it, when it is due next."""

    __slots__ = (
        "_model",
        "_subs",
        "checks",
        "cls",
        "due",
        "failures",
        "interval",
        "kwargs",
        "last_result",
        "poke_hash",
        "running",
        "shard",
        "valid",
    )

    def __init__(
        self,
        poke_hash: str,
        trigger: BaseTrigger | tuple[type[BaseTrigger], str],
        shard: int,
        *,
        interval: float = 60.0,
        valid: bool = True,
    ) -> None:
        self.poke_hash = poke_hash
        # False: the kwargs were not validated yet (a big load defers that to the first
        # build, see :meth:`model`); the check has exactly one subscriber until they are.
        self.valid = valid
        if isinstance(trigger, BaseTrigger):
            self.cls: type[BaseTrigger] = type(trigger)
            self.kwargs: str = trigger.model_dump_json()
        else:
            self.cls, self.kwargs = trigger
        self.shard = shard
        self._subs: Subscriber | dict[int, Subscriber] | None = None
        self.interval = _interned(interval)
        self.due = 0.0
        self.checks = 0
        self.failures = 0
        self.running = False
        # What the last check said, to log a change at once: the interval for "not yet"
        # (a shared float, no new string per check), the line of a failure.
        self.last_result: object = None
        self._model: BaseTrigger | None = None

    # -- the trigger, only while it is checked ------------------------------------------

    def model(self) -> BaseTrigger:
        """The trigger object, rebuilt from the validated kwargs and kept until
        :meth:`release` (the settler calls it once the result is settled)."""
        if self._model is None:
            self._model = self._build()
        return self._model

    def _build(self) -> BaseTrigger:
        """The model; :class:`TriggerLoadError` if kwargs never validated fail to (or are
        over the size limit: a row written behind the store's back, which a deferral
        would have refused)."""
        if not self.valid:
            refused_if_oversize(self.kwargs)
        try:
            model = self.cls.model_validate_json(self.kwargs)
        except ValueError:  # the JSON mode refused: as a load does (it says why if it fails)
            if self.valid:
                return self.cls.model_validate(json.loads(self.kwargs))
            model = load_trigger(self.cls.classpath(), self.kwargs)
        if not self.valid:
            self._validated(model)
        return model

    def _validated(self, model: BaseTrigger) -> None:
        """The first build of kwargs loaded unvalidated: the interval the loader read from
        the JSON (see loading.py) is now the model's own."""
        self.valid = True
        sub = self._subs
        if isinstance(sub, Subscriber) and sub.interval != model.poke_interval:
            sub.interval = _interned(model.poke_interval)
            self.interval = sub.interval

    def use(self, model: BaseTrigger) -> BaseTrigger:
        """Check with ``model`` (built earlier from these kwargs) until :meth:`release`."""
        self._model = model
        return model

    def release(self) -> None:
        self._model = None

    def validate(self) -> None:
        """Validate kwargs loaded unvalidated (:class:`TriggerLoadError` if they fail)."""
        if not self.valid:
            self._build()

    @property
    def trigger(self) -> BaseTrigger:
        """The trigger object (rebuilt when it is not being checked: a copy)."""
        return self._model if self._model is not None else self._build()

    # -- subscribers ----------------------------------------------------------------------

    @property
    def subscribers(self) -> Mapping[int, Subscriber]:
        """task row -> subscriber (read-only: change them through the table)."""
        subs = self._subs
        if subs is None:
            return {}
        if isinstance(subs, Subscriber):
            return {subs.task_row: subs}
        return subs

    def subscriber(self, task_row: int) -> Subscriber | None:
        subs = self._subs
        if isinstance(subs, Subscriber):
            return subs if subs.task_row == task_row else None
        return None if subs is None else subs.get(task_row)

    def _add(self, sub: Subscriber) -> None:
        subs = self._subs
        if subs is None or (isinstance(subs, Subscriber) and subs.task_row == sub.task_row):
            self._subs = sub
        elif isinstance(subs, Subscriber):
            self._subs = {subs.task_row: subs, sub.task_row: sub}
        else:
            subs[sub.task_row] = sub

    def _remove(self, task_row: int) -> None:
        subs = self._subs
        if isinstance(subs, Subscriber):
            if subs.task_row == task_row:
                self._subs = None
        elif subs is not None:
            subs.pop(task_row, None)
            if len(subs) == 1:
                (self._subs,) = subs.values()
            elif not subs:
                self._subs = None

    def recompute_interval(self) -> None:
        """Shortest interval any subscriber asked for."""
        subs = self.subscribers
        if subs:
            self.interval = min(s.interval for s in subs.values())


def refused_if_oversize(kwargs: str) -> None:
    """Raise :class:`TriggerLoadError` (its task fails, saying the limit) for kwargs over
    the 64 KiB a deferral allows: a row written behind the store's back is refused when
    it loads, not held and checked until its timeout."""
    why = kwargs_over_limit(kwargs)
    if why is not None:
        raise TriggerLoadError(why)


_new_check = object.__new__


class CheckWatcher(Protocol):
    """What the push layer (triggerer/push.py) hears from the table, and its one say."""

    def added(self, check: Check) -> None: ...

    def removed(self, check: Check) -> None: ...

    def next_check(self, check: Check, now: float) -> float | None:
        """When a check that said "not yet" is due next; None: its own interval."""
        ...


class CheckTable:
    """poke_hash -> Check, plus the schedule of due checks."""

    def __init__(self) -> None:
        # The push layer, told when a distinct check is first held and when it is let go.
        self.watcher: CheckWatcher | None = None
        # Split, so that a million-wait load never stalls on one dict's growth.
        self.by_hash: SplitDict[str, Check] = SplitDict()
        self.by_row: SplitDict[int, Check] = SplitDict()
        # tick -> poke hashes due in it (_tick), and a heap of the ticks that have a list.
        # Entries name their check by poke_hash, not by reference (a list of str holds
        # nothing the collector must walk). An entry is current while its check's due
        # time falls in its tick and the check is not running (a rescheduled check
        # leaves a stale entry, skipped when reached).
        self._ticks: dict[int, list[str]] = {}
        self._tick_order: list[int] = []
        self._entries = 0  # in the lists, stale ones too (see compact)
        # While a load holds them, the first due times of new checks wait here: the
        # checker sees a load's checks together, not split by the moments it looked.
        self._holding = False
        self._held: list[tuple[float, str]] = []
        # Called with each check that leaves the table (a held run() is stopped then).
        self.on_forget: Callable[[Check], None] | None = None
        # shard -> [waits held, sum of their wait_sum]: kept as by_row changes, so that a
        # reconcile compares each shard with the database's in O(1) (loading.py).
        self._sums: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.by_hash)

    @property
    def subscriptions(self) -> int:
        return len(self.by_row)

    def shard_sum(self, shard: int) -> tuple[int, int]:
        """(waits held in ``shard``, their checksum): what ``shard_sums`` says of it when
        the table holds exactly its rows."""
        n, h = self._sums.get(shard, (0, 0))
        return n, h

    def _count(self, check: Check, task_row: int, trigger_id: int, sign: int) -> None:
        sums = self._sums.get(check.shard)
        if sums is None:
            sums = self._sums[check.shard] = [0, 0]
        sums[0] += sign
        sums[1] += sign * wait_sum(task_row, trigger_id)

    def subscribe(
        self,
        poke_hash: str,
        trigger: BaseTrigger | tuple[type[BaseTrigger], str],
        shard: int,
        sub: Subscriber,
        now: float,
        *,
        first_at: float | None = None,
    ) -> Check:
        """Add ``sub`` to the check of ``poke_hash`` (created if new, first due at
        ``first_at``, else the trigger's ``first_check_at(now)``)."""
        sub.interval = _interned(sub.interval)
        check = self.by_hash.get(poke_hash)
        if check is None:
            check = Check(poke_hash, trigger, shard, interval=sub.interval)
            refused_if_oversize(check.kwargs)  # before anything is held
            if first_at is None:
                first_at = (
                    trigger if isinstance(trigger, BaseTrigger) else check.trigger
                ).first_check_at(now)
            self.by_hash[poke_hash] = check
            self._schedule_new(check, first_at)
            if self.watcher is not None:
                self.watcher.added(check)
        old = self.by_row.get(sub.task_row)
        if old is not None and (old_sub := old.subscriber(sub.task_row)) is not None:
            self._count(old, sub.task_row, old_sub.trigger_id, -1)
        check._add(sub)
        self.by_row[sub.task_row] = check
        self._count(check, sub.task_row, sub.trigger_id, 1)
        if sub.interval < check.interval:
            check.interval = sub.interval
            # A newcomer in a hurry: check no later than its own interval from now.
            if check.due > now + sub.interval and not check.running:
                model = trigger if isinstance(trigger, BaseTrigger) else check.trigger
                self._schedule_new(check, model.next_check_at(now, sub.interval))
        return check

    def add_loaded(
        self,
        poke_hash: str,
        cls: type[BaseTrigger],
        kwargs: str,
        shard: int,
        sub: Subscriber,
        first_at: float,
    ) -> None:
        """:meth:`subscribe` for a big load's common row, its kwargs not validated yet (the
        first build does: see :meth:`Check.model`): a check not held yet, its one
        subscriber a task row not held either. The loader's hot path: no model built."""
        # Check.__init__'s work, less what this row does not need (~0.3 us of a million).
        check = _new_check(Check)
        check.poke_hash = poke_hash
        check.valid = False
        check.cls = cls
        check.kwargs = kwargs
        check.shard = shard
        check._subs = sub
        check.interval = sub.interval = _interned(sub.interval)
        check.checks = check.failures = 0
        check.running = False
        check.last_result = check._model = None
        self.by_hash[poke_hash] = check
        self.by_row[sub.task_row] = check
        self._schedule_new(check, first_at)
        if self.watcher is not None:
            self.watcher.added(check)
        self._count(check, sub.task_row, sub.trigger_id, 1)

    def _schedule_new(self, check: Check, at: float) -> None:
        if self._holding:
            check.due = at
            self._held.append((at, check.poke_hash))
        else:
            self.schedule(check, at)

    def unsubscribe(self, task_row: int) -> None:
        check = self.by_row.pop(task_row, None)
        if check is None:
            return
        if (sub := check.subscriber(task_row)) is not None:
            self._count(check, task_row, sub.trigger_id, -1)
        check._remove(task_row)
        if check._subs is None:
            if self.by_hash.get(check.poke_hash) is check:
                del self.by_hash[check.poke_hash]
                self._forgotten(check)
        else:
            check.recompute_interval()

    def drop(self, check: Check) -> None:
        """Forget a check and every subscription to it (it fired or failed for good)."""
        if self.by_hash.get(check.poke_hash) is check:
            del self.by_hash[check.poke_hash]
            self._forgotten(check)
        for row, sub in check.subscribers.items():
            if self.by_row.get(row) is check:
                del self.by_row[row]
                self._count(check, row, sub.trigger_id, -1)

    def _forgotten(self, check: Check) -> None:
        if self.on_forget is not None:
            self.on_forget(check)
        if self.watcher is not None:
            self.watcher.removed(check)

    def schedule(self, check: Check, at: float) -> None:
        check.due = at
        self._add(at, check.poke_hash)

    def _add(self, at: float, poke_hash: str) -> None:
        tick = _tick(at)
        hashes = self._ticks.get(tick)
        if hashes is None:
            hashes = self._ticks[tick] = []
            heapq.heappush(self._tick_order, tick)
        hashes.append(poke_hash)
        self._entries += 1

    def hold(self) -> None:
        """From now on, checks scheduled by :meth:`subscribe` are not due until
        :meth:`publish` (a load in progress: see loading.py)."""
        self._holding = True

    def publish(self, *, keep_holding: bool = False) -> None:
        """Put the held checks on the schedule (and stop holding, unless asked)."""
        held, self._held = self._held, []
        self._holding = keep_holding
        add = self._add
        for at, poke_hash in held:
            add(at, poke_hash)

    def schedule_many(self, entries: list[tuple[float, Check]]) -> None:
        """Reschedule many checks at once (a settled batch)."""
        add = self._add
        for at, check in entries:
            check.due = at
            add(at, check.poke_hash)

    def wake(self, hashes: Iterable[str], now: float, again: set[str]) -> int:
        """Make these checks due now (a push source heard of a change); one running now
        is added to ``again``, to run once more when it ends. How many were woken."""
        n = 0
        by_hash = self.by_hash
        for poke_hash in hashes:
            check = by_hash.get(poke_hash)
            if check is None:
                continue
            if check.running:
                again.add(poke_hash)
            elif check.due > now:
                self.schedule(check, now)
            n += 1
        return n

    def next_due(self) -> float | None:
        """When the first current entry is due: its tick's start (none before it is)."""
        self._discard_stale()
        if not self._tick_order:
            return None
        tick = self._tick_order[0]
        at = tick * TICK
        # The first float at which that tick has started: tick * 0.01 may land a hair
        # below it (on a monotonic clock's small numbers), and a wake-up then would find
        # nothing due and sleep another check_tick.
        while _tick_of_now(at) < tick:
            at = math.nextafter(at, math.inf)
        return at

    def pop_due(self, now: float, limit: int) -> Iterator[Check]:
        """Due checks, the earliest tick first; entries of dropped or rescheduled checks
        are skipped. An entry is taken off its list as it is given, so a caller may stop
        at any point and lose none.

        The caller marks each check ``running`` before asking for the next, so that a
        second entry for the same check is skipped too.
        """
        n = 0
        ticks, order, by_hash = self._ticks, self._tick_order, self.by_hash
        last = _tick_of_now(now)
        while order and n < limit:
            tick = order[0]
            if tick > last:
                return
            hashes = ticks[tick]
            while hashes:
                if n >= limit:
                    return
                poke_hash = hashes.pop()
                self._entries -= 1
                check = by_hash.get(poke_hash)
                if check is None or check.running or _tick(check.due) != tick:
                    continue  # stale
                n += 1
                yield check
            # Empty now (a check scheduled into it meanwhile was appended and taken).
            del ticks[tick]
            heapq.heappop(order)

    def _discard_stale(self) -> None:
        ticks, order, by_hash = self._ticks, self._tick_order, self.by_hash
        while order:
            tick = order[0]
            hashes = ticks[tick]
            while hashes:
                check = by_hash.get(hashes[-1])
                if check is not None and not check.running and _tick(check.due) == tick:
                    return
                hashes.pop()
                self._entries -= 1
            del ticks[tick]
            heapq.heappop(order)

    def compact(self) -> None:
        """Drop stale entries when they outnumber the live ones (many reschedules of
        checks that were dropped or moved earlier leave entries behind)."""
        if self._entries <= 2 * len(self.by_hash) + 1024:
            return
        live: dict[int, list[str]] = {}
        for tick, hashes in self._ticks.items():
            for poke_hash in hashes:
                check = self.by_hash.get(poke_hash)
                if check is not None and _tick(check.due) == tick:
                    live.setdefault(tick, []).append(poke_hash)
        self._ticks = live
        self._tick_order = sorted(live)
        self._entries = sum(map(len, live.values()))


# The schedule's resolution: a check is taken in the first tick at or after its due time.
TICK = 0.01
_PER_S = 100  # ticks a second (1 / TICK, exact)


def _tick(at: float) -> int:
    """The tick a check due at ``at`` is taken in: the first to start at or after it."""
    return math.ceil(at * _PER_S)


def _tick_of_now(now: float) -> int:
    """The last tick started by ``now``: every tick up to it is due."""
    return math.floor(now * _PER_S)


def freeze_held() -> None:
    """Move every object alive now out of the collector's generations.

    The held waits live until they fire; a full collection would walk all of them (a
    second-long stall at a million) and free none. Frozen objects are still freed by
    reference counting when dropped; only a reference cycle among them would outlive its
    use, and the records hold none. The young generations are collected first, so that
    cyclic garbage made meanwhile (it is young: a freeze follows every chunk loaded) is
    freed rather than frozen.
    """
    gc.collect(1)
    gc.freeze()
