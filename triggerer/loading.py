"""Loading waits: rows of ``TriggererStore.load_triggers`` become subscriptions in the table.

An incremental load reads the waits with trigger ids above the newest one seen. A full
reload (at start, every ``reload_every`` and whenever the shards change) reconciles the
table with the rows: it reads a few shards per query, so that 100,000 rows never sit in
memory at once (their pages would stay in the RSS) nor hold the connection for half a
second, and it drops the subscriptions whose rows are gone (resumed, timed out or failed
elsewhere). Rows written during a reload get ids above the newest id read before it,
where the next incremental load starts; it skips those the reload already took.

Equal (classpath, kwargs) are parsed once per query. A row that cannot become a trigger
(classpath not allow-listed, kwargs failing validation, a module that fails to import)
or whose trigger cannot be scheduled fails its own task, through the outbox.
"""

from __future__ import annotations

import asyncio
import math
import operator
import re
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from executor.store import Row
from triggers.base import SHARDS, BaseTrigger
from triggers.registry import TriggerLoadError, load_trigger, resolve, trigger_class

from .checks import Check, CheckTable, Subscriber, freeze_held
from .leasing import LeasedShards
from .settling import waits_of
from .splitdict import SplitDict
from .store import TriggererStore
from .waitref import WaitKind, Waits, pack
from .writing import Outbox

# Rows handled between yields to the loop: at most this many, and no longer than
# _LOAD_SLICE (looked at every 64 rows): a million rows must not stall it, on a busy
# machine either.
_ROWS_PER_YIELD = 1000
_LOAD_SLICE = 0.005
# Rows a query returns at most, as far as shards allow (a shard is read whole): at a
# million waits four shards are 62,500 rows, which hold SQLite's one connection, and the
# fires waiting for it, for over a second.
_ROWS_PER_QUERY = 20_000
# A full load of at least 1/_WINDOWS_FROM_SHARE of all shards reads windows of trigger ids,
# not groups of shards (load_trigger_range says why).
_WINDOWS_FROM_SHARE = 4
# A load that has taken this many rows wakes the checker after each further chunk.
_WAKE_AFTER_ROWS = 50_000
# The held records are frozen out of the collector every this many rows: often enough
# that a full collection during a long load walks few of them, seldom enough that the
# young collection before each freeze costs little (it walks the next query's rows too).
_ROWS_PER_FREEZE = 16_000
# A big load's first checks are spread at this rate at most (over at most their
# interval) rather than all due at once: a million due together would be a backlog of a
# minute that every new check (a 1 s probe too) waits behind, and checks competing with
# the load itself. A load of SPREAD_ABOVE rows or fewer is not spread: checked as one
# burst it is done within seconds (in 5 ms slices), and a burst costs less per check
# than a steady trickle (a wake-up serves many checks), cycle after cycle.
FIRST_CHECKS_PER_S = 10_000
# A big load's first guess of its own speed (rows a second), before its first page is in.
_GUESS_ROWS_PER_S = 150_000
SPREAD_ABOVE = 50_000
# The load statements' columns the loader reads, in the order it unpacks them.
_COLUMNS = (
    "trigger_id", "classpath", "kwargs", "poke_hash", "shard",
    "wait_kind", "wait_id", "next_method", "not_before",
)  # fmt: skip


