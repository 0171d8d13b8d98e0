"""Orphan repair: rows that no loop would ever move again, found and ended at each reconcile.

Run by the loading loop after every full reload (at start, every ``reload_every`` seconds
and whenever the shards change), so an orphan is repaired within one reconcile period:

* a DEFERRED task whose trigger row is missing or whose ``trigger_id`` is NULL (a row
  deleted by hand, a failed migration, a bug) cannot be loaded, so nothing would check it:
  past its own timeout it times out (FAILED "sensor timeout", or SKIPPED with soft_fail),
  otherwise it fails, or retries if it has attempts left, with "trigger row missing";
* a trigger row nobody waits on (no DEFERRED task, no start wait) is deleted (routine:
  every fired or ended wait leaves one; counted, logged at DEBUG only);
* a RUNNING task whose owner is unknown to the store (no owner, or no heartbeat ever: a
  claim sets both, and the workers' reap judges only rows that have them) is retried or
  failed per its policy;
* a row that cannot become a trigger (not allow-listed, bad kwargs) is failed by the
  loader as it reads it; it is counted here.

Idle waits cost nothing: a shard is searched in full only when taken (at start, from a
peer); after that, only the tasks and trigger rows that the change log (the database's
triggers of schema 019_wait_changes.sql) names are looked at, so a pass over a hundred
thousand unchanged waits reads none of them.

A row with no trigger has no shard: it is homed by ``task id mod SHARDS``, so exactly one
triggerer repairs it (the change log homes it the same way). Every repair is a
compare-and-set through the state machine (a row that moved meanwhile is left alone)
leaving a line in the task's log; the counts are the ``slotless_triggerer_repaired_total``
metric (docs/metrics.md), and each repair is logged at WARNING.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Collection

from executor.statemachine import retry_or_fail, transition
from executor.states import State
from triggers.base import SHARDS

from .leasing import LeasedShards
from .loading import pace
from .store import TriggererStore

log = logging.getLogger("slotless.triggerer.repair")

# The kinds counted (the metric's `kind` label).
MISSING_TRIGGER = "deferred_trigger_missing"
TIMED_OUT = "deferred_trigger_missing_timed_out"
UNWAITED_TRIGGER = "trigger_unwaited"
UNKNOWN_OWNER = "running_owner_unknown"
UNLOADABLE = "trigger_unloadable"
KINDS = (MISSING_TRIGGER, TIMED_OUT, UNWAITED_TRIGGER, UNKNOWN_OWNER, UNLOADABLE)
# Shards repaired per transaction once the triggerer holds GROUP_ABOVE waits (see _groups).
SHARDS_PER_PASS = 8
GROUP_ABOVE = 100_000
# Tasks and trigger rows named by the change log, repaired per transaction at most.
_IDS_PER_PASS = 10_000


class Repair:
    """Finds and ends this triggerer's orphans; ``counts`` is what it repaired, by kind."""

    def __init__(self, ops: TriggererStore) -> None:
        self._ops = ops
        self.counts: Counter[str] = Counter({k: 0 for k in KINDS})
        self._takings = 0  # the leases' takings at the last pass (see run)

    def count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] += n

    async def run(self, shards: Collection[int], held: int = 0) -> Counter[str]:
        """One pass over ``shards`` (``held``: the waits the triggerer holds); returns what
        it repaired.

        A shard taken since the last pass (all of them the first time; every shard when
        ``shards`` is a plain collection, not the leases' set) is searched in full: an
        orphan made while nobody held it, or by a triggerer that died before repairing
        it, is found there. The others are searched only where the change log said a wait
        began or stopped (the loader's reconcile took those rows just before): idle, a pass
        reads no wait at all."""
        done: Counter[str] = Counter()
        # This pass's shards: the live set may grow while it awaits (at start, the leases
        # fill it while the first pass over none runs), and a shard taken meanwhile is the
        # next pass's, searched whole then.
        if isinstance(shards, LeasedShards):
            takings, fresh = shards.takings, shards.taken_since(self._takings)
        else:
            takings, fresh = 0, set(shards)
        held_now = set(shards)
        changes = self._ops.changes
        # Searched whole: the shards taken since the last pass, and those whose change log
        # the load before this pass dropped unread (it named them: they are usually the
        # same). The log of those the load did not drop is dropped now, unread, before the
        # searches: they find what it says (a bulk write's million rows read back cost
        # seconds), and what changes after a drop is logged anew, taken below. The
        # loader compares their checksums next (a change dropped may have come after it
        # read them); the log the load dropped came before it read them.
        unread = set(changes.unread)
        drop = [s for s in fresh - unread if s in shards]  # still leased
        if await self._ops.drop_wait_changes(drop):
            changes.shards.update(drop)
        fresh |= unread & held_now
        settled = held_now - set(drop)
        groups = _groups(fresh, held)
        for group in groups:
            began = time.perf_counter()
            got = await self._deferred("orphan_deferred", shards=group, n_shards=SHARDS)
            self.counts.update(got)  # counted as each part commits
            done += got
            if len(groups) > 1:
                await pace(time.perf_counter() - began)
        # Few rows whatever the waits (a partial index of RUNNING rows with no owner).
        got = await self._running(shards)
        self.counts.update(got)
        done += got
        done += await self._changed(settled)
        if fresh:
            done[UNWAITED_TRIGGER] += await self.delete_unwaited(fresh, held)
        changes.unread -= unread  # searched whole (or no longer ours: a new owner's)
        self._takings = takings
        return +done

    async def _changed(self, shards: Collection[int]) -> Counter[str]:
        """Repair what the change log named: tasks that began waiting or lost their trigger
        row, trigger rows a wait left. Forgotten only once acted on (a failed pass tries
        them again)."""
        # Taken now too: the reconcile before this pass took its own rows, and what it
        # took for the repair waits in ops.changes.
        todo = await self._ops.take_wait_changes(shards)
        done: Counter[str] = Counter()
        rows = list(todo.task_rows)  # not sorted whole: a million would hold the loop
        for first in range(0, len(rows), _IDS_PER_PASS):
            part = sorted(rows[first : first + _IDS_PER_PASS])
            got = await self._deferred("orphan_deferred_of", rows=part)
            self.counts.update(got)
            done += got
            todo.task_rows.difference_update(part)
        done[UNWAITED_TRIGGER] += await self.delete_unwaited_changed(shards, take=False)
        return done

    async def delete_unwaited_changed(self, shards: Collection[int], *, take: bool = True) -> int:
        """Delete the trigger rows nobody waits on among those the change log of ``shards``
        names (a wait left them); returns how many. The timeout loop's cleanup, and each
        repair pass: idle, one statement that reads no row (``take``: the log's new rows
        are taken first)."""
        todo = (
            await self._ops.take_wait_changes(self.settled(shards)) if take else self._ops.changes
        )
        ids = list(todo.trigger_ids)
        n = 0
        for first in range(0, len(ids), _IDS_PER_PASS):
            part = sorted(ids[first : first + _IDS_PER_PASS])
            n += await self._ops.delete_unwaited_triggers_of(part)
            todo.trigger_ids.difference_update(part)
        if n:  # routine: every fired or ended wait leaves its row behind
            log.debug("deleted %d trigger rows nobody waits on", n)
        self.count(UNWAITED_TRIGGER, n)
        return n

    def settled(self, shards: Collection[int]) -> set[int]:
        """Those of ``shards`` (the leases' live set) the last pass searched: the others were
        taken since, and the next pass searches them whole, their change log unread."""
        if isinstance(shards, LeasedShards):
            return set(shards) - shards.taken_since(self._takings)
        return set(shards)

    async def delete_unwaited(self, shards: Collection[int], held: int = 0) -> int:
        """Delete the trigger rows of ``shards`` nobody waits on; returns how many."""
        n = 0
        groups = _groups(shards, held)
        for group in groups:
            began = time.perf_counter()
            n += await self._ops.delete_orphan_triggers(group)
            if len(groups) > 1:
                await pace(time.perf_counter() - began)
        if n:  # routine: every fired or ended wait leaves its row behind
            log.debug("deleted %d trigger rows nobody waits on", n)
        self.count(UNWAITED_TRIGGER, n)
        return n

    async def _deferred(self, statement: str, **params: object) -> Counter[str]:
        """End the orphaned DEFERRED tasks ``statement`` finds (orphan_deferred: of shards;
        orphan_deferred_of: among the tasks and trigger rows the change log named)."""
        done: Counter[str] = Counter()
        now = self._ops.clock()
        async with self._ops.db.write() as tx:
            rows = await tx.fetch(statement, **params)
            for r in rows:
                gone = (
                    "its trigger_id is NULL"
                    if r["trigger_id"] is None
                    else f"trigger row {r['trigger_id']} is gone"
                )
                timeout_at = r["wait_timeout_at"]
                if timeout_at is not None and timeout_at <= now:
                    # Its own timeout stands whatever became of its trigger row.
                    waited = now - (r["wait_started_at"] or now)
                    new = State.SKIPPED if r["soft_fail"] else State.FAILED
                    why = (
                        f"sensor timeout: the condition did not hold within {waited:.0f} s "
                        f"(trigger row missing: {gone})"
                    )
                    if r["soft_fail"]:
                        why += " (soft_fail: skipped)"
                    moved = await transition(
                        tx, [r["id"]], State.DEFERRED, new, now=now, message=why
                    )
                    kind = TIMED_OUT
                else:
                    moved = await retry_or_fail(
                        tx, r["id"], State.DEFERRED, attempt=r["attempt"],
                        max_attempts=r["max_attempts"], now=now,
                        why=f"trigger row missing: {gone}, so nothing would ever check this wait",
                    )  # fmt: skip
                    kind = MISSING_TRIGGER
                if moved:
                    done[kind] += 1
                    log.warning("orphan repair: row %d: trigger row missing, %s", r["id"], gone)
        return done

    async def _running(self, shards: Collection[int]) -> Counter[str]:
        done: Counter[str] = Counter()
        now = self._ops.clock()
        async with self._ops.db.write() as tx:
            for r in await tx.fetch("orphan_running", shards=sorted(shards), n_shards=SHARDS):
                who = "no owner" if r["owner"] is None else f"owner {r['owner']} never heartbeat"
                moved = await retry_or_fail(
                    tx, r["id"], State.RUNNING, attempt=r["attempt"],
                    max_attempts=r["max_attempts"], now=now,
                    why=f"running with an owner unknown to the store ({who})",
                    expect_owner=r["owner"],
                )  # fmt: skip
                if moved:
                    done[UNKNOWN_OWNER] += 1
                    log.warning("orphan repair: task row %d RUNNING with %s: retried", r["id"], who)
        return done


def _groups(shards: Collection[int], held: int) -> list[list[int]]:
    """``shards`` a few at a time once the waits are many: each a transaction of its own,
    so that at a million waits no repair query holds the write lock (and the fires and
    workers waiting for it) for a second. Below that, all at once: a scan of every
    DEFERRED row per group would cost more than it saves."""
    ordered = sorted(shards)
    step = SHARDS_PER_PASS if held >= GROUP_ABOVE else max(1, len(ordered))
    return [ordered[i : i + step] for i in range(0, len(ordered), step)]
