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
from collections.abc import Callable, Collection, Sequence

from executor.store import Row
from triggers.base import BaseTrigger
from triggers.registry import TriggerLoadError, load_trigger

from .checks import CheckTable, Subscriber
from .store import TriggererStore
from .writing import Outbox

# Rows handled between yields to the loop: 100,000 rows must not stall it for a second.
_ROWS_PER_YIELD = 2000


class Loader:
    def __init__(
        self,
        ops: TriggererStore,
        table: CheckTable,
        outbox: Outbox,
        *,
        shards_per_query: int,
        clock: Callable[[], float],
    ) -> None:
        self._ops = ops
        self._table = table
        self._outbox = outbox
        self._shards_per_query = shards_per_query
        self._clock = clock
        self._max_trigger_id = 0  # where the next incremental load starts
        self._loaded_beyond: set[int] = set()  # trigger ids above a full reload's `newest`
        self._max_release_id = 0  # the newest operator release read (wait_release)

    async def load(self, shards: Collection[int], *, full: bool) -> None:
        """Read the waits of ``shards``: all of them (``full``) or the new ones."""
        ordered = sorted(shards)
        if not ordered:
            return
        newest = await self._ops.max_trigger_id() if full else 0
        if full:
            self._loaded_beyond.clear()
            # The rows read now reflect every release so far: start after them.
            self._max_release_id = max(self._max_release_id, await self._ops.max_release_id())
        else:
            await self._drop_released()
        step = self._shards_per_query if full else len(ordered)
        seen: set[int] = set()
        for first in range(0, len(ordered), step):
            after = 0 if full else self._max_trigger_id
            rows = await self._ops.load_triggers(ordered[first : first + step], after)
            await self._take(rows, full=full, newest=newest, seen=seen)
        if full:
            self._max_trigger_id = max(self._max_trigger_id, newest)
            for task_row in [r for r in self._table.by_row if r not in seen]:
                self._table.unsubscribe(task_row)  # resumed, timed out or failed elsewhere

    async def _drop_released(self) -> None:
        """Unsubscribe the waits an operator ended since the last look (cancel, clear)."""
        for r in await self._ops.released_waits(self._max_release_id):
            self._max_release_id = r["id"]
            check = self._table.by_row.get(r["task_row"])
            if check is not None:
                sub = check.subscribers.get(r["task_row"])
                if sub is not None and sub.trigger_id == r["trigger_id"]:
                    self._table.unsubscribe(r["task_row"])

    async def _take(self, rows: Sequence[Row], *, full: bool, newest: int, seen: set[int]) -> None:
        table = self._table
        now = self._clock()
        parsed: dict[tuple[str, str], BaseTrigger | TriggerLoadError] = {}
        for i, row in enumerate(rows):
            if i % _ROWS_PER_YIELD == _ROWS_PER_YIELD - 1:
                await asyncio.sleep(0)
            task_row, trigger_id = row["task_row"], row["trigger_id"]
            seen.add(task_row)
            if full:
                if trigger_id > newest:
                    self._loaded_beyond.add(trigger_id)
            else:
                self._max_trigger_id = max(self._max_trigger_id, trigger_id)
                if trigger_id in self._loaded_beyond:
                    continue  # this full reload's, held or already fired: not again
            held = table.by_row.get(task_row)
            if held is not None:
                sub_held = held.subscribers.get(task_row)
                if sub_held is not None and sub_held.trigger_id == trigger_id:
                    continue
                table.unsubscribe(task_row)  # it deferred again, on a new trigger
            key = (row["classpath"], row["kwargs"])
            trigger = parsed.get(key)
            if trigger is None:
                trigger = parsed[key] = _parse(*key)
            if isinstance(trigger, TriggerLoadError):
                self._outbox.fail({task_row: trigger_id}, f"cannot load trigger: {trigger}")
                continue
            sub = Subscriber(
                task_row, trigger_id, trigger.poke_interval, row["next_method"] is not None
            )
            # A re-armed start condition is not checked again before its interval passed.
            at = max(now, row["not_before"] or now)
            try:  # first_check_at is the trigger's code
                table.subscribe(row["poke_hash"], trigger, row["shard"], sub, at)
            except Exception as exc:
                table.unsubscribe(task_row)
                self._outbox.fail(
                    {task_row: trigger_id}, f"cannot schedule {trigger.describe()}: {exc!r}"
                )


def _parse(classpath: str, kwargs: str) -> BaseTrigger | TriggerLoadError:
    try:
        return load_trigger(classpath, kwargs)
    except TriggerLoadError as exc:
        return exc
    except Exception as exc:  # a module that fails to import: this row only
        return TriggerLoadError(f"{type(exc).__name__}: {exc}")