class Loader:
    def __init__(
        self,
        ops: TriggererStore,
        table: CheckTable,
        outbox: Outbox,
        *,
        shards_per_query: int,
        clock: Callable[[], float],
        wake: asyncio.Event | None = None,
    ) -> None:
        self._ops = ops
        self._wake = wake  # set after each chunk of a long load: its checks may start
        self._taken = 0
        self._unfrozen = 0  # rows taken since the last freeze
        self._spreading = False  # this load's first checks are spread (see _Spread)
        self._table = table
        self._outbox = outbox
        self._shards_per_query = shards_per_query
        self._clock = clock
        self._max_trigger_id = 0  # where the next incremental load starts
        self._loaded_beyond: set[int] = set()  # trigger ids above a full reload's `newest`
        self._max_release_id = 0  # the newest operator release read (wait_release)
        self.unloadable = 0  # rows failed because they could not become a trigger
        # The shards this triggerer leases, as the leases keep them (the live set, changed
        # in place): a load pages over a snapshot of them and awaits between pages, and a
        # renewal may give some away meanwhile (leasing.py).
        self._owned: Collection[int] = ()
        # What the last full load looked at: the leases' takings then (shards taken since
        # are read again), and the shards the change log named that it has not compared yet.
        self._takings = 0
        self._dirty: set[int] = set()
        # classpath -> what a row of it needs (or why it cannot load), for one load.
        self._classes: dict[str, _Kind | TriggerLoadError] = {}

    async def load(self, shards: Collection[int], *, full: bool) -> None:
        """Read the waits of ``shards``: all of them (``full``) or the new ones.

        ``shards`` is the leases' live set: a row of a shard no longer in it when the row
        arrives is not taken, and a full load ends by forgetting what is held of shards
        not in it, so the table holds exactly the waits of the shards leased."""
        self._owned = shards
        ordered = sorted(shards)
        if not ordered:
            await self._forget_unowned()
            return
        # The leases' takings as they were when ``ordered`` was: a shard taken during the
        # awaits below is not in it, and must still count as new at the next load.
        takings = shards.takings if isinstance(shards, LeasedShards) else 0
        self._taken = 0  # rows of this load so far
        self._unfrozen = 0
        self._spreading = False
        # Its new checks become due together at the end (or chunk by chunk once it is
        # big): the checker never sees half of a small load, so batches are not split.
        self._table.hold()
        self._classes = {}  # the allow-list may have changed since the last load
        if full and not self._table.subscriptions:
            # A first load: what the process made so far (its imports, a few hundred
            # thousand objects) is frozen as the held records are, before the rows come:
            # the first full collection of a big load walked it all in one step (30 ms).
            freeze_held()
        try:
            await self._load(ordered, full=full, takings=takings)
        finally:
            self._table.publish()
        if self._unfrozen:
            self._unfrozen = 0
            freeze_held()

    async def _load(self, ordered: list[int], *, full: bool, takings: int) -> None:
        newest = await self._ops.max_trigger_id() if full else 0
        if full:
            self._loaded_beyond.clear()
            # The rows read now reflect every release so far: start after them.
            self._max_release_id = max(self._max_release_id, await self._ops.max_release_id())
        else:
            await self._drop_released()
        look = await self._to_look_at(ordered) if full else ordered
        # A first load has nothing to reconcile: no set of a million rows seen.
        # Split as the table's indexes are: a set of a million grows in one long step too.
        seen: SplitDict[int, None] | None = SplitDict() if self._table.by_row else None
        step = self._shards_per_query
        if full and seen is not None:
            # Only the shards whose waits differ from those held are read again: an
            # unchanged million is one aggregate query, not a million rows parsed here.
            # A few shards per query, fewer the more each holds (see _fitting): at a million
            # waits all 64 at once hold the connection (and the fires waiting for it)
            # for seconds.
            table, changed = self._table, []
            step = _fitting(table.subscriptions / len(ordered), self._shards_per_query)
            for first in range(0, len(look), step):
                group = look[first : first + step]
                began = time.perf_counter()
                sums = await self._ops.shard_sums(group)
                changed += [s for s in group if table.shard_sum(s) != sums.get(s, (0, 0))]
                if step < len(look):
                    await pace(time.perf_counter() - began)
            ordered = changed
        elif full:
            ordered = look
        reread = set(ordered)
        pages: _ShardGroups | _IdWindows
        if full and len(ordered) * _WINDOWS_FROM_SHARE >= SHARDS:
            pages = _IdWindows(ordered, newest, _ROWS_PER_QUERY * SHARDS // len(ordered))
        elif full:
            pages = _ShardGroups(ordered, 0, step, most=self._shards_per_query)
        else:
            pages = _ShardGroups(ordered, self._max_trigger_id, len(ordered))  # new rows: few

        # The next page's query runs in the driver's thread while this page's rows are
        # taken on the loop: the reading and the parsing overlap.
        ahead: asyncio.Future[list[Row]] | None = None
        spread: _Spread | None = None
        page = pages.next()
        first = True
        try:
            while page is not None:
                rows = await (ahead or self._ops.load_triggers(*page.query))
                ahead = None
                pages.took(len(rows))
                if first:
                    # Shards are hashes: the first page's share (of the shards or of the
                    # ids) tells the whole load's size.
                    spread = _Spread.of(round(len(rows) / page.share), self._clock())
                    self._spreading = spread is not None
                    first = False
                page = pages.next()
                if page is not None:
                    ahead = asyncio.ensure_future(self._ops.load_triggers(*page.query))
                await self._take(rows, full=full, newest=newest, seen=seen, spread=spread)
                if spread is not None:
                    spread.read(self._taken, self._clock())
                del rows
        finally:
            if ahead is not None and not ahead.done():
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)
        if full:
            self._max_trigger_id = max(self._max_trigger_id, newest)
            self._table.compact()
            # Looked at: clean until the change log names them or they are taken again.
            self._takings = takings
            self._dirty.difference_update(look)
        if full:
            await self._forget_unowned()
        if full and seen is not None and reread:
            # Resumed, timed out or failed elsewhere. Read a 64th at a time (a million rows
            # in one pass would stall the loop); one seen now and gone by the next part is
            # simply not there any more.
            by_row = self._table.by_row
            for rows_held in by_row.key_chunks():
                for task_row in rows_held:
                    check = by_row.get(task_row)
                    if check is not None and check.shard in reread and task_row not in seen:
                        self._table.unsubscribe(task_row)
                await asyncio.sleep(0)

    async def _to_look_at(self, ordered: list[int]) -> list[int]:
        """The shards a full load must look at, of ``ordered``: those taken since the last
        full load (read in full, or compared by checksum) and those the change log names
        (compared). An idle
        reconcile looks at none: one statement, no row read. Shards given as a plain
        collection (not the leases' set) are all looked at."""
        owned = self._owned
        if not isinstance(owned, LeasedShards):
            return ordered
        taken = {s for s in ordered if owned.taken_at.get(s, 0) > self._takings}
        # Those are looked at whole (read, or compared by checksum): their change log tells
        # this load nothing, and read back a bulk write's million rows cost seconds before
        # the first checks. Dropped unread before the looking (a change committed later has
        # its own row), and named for the repair after the load, which searches them whole
        # for what the rows would have told it. Those still leased only: one given away
        # is its new owner's, and its log too.
        if dropped := [s for s in ordered if s in taken and s in owned]:
            await self._ops.drop_wait_changes(dropped)
            self._ops.changes.unread.update(dropped)
        if len(taken) == len(ordered):
            return ordered  # a first load, a takeover of all: no checksum to compare
        # Taken before anything is read: a change committed later has its own row.
        changes = await self._ops.take_wait_changes([s for s in ordered if s not in taken])
        self._dirty |= changes.shards
        changes.shards.clear()
        self._dirty.intersection_update(ordered)  # a shard given away is read whole if retaken
        return [s for s in ordered if s in taken or s in self._dirty]

    def _unowned(self) -> list[int]:
        """Shards not leased of which the table holds waits (their sums say so in O(64))."""
        owned = self._owned
        return [s for s in range(SHARDS) if s not in owned and self._table.shard_sum(s)[0]]

    async def _forget_unowned(self) -> None:
        """Forget the checks of shards given away while the load ran, a 64th of the table
        at a time (the leases forgot theirs at the renewal; a row of theirs already in
        flight may have landed since). Normally there are none: one sum per shard says so."""
        if not (gone := set(self._unowned())):
            return
        table = self._table
        for checks in table.by_hash.value_chunks():
            for check in checks:
                if check.shard in gone:
                    table.drop(check)
            await asyncio.sleep(0)

    async def _drop_released(self) -> None:
        """Unsubscribe the waits an operator ended since the last look (cancel, clear)."""
        for r in await self._ops.released_waits(self._max_release_id):
            self._max_release_id = r["id"]
            check = self._table.by_row.get(r["task_row"])
            if check is not None:
                sub = check.subscriber(r["task_row"])
                if sub is not None and sub.trigger_id == r["trigger_id"]:
                    self._table.unsubscribe(r["task_row"])

    async def _take(
        self,
        rows: Sequence[Row],
        *,
        full: bool,
        newest: int,
        seen: SplitDict[int, None] | None,
        spread: _Spread | None = None,
    ) -> None:
        table = self._table
        now = self._clock()
        start = self._taken  # this load's rows before these (a spread check's place)
        # Equal (classpath, kwargs) are validated once; the table keeps the class and the
        # validated JSON (one shared str), not the model (see checks.py).
        parsed: dict[tuple[str, str], _Parsed | TriggerLoadError] = {}
        by_row, by_hash = table.by_row, table.by_hash
        loaded_beyond = self._loaded_beyond
        classes = self._classes
        texts: dict[str, str] = {}
        chunk_start = 0  # the first row not yet settled
        slice_end = time.perf_counter() + _LOAD_SLICE
        task = WaitKind.TASK.value  # a plain str: compared each row, ~10 ns less than the member
        owned = self._owned  # live: a renewal during this load's awaits changes it
        for i, row in enumerate(_in_column_order(rows)):
            if i & 63 == 63 and (
                i - chunk_start >= _ROWS_PER_YIELD or time.perf_counter() >= slice_end
            ):
                self._settled(i - chunk_start)
                chunk_start = i
                await asyncio.sleep(0)
                slice_end = time.perf_counter() + _LOAD_SLICE
            (trigger_id, classpath, kwargs, poke_hash, shard, wait_kind, wait_id, next_method,
             not_before) = row  # fmt: skip
            if shard not in owned:
                continue  # given away while the page was read: its new owner loads it
            # The wait's key (most rows are tasks': their key is their id).
            task_row = wait_id if wait_kind == task else pack(wait_kind, wait_id)
            if seen is not None:
                seen[task_row] = None
            if full:
                if trigger_id > newest:
                    loaded_beyond.add(trigger_id)
            else:
                if trigger_id > self._max_trigger_id:
                    self._max_trigger_id = trigger_id
                if trigger_id in loaded_beyond:
                    continue  # this full reload's, held or already fired: not again
            held = by_row.get(task_row)
            if held is not None:
                sub_held = held.subscriber(task_row)
                if sub_held is not None and sub_held.trigger_id == trigger_id:
                    continue
                table.unsubscribe(task_row)  # it deferred again, on a new trigger
            kind = classes.get(classpath)
            if kind is None:
                await resolve((classpath,))  # its module imported off the loop
                kind = classes[classpath] = _kind_of(classpath)
            if isinstance(kind, TriggerLoadError):
                self._unloadable({task_row: trigger_id}, kind)
                continue
            # A re-armed start condition is not checked again before its interval passed.
            at = now if not_before is None or not_before < now else not_before
            if kind.lazy and poke_hash not in by_hash:
                # The common row of a big load: a check not held yet, of a plain polled
                # class. Its kwargs are validated by its first check (~1-3 us a row saved
                # here; one that fails then fails its own task, as it would now).
                interval = _interval_in(kwargs, kind.interval)
                if interval is not None:
                    kwargs = texts.setdefault(kwargs, kwargs)  # equal JSON shared
                    sub = Subscriber(task_row, trigger_id, interval, next_method is not None)
                    if spread is not None:
                        at = spread.first_at(at, start + i, interval)
                    table.add_loaded(poke_hash, kind.cls, kwargs, shard, sub, at)
                    continue
            else:
                joined = by_hash.get(poke_hash)
                if joined is not None and not joined.valid:
                    self._validate_joined(joined)
            # Its interval is its trigger's, known once the row is parsed (_subscribe).
            sub = Subscriber(task_row, trigger_id, 0.0, next_method is not None)
            self._subscribe(parsed, sub, classpath, kwargs, poke_hash, shard, at, spread, start + i)
        self._settled(len(rows) - chunk_start)

    def _unloadable(self, waits: Waits, why: Exception) -> None:
        self.unloadable += 1
        self._outbox.fail(waits, f"cannot load trigger: {why}")

    def _validate_joined(self, joined: Check) -> None:
        """A second wait on a check loaded unvalidated: its kwargs are checked now, so that
        a bad row fails alone, not the wait that joins it."""
        try:
            joined.validate()
        except TriggerLoadError as exc:
            self._table.drop(joined)
            self._unloadable(waits_of(joined), exc)

    def _subscribe(
        self,
        parsed: dict[tuple[str, str], _Parsed | TriggerLoadError],
        sub: Subscriber,
        classpath: str,
        kwargs: str,
        poke_hash: str,
        shard: int,
        at: float,
        spread: _Spread | None,
        k: int,
    ) -> None:
        """A row validated as it is read (not lazy, or joining a check held): parsed once
        per (classpath, kwargs) of the query, then subscribed, first due at ``at`` or when
        its trigger says (``k``: the row's place in the load, for a spread)."""
        key = (classpath, kwargs)
        entry = parsed.get(key)
        model = None
        if entry is None:
            res = _parse(classpath, kwargs)
            if isinstance(res, TriggerLoadError):
                entry = parsed[key] = res
            else:
                model, entry = res
                parsed[key] = entry
        if isinstance(entry, TriggerLoadError):
            self._unloadable({sub.task_row: sub.trigger_id}, entry)
            return
        sub.interval = entry.interval
        table = self._table
        try:  # first_check_at is the trigger's code
            first_at = None
            if poke_hash not in table.by_hash:
                model = model or _rebuild(entry)
                first_at = model.first_check_at(at)
                if spread is not None and first_at == at:  # polled, not a moment
                    first_at = spread.first_at(at, k, entry.interval)
            table.subscribe(poke_hash, entry.compact, shard, sub, at, first_at=first_at)
        except Exception as exc:
            table.unsubscribe(sub.task_row)
            self._outbox.fail(
                {sub.task_row: sub.trigger_id},
                f"cannot schedule {(model or _rebuild(entry)).describe()}: {exc!r}",
            )

    def _settled(self, taken: int) -> None:
        """A chunk of ``taken`` rows is in the table: its checks may start, and every
        ``_ROWS_PER_FREEZE`` rows the collector is told to leave the held records alone
        (a full collection walking a million of them is a second-long stall)."""
        if not taken:
            return
        self._unfrozen += taken
        if self._unfrozen >= _ROWS_PER_FREEZE:
            self._unfrozen = 0
            freeze_held()
        # A big load lets the checks of its first chunks start (the loading loop wakes
        # the checker when it ends); a small one does not, so that a batching class gets
        # its waits in as few calls as possible (rows, not seconds: a busy machine must
        # not split the batches).
        self._taken += taken
        if self._taken >= _WAKE_AFTER_ROWS or self._spreading:
            self._table.publish(keep_holding=True)
            if self._wake is not None:
                self._wake.set()


