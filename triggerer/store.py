"""The database operations of the triggerer: shard leases, loading waits, firing events.

The triggerer's side of the store, over the same driver interface (:class:`Database`) as
the executor's :class:`~executor.store.Store`. Every state change still goes through
:func:`executor.statemachine.transition`, so a double fire during a shard hand-over, or a
fire racing a timeout, changes nothing the second time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from executor.statemachine import retry_or_fail, transition
from executor.states import State
from executor.store import Database, Row
from triggers.base import SHARDS

# The waits a check answers: task row -> the trigger row it waits on. A task that resumed
# and deferred again since waits on another trigger, and a late event must not wake it.
Waits = dict[int, int]


@dataclass(slots=True)
class Fire:
    """A check's event, for the tasks that waited on it."""

    waits: Waits
    payload_json: str
    message: str
    error: str | None = None


@dataclass(slots=True)
class TriggererBatch:
    """Everything a triggerer writes in one transaction."""

    fires: list[Fire] = field(default_factory=list)
    failures: list[tuple[Waits, str]] = field(default_factory=list)  # waits, why
    logs: list[tuple[int, str]] = field(default_factory=list)  # row, line

    def __bool__(self) -> bool:
        return bool(self.fires or self.failures or self.logs)


class TriggererStore:
    """What a triggerer reads and writes; ``clock`` is the store's (the server's on PG)."""

    def __init__(self, db: Database, clock: Callable[[], float]) -> None:
        self.db = db
        self.clock = clock

    async def lease_shards(self, owner: str, ttl: float, liveness: float) -> set[int]:
        """Renew this triggerer's leases and converge on its fair share of the shards.

        Fair share is ceil(shards / live triggerers); a triggerer over its share releases
        the excess so that a newcomer can take it, one whose leases expired loses them.
        """
        now = self.clock()
        async with self.db.write() as tx:
            await tx.execute("triggerer_beat", owner, now, 0, None)
            live = [r["id"] for r in await tx.fetch("live_triggerers", now - liveness)]
            fair = math.ceil(SHARDS / max(1, len(live)))
            held = sorted(r["shard"] for r in await tx.fetch("renew_shards", now + ttl, owner))
            for shard in held[fair:]:
                await tx.execute("release_shard", shard, owner)
            held = held[:fair]
            if len(held) < fair:
                for r in await tx.fetch("free_shards", now):
                    if len(held) >= fair:
                        break
                    if await tx.execute("take_shard", owner, now + ttl, r["shard"], now):
                        held.append(r["shard"])
        return set(held)

    async def triggerer_beat(self, owner: str, triggers: int, loop_lag_ms: float | None) -> None:
        async with self.db.write() as tx:
            await tx.execute("triggerer_beat", owner, self.clock(), triggers, loop_lag_ms)

    async def triggerer_leave(self, owner: str) -> None:
        async with self.db.write() as tx:
            await tx.execute("release_all_shards", owner)
            await tx.execute("triggerer_leave", owner)

    async def load_triggers(self, shards: Sequence[int], after_id: int = 0) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.fetch("load_triggers", tx.ids(sorted(shards)), after_id)

    async def max_trigger_id(self) -> int:
        async with self.db.read() as tx:
            row = await tx.fetchone("max_trigger_id")
        return int(row["id"]) if row is not None else 0

    async def triggerer_commit(self, batch: TriggererBatch) -> None:
        """Fire events, fail broken waits and write check logs, in one transaction."""
        now = self.clock()
        async with self.db.write() as tx:
            if batch.logs:
                await tx.executemany(
                    "insert_event",
                    [(row, now, "check", None, None, None, line) for row, line in batch.logs],
                )
            for fire in batch.fires:
                if fire.error is not None:
                    await _fail_waits(tx, fire.waits, fire.error, now)
                    continue
                rows = await _still_waiting(tx, fire.waits)
                sensors = [r["id"] for r in rows if r["next_method"] is None]
                resumable = [r["id"] for r in rows if r["next_method"] is not None]
                if sensors:
                    await tx.execute("set_sensor_output", fire.payload_json, tx.ids(sensors))
                    await transition(
                        tx, sensors, State.DEFERRED, State.SUCCESS, now=now, message=fire.message
                    )
                if resumable:
                    await tx.execute("set_event", fire.payload_json, tx.ids(resumable))
                    await transition(
                        tx,
                        resumable,
                        State.DEFERRED,
                        State.PENDING,
                        now=now,
                        message=fire.message,
                        ready_at=now,
                    )
            for waits, why in batch.failures:
                await _fail_waits(tx, waits, why, now)

    async def expire_waits(self, shards: Sequence[int]) -> list[int]:
        """End the waits in these shards whose own timeout passed; returns their rows."""
        now = self.clock()
        ended: list[int] = []
        async with self.db.write() as tx:
            for r in await tx.fetch("expired_waits", now, tx.ids(sorted(shards))):
                waited = now - (r["wait_started_at"] or now)
                new = State.SKIPPED if r["soft_fail"] else State.FAILED
                why = f"sensor timeout: the condition did not hold within {waited:.0f} s"
                if r["soft_fail"]:
                    why += " (soft_fail: skipped)"
                moved = await transition(tx, [r["id"]], State.DEFERRED, new, now=now, message=why)
                ended += [m["id"] for m in moved]
        return ended

    async def delete_orphan_triggers(self, shards: Sequence[int]) -> int:
        async with self.db.write() as tx:
            return await tx.execute("delete_orphan_triggers", tx.ids(sorted(shards)))


async def _still_waiting(tx: Any, waits: Waits) -> list[Row]:
    """The rows still DEFERRED on the very trigger the event or failure is about."""
    rows = await tx.fetch("deferred_rows", tx.ids(list(waits)))
    return [r for r in rows if r["trigger_id"] == waits[r["id"]]]


async def _fail_waits(tx: Any, waits: Waits, why: str, now: float) -> None:
    """A trigger that cannot fire: its tasks fail (or retry, if they have attempts left)."""
    for r in await _still_waiting(tx, waits):
        await retry_or_fail(
            tx, r["id"], State.DEFERRED, attempt=r["attempt"], max_attempts=r["max_attempts"],
            now=now, why=why,
        )  # fmt: skip
