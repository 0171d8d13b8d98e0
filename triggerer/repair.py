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

A row with no trigger has no shard: it is homed by ``task id mod SHARDS``, so exactly one
triggerer repairs it. Every repair is a compare-and-set through the state machine (a row
that moved meanwhile is left alone) leaving a line in the task's log; the counts are the
``slotless_triggerer_repaired_total`` metric (docs/metrics.md), and each repair is logged
at WARNING.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Collection

from executor.statemachine import retry_or_fail, transition
from executor.states import State
from triggers.base import SHARDS

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


class Repair:
    """Finds and ends this triggerer's orphans; ``counts`` is what it repaired, by kind."""

    def __init__(self, ops: TriggererStore) -> None:
        self._ops = ops
        self.counts: Counter[str] = Counter({k: 0 for k in KINDS})

    def count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] += n

    async def run(self, shards: Collection[int], held: int = 0) -> Counter[str]:
        """One pass over ``shards`` (``held``: the waits the triggerer holds); returns what
        it repaired."""
        done: Counter[str] = Counter()
        groups = _groups(shards, held)
        for group in groups:
            for part in (self._deferred, self._running):
                began = time.perf_counter()
                got = await part(group)
                self.counts.update(got)  # counted as each part commits
                done += got
                if len(groups) > 1:
                    await pace(time.perf_counter() - began)
        done[UNWAITED_TRIGGER] += await self.delete_unwaited(shards, held)
        return +done

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

    async def _deferred(self, shards: Collection[int]) -> Counter[str]:
        done: Counter[str] = Counter()
        now = self._ops.clock()
        async with self._ops.db.write() as tx:
            rows = await tx.fetch("orphan_deferred", shards=sorted(shards), n_shards=SHARDS)
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