async def pace(busy: float) -> None:
    """Rest as long as the driver's thread was busy on a reconcile's query (0.1 s at most).

    A reconcile of a million waits is ~3 s of SQL in that thread (64 checksums of ~25 ms,
    then the repair's 8 orphan scans of ~120 ms and 8 deletes of ~50 ms) while the loop
    checks ~17,000 waits a second: paced, it takes half a core at most, and the loop's
    thread finds a CPU on a shared 2-core machine."""
    await asyncio.sleep(min(busy, 0.1))


def _in_column_order(rows: Sequence[Row]) -> Iterable[Sequence[Any]]:
    """Each row's ``_COLUMNS`` values, in that order, the columns found by name once for a
    page (a name looked up in each row is a scan of its columns on SQLite's rows, ~0.4 us
    a row of a million). The rows themselves when the statement's order is that one (both
    drivers' rows iterate their values): no tuple a row."""
    if not rows:
        return ()
    names = list(rows[0].keys())
    if tuple(names) == _COLUMNS:
        return cast(Sequence[Sequence[Any]], rows)
    return map(operator.itemgetter(*(names.index(name) for name in _COLUMNS)), rows)


def _fitting(rows_per_shard: float, most: int) -> int:
    """Shards per query: up to ``most``, as long as a query returns about
    ``_ROWS_PER_QUERY`` rows at most (one shard at least)."""
    return max(1, min(most, int(_ROWS_PER_QUERY // max(1.0, rows_per_shard))))


@dataclass(slots=True, frozen=True)
class _Page:
    query: tuple[list[int], int, int | None]  # load_triggers' shards, after_id, upto
    share: float  # the part of the load it covers


@dataclass(slots=True)
class _ShardGroups:
    """A load reading a few shards per query: with ``most``, as many (up to it) as keep
    a query near ``_ROWS_PER_QUERY`` rows once the first query told what a shard holds."""

    left: list[int]
    after: int
    step: int
    most: int = 0  # 0: the step stays
    total: int = 0
    last: int = 0  # shards in the page last given

    def __post_init__(self) -> None:
        self.left = list(self.left)
        self.total = len(self.left)

    def next(self) -> _Page | None:
        group = self.left[: self.step]
        del self.left[: self.step]
        self.last = len(group)
        return _Page((group, self.after, None), len(group) / self.total) if group else None

    def took(self, rows: int) -> None:
        if self.most:
            self.step = _fitting(rows / self.last, self.most)


@dataclass(slots=True)
class _IdWindows:
    """A load of many shards read by windows of trigger ids up to ``newest`` (see the
    load_trigger_range query), each as wide as held ``_ROWS_PER_QUERY`` rows in the last."""

    shards: list[int]
    newest: int
    width: int
    low: int = 0
    last: int = 0  # the width of the window last given

    def next(self) -> _Page | None:
        if self.low >= self.newest:
            return None
        high = min(self.newest, self.low + self.width)
        page = _Page((self.shards, self.low, high), (high - self.low) / self.newest)
        self.last, self.low = high - self.low, high
        return page

    def took(self, rows: int) -> None:
        # Ids of waits gone (fired, resumed) leave gaps: wider, 16x at most at a time.
        fit = self.last * _ROWS_PER_QUERY // max(rows, 1)
        self.width = max(1, min(16 * self.last, fit))


@dataclass(slots=True)
class _Spread:
    """Where a big load's checks are first due: row k of an estimated n at
    ``began + (k / n) * min(n / FIRST_CHECKS_PER_S, interval)`` (or when it is read, if
    later), so the checks of the first rows read come first and the first cycle takes one
    interval from the load's expected end. Counted from each row's own reading instead, a
    load of 8 s made a first cycle of interval + 8 s, whose last 8 s ran the first checks
    of the last rows beside the second checks of the first: twice the rate (and the log
    lines of checks 1 and 2), a minute after the load, stalling the loop.

    ``began`` is the load's expected end, guessed at a fast machine's rate and moved later
    (never earlier) as each page is taken: first checks run inside a load compete with it,
    and the slower the machine, the longer the load and the more of them ran inside it (a
    million waits took 11 to 49 s here and 9 to 13 s once the checks waited for the end)."""

    rows: int  # the load's estimated size
    window: float  # seconds its first checks are spread over (capped by each interval)
    began: float  # when the first checks begin: the load's expected end
    started: float = 0.0  # when the load's first rows were read

    @classmethod
    def of(cls, rows: int, began: float) -> _Spread | None:
        if rows <= SPREAD_ABOVE:
            return None
        # Until a page is taken, guess the load's length from a fast machine's rate.
        return cls(rows, rows / FIRST_CHECKS_PER_S, began + rows / _GUESS_ROWS_PER_S, began)

    def read(self, taken: int, now: float) -> None:
        """``taken`` rows were loaded by ``now``: the checks of the rows still to come begin
        when the load is expected to end, so that they do not compete with it (the longer
        a load takes, the more first checks ran inside it). Never earlier than said."""
        if taken:
            end = self.started + (now - self.started) * max(self.rows, taken) / taken
            self.began = max(self.began, end)

    def first_at(self, at: float, k: int, interval: float) -> float:
        # An estimate a little short wraps around instead of piling up at the end.
        return max(at, self.began + ((k / self.rows) % 1.0) * min(self.window, interval))


@dataclass(slots=True, frozen=True)
class _Kind:
    """A trigger class as the loader treats its rows."""

    cls: type[BaseTrigger]
    interval: float  # the class's default poke_interval
    # Its rows may be held unvalidated until their first check: a plain polled class
    # (not held, no moment of its own to be first checked at).
    lazy: bool


def _kind_of(classpath: str) -> _Kind | TriggerLoadError:
    try:
        cls = trigger_class(classpath)
    except TriggerLoadError as exc:
        return exc
    except Exception as exc:  # a module that fails to import: its rows only
        return TriggerLoadError(f"{type(exc).__name__}: {exc}")
    default = cls.model_fields["poke_interval"].default
    lazy = (
        not cls.held
        and cls.first_check_at is BaseTrigger.first_check_at
        and isinstance(default, int | float)
    )
    return _Kind(cls, float(default) if lazy else 60.0, lazy)


_INTERVAL_KEY = '"poke_interval"'
_INTERVAL_VALUE = re.compile(r'"poke_interval"\s*:\s*([0-9.eE+-]+)\s*[,}]')


def _interval_in(kwargs: str, default: float) -> float | None:
    """The poke_interval a row's kwargs JSON asks for, read without parsing it (~0.3 us; a
    validation is 1-3 us): the class's default if the key is absent; None (validate the
    row now) if it is there more than once or is not a plain positive number. Read from a
    nested object by mistake, it is corrected by the first check (Check._validated): it
    only placed that first check within a big load's spread."""
    i = kwargs.find(_INTERVAL_KEY)
    if i < 0:
        return default
    m = _INTERVAL_VALUE.match(kwargs, i)
    if m is None or kwargs.find(_INTERVAL_KEY, i + 1) >= 0:
        return None
    try:
        value = float(m[1])
    except ValueError:
        return None
    return value if 0 < value < math.inf else None


@dataclass(slots=True)
class _Parsed:
    """A validated row, as the table keeps it: no model (rebuilt when needed)."""

    compact: tuple[type[BaseTrigger], str]  # the class and the validated kwargs' JSON
    interval: float


def _rebuild(entry: _Parsed) -> BaseTrigger:
    cls, kwargs = entry.compact
    return load_trigger(cls.classpath(), kwargs)


def _parse(classpath: str, kwargs: str) -> tuple[BaseTrigger, _Parsed] | TriggerLoadError:
    try:
        cls = trigger_class(classpath)
        try:  # from the JSON at once: ~3x faster than json.loads, then validate
            model = cls.model_validate_json(kwargs)
        except ValueError:  # pydantic's ValidationError too: let the usual path say why
            model = load_trigger(classpath, kwargs)
        return model, _Parsed((cls, kwargs), model.poke_interval)
    except TriggerLoadError as exc:
        return exc
    except Exception as exc:  # a module that fails to import: this row only
        return TriggerLoadError(f"{type(exc).__name__}: {exc}")
