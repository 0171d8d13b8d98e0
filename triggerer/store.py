"""The database operations of the triggerer: shard leases, loading waits, firing events.

The triggerer's side of the store, over the same driver interface (:class:`Database`) as
the executor's :class:`~executor.store.Store`. Every state change still goes through
:func:`executor.statemachine.transition`, so a double fire during a shard hand-over, or a
fire racing a timeout, changes nothing the second time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import cast

from executor.carried import Outputs, Resumes
from executor.statemachine import retry_or_fail, transition
from executor.states import State
from executor.store import Database, Row, Tx
from executor.store.deadlines import fire_run_waits
from executor.store.events import prune_events
from executor.store.people import answer_by_default
from executor.store.starts import fail_starts, fire_starts
from triggers.base import SHARDS

from .sampling import KEPT as SAMPLES_KEPT
from .sampling import Sampler
from .waitref import WaitKind, Waits, by_kind, is_task

log = logging.getLogger("slotless.triggerer")

# Change log rows taken per transaction (take_wait_changes).
_CHANGES_PER_TAKE = 20_000


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


@dataclass(slots=True)
class WaitChanges:
    """What the change log (schema 019_wait_changes.sql) named since it was last taken,
    kept until acted on: whichever of the reconcile and the repair takes the rows, each
    finds its part here. The shards named (their checksums may differ: the loader's), the
    tasks that began waiting or lost their trigger row (orphans, maybe) and the trigger
    rows a wait began or stopped waiting on (nobody may wait on them any more): the
    repair's."""

    shards: set[int] = field(default_factory=set)
    task_rows: set[int] = field(default_factory=set)
    trigger_ids: set[int] = field(default_factory=set)
    # Shards whose log a full load dropped unread before it looked at them whole (their
    # tasks and trigger rows unnamed): the next repair pass searches them whole.
    unread: set[int] = field(default_factory=set)

    def __bool__(self) -> bool:
        """Whether the repair has something to look at."""
        return bool(self.task_rows or self.trigger_ids)


class TriggererStore:
    """What a triggerer reads and writes; ``clock`` is the store's (the server's on PG)."""

    def __init__(self, db: Database, clock: Callable[[], float]) -> None:
        self.db = db
        self.clock = clock
        # Taken from the change log, until the reconcile and the repair act on it.
        self.changes = WaitChanges()
        # Asked at each heartbeat for the sidebar's sample, if one is due (service.py).
        self.sampler: Sampler | None = None

    async def lease_shards(
        self,
        owner: str,
        ttl: float,
        liveness: float,
        released: set[int] | None = None,
        *,
        take_free: bool = False,
    ) -> set[int]:
        """Renew this triggerer's leases and converge on its fair share of the shards.

        Fair share is ceil(shards / live triggerers); a triggerer over its share releases
        the excess so that a newcomer can take it (added to ``released``), one whose
        leases expired loses them. With ``take_free`` (just after freeing a dead peer's
        shards) it takes every free shard whatever its share: the dead one's replacement
        may already count as live while it is still starting, and its waits must not wait
        for it; the excess goes back at the next renewal, as to any newcomer.
        """
        now = self.clock()

        async def body(tx: Tx) -> set[int]:
            await tx.execute("triggerer_beat", id=owner, now=now, triggers=0, loop_lag_ms=None)
            live = [r["id"] for r in await tx.fetch("live_triggerers", since=now - liveness)]
            fair = math.ceil(SHARDS / max(1, len(live)))
            renewed = await tx.fetch("renew_shards", expires_at=now + ttl, owner=owner)
            held = sorted(r["shard"] for r in renewed)
            want = SHARDS if take_free else fair
            for shard in held[want:]:
                await tx.execute("release_shard", shard=shard, owner=owner)
                if released is not None:
                    released.add(shard)
            held = held[:want]
            if len(held) < want:
                for r in await tx.fetch("free_shards", now=now):
                    if len(held) >= want:
                        break
                    taken = await tx.execute(
                        "take_shard", owner=owner, expires_at=now + ttl, shard=r["shard"], now=now
                    )
                    if taken:
                        held.append(r["shard"])
            return set(held)

        # One call into SQLite's driver thread: 64 free shards taken a statement at a time
        # are 64 round trips with the connection held, which a worker sharing it (slotless
        # run) would wait for.
        return await self.db.transact(body)

    async def triggerer_beat(self, owner: str, triggers: int, loop_lag_ms: float | None) -> None:
        """The heartbeat; with it, when one is due, the sampler's row for the waits page's
        sidebar and the pruning of rows past the hour kept (triggerer/sampling.py): one
        small row per period, whatever the waits held."""
        sample = self.sampler.take() if self.sampler is not None else None
        now = self.clock()
        try:
            async with self.db.write() as tx:
                await tx.execute(
                    "triggerer_beat",
                    id=owner,
                    now=now,
                    triggers=triggers,
                    loop_lag_ms=loop_lag_ms,
                )
                if sample is not None:
                    await tx.execute("triggerer_samples_prune", before=now - SAMPLES_KEPT)
                    await tx.execute(
                        "triggerer_sample_add", triggerer=owner, at=now, **asdict(sample)
                    )
        except BaseException:
            if sample is not None and self.sampler is not None:
                self.sampler.put_back()
            raise

    async def other_triggerers(self, me: str) -> list[str]:
        """The other triggerers: listed, or holding shard leases (expired or not)."""
        async with self.db.read() as tx:
            return [r["id"] for r in await tx.fetch("other_triggerers", me=me)]

    async def forget_triggerer(self, owner: str) -> int:
        """A triggerer whose process is gone: free its shards now; returns how many."""
        async with self.db.write() as tx:
            freed = await tx.execute("release_all_shards", owner=owner)
            await tx.execute("triggerer_leave", id=owner)
        return freed

    async def triggerer_leave(self, owner: str) -> None:
        async with self.db.write() as tx:
            await tx.execute("release_all_shards", owner=owner)
            await tx.execute("triggerer_leave", id=owner)

    async def load_triggers(
        self, shards: Collection[int], after_id: int = 0, upto: int | None = None
    ) -> list[Row]:
        """The waits of ``shards`` with trigger ids above ``after_id`` (and at most
        ``upto``: a window of ids, the faster read when the shards are many)."""
        async with self.db.read() as tx:
            if upto is None:
                return await tx.fetch("load_triggers", shards=sorted(shards), after=after_id)
            return await tx.fetch(
                "load_trigger_range", shards=sorted(shards), after=after_id, upto=upto
            )

    async def shard_sums(self, shards: Collection[int]) -> dict[int, tuple[int, int]]:
        """shard -> (waits, checksum) as load_triggers would return them (CheckTable.shard_sum)."""
        async with self.db.read() as tx:
            rows = await tx.fetch("shard_sums", shards=sorted(shards))
        return {int(r["shard"]): (int(r["n"]), int(r["h"])) for r in rows}

    async def take_wait_changes(self, shards: Collection[int]) -> WaitChanges:
        """Take the change log's rows of ``shards`` into ``changes`` (returned): idle, one
        statement that reads no row. A backlog (a bulk write, a shard nobody held for a
        while) is taken ``_CHANGES_PER_TAKE`` rows a transaction, read by position (a name
        is a scan of the columns on SQLite's rows), the loop free between them."""
        todo = self.changes
        ordered = sorted(shards)
        while True:
            async with self.db.write() as tx:
                rows = await tx.fetch("take_wait_changes", shards=ordered, n=_CHANGES_PER_TAKE)
            # Both drivers' rows iterate their values (loading.py reads its pages so too).
            for shard, task_row, trigger_id in cast(list[tuple[int, int | None, int | None]], rows):
                todo.shards.add(shard)
                if task_row is not None:
                    todo.task_rows.add(task_row)
                if trigger_id is not None:
                    todo.trigger_ids.add(trigger_id)
            if len(rows) < _CHANGES_PER_TAKE:
                return todo
            del rows
            await asyncio.sleep(0)

    async def drop_wait_changes(self, shards: Collection[int]) -> int:
        """Delete the change log's rows of ``shards`` unread (returns how many), for a
        caller about to look at them whole: what a row says, that look finds, and one
        committed after the delete stays for the next. A bulk write's million rows read
        back cost seconds of CPU; deleted, under a second (every shard's: one statement, a
        fifth of that on SQLite). Windows of ``_CHANGES_PER_TAKE`` ids a transaction."""
        if not shards:
            return 0
        if set(shards) >= set(range(SHARDS)):
            async with self.db.write() as tx:
                return await tx.execute("drop_all_wait_changes")
        dropped, ordered, after = 0, sorted(shards), 0
        while True:
            async with self.db.write() as tx:
                row = await tx.fetchone("wait_change_window", after=after, n=_CHANGES_PER_TAKE)
                upto = None if row is None else row["upto"]
                if upto is not None:
                    dropped += await tx.execute(
                        "drop_wait_changes", shards=ordered, after=after, upto=upto
                    )
            if upto is None:
                return dropped
            after = upto
            await asyncio.sleep(0)

    async def delete_unwaited_triggers_of(self, ids: Collection[int]) -> int:
        """Delete those of the trigger rows ``ids`` nobody waits on; returns how many."""
        async with self.db.write() as tx:
            await tx.execute("prune_releases", before=self.clock() - 3600)
            if not ids:
                return 0
            return await tx.execute("delete_unwaited_triggers_of", ids=sorted(ids))

    async def max_trigger_id(self) -> int:
        async with self.db.read() as tx:
            row = await tx.fetchone("max_trigger_id")
        return int(row["id"]) if row is not None else 0

    async def triggerer_commit(self, batch: TriggererBatch, owner: str | None = None) -> None:
        """Fire events, fail broken waits and write check logs, in one transaction.

        With ``owner``, fenced: only waits whose trigger's shard ``owner`` still leases are
        fired or failed (a triggerer that woke after losing shards writes nothing for them).
        """
        now = self.clock()

        async def body(tx: Tx) -> None:
            todo = batch if owner is None else await _fenced(tx, batch, owner, now)
            logs = [pair for pair in todo.logs if is_task(pair[0])]  # a task's only
            if logs:
                # One JSON parameter, inserted by the database: no dict per line here.
                await tx.execute("insert_check_logs", lines=json.dumps(logs), now=now)
            # The tasks' waits of every fire of the batch are settled together: one read,
            # one compare-and-set per kind (sensors done, methods to resume), each row with
            # its own fire's payload and message, and their children bumped once a batch.
            fired: Waits = {}
            payload_of: dict[int, str] = {}
            message_of: dict[int, str] = {}
            for fire in todo.fires:
                if fire.error is not None:
                    await _fail_waits(tx, fire.waits, fire.error, now)
                    continue
                kinds = by_kind(fire.waits)
                waits = kinds[WaitKind.TASK]
                if starts := kinds[WaitKind.START]:
                    await fire_starts(tx, starts, json.loads(fire.payload_json), now)
                if runs := kinds[WaitKind.RUN]:
                    await fire_run_waits(tx, runs, now)
                fired.update(waits)
                for row in waits:
                    payload_of[row] = fire.payload_json
                    message_of[row] = fire.message
            rows = _still_firable(await _still_waiting(tx, fired), now) if fired else []
            sensors = [r["id"] for r in rows if r["next_method"] is None]
            resumable = [r["id"] for r in rows if r["next_method"] is not None]
            # A sensor is done when its condition holds: no worker round trip.
            await transition(
                tx,
                sensors,
                State.DEFERRED,
                State.SUCCESS,
                now=now,
                message={i: message_of[i] for i in sensors},
                carry=Outputs({i: payload_of[i] for i in sensors}),
            )
            await transition(
                tx,
                resumable,
                State.DEFERRED,
                State.PENDING,
                now=now,
                message={i: message_of[i] for i in resumable},
                ready_at=now,
                carry=Resumes({i: payload_of[i] for i in resumable}),
            )
            for waits, why in todo.failures:
                await _fail_waits(tx, waits, why, now)

        # One call into SQLite's driver thread for the whole transaction: a burst's fires
        # are written while the loop is busy checking, not a statement per loop pass.
        await self.db.transact(body)

    async def expire_waits(self, shards: Collection[int]) -> list[int]:
        """End the waits in these shards whose own timeout passed; returns their rows."""
        now = self.clock()
        ended: list[int] = []
        async with self.db.write() as tx:
            expired = await tx.fetch(
                "expired_waits", now=now, shards=sorted(shards), n_shards=SHARDS
            )
            # A person's wait with a default answer takes it (store/people.py).
            answered = await answer_by_default(tx, [r["id"] for r in expired], now)
            ended += sorted(answered)
            for r in expired:
                if r["id"] in answered:
                    continue
                waited = now - (r["wait_started_at"] or now)
                new = State.SKIPPED if r["soft_fail"] else State.FAILED
                why = f"sensor timeout: the condition did not hold within {waited:.0f} s"
                if r["soft_fail"]:
                    why += " (soft_fail: skipped)"
                moved = await transition(tx, [r["id"]], State.DEFERRED, new, now=now, message=why)
                ended += [m.id for m in moved]
        return ended

    async def delete_orphan_triggers(self, shards: Collection[int]) -> int:
        async with self.db.write() as tx:
            # Releases are read within seconds; an hour keeps them for a triggerer that
            # was stopped a while (older ones are dropped by its full reload anyway).
            await tx.execute("prune_releases", before=self.clock() - 3600)
            return await tx.execute("delete_orphan_triggers", shards=sorted(shards))

    async def prune_events(self, retention: float) -> int:
        """Delete the events older than ``retention`` seconds, in batches; how many went."""
        return await prune_events(self.db, self.clock() - retention)

    async def released_waits(self, after_id: int) -> list[Row]:
        """Waits an operator ended (cancel, clear) since release ``after_id``."""
        async with self.db.read() as tx:
            return await tx.fetch("released_waits", after=after_id)

    async def max_release_id(self) -> int:
        async with self.db.read() as tx:
            row = await tx.fetchone("max_release_id")
        return int(row["id"]) if row is not None else 0


async def _fenced(tx: Tx, batch: TriggererBatch, owner: str, now: float) -> TriggererBatch:
    """The part of ``batch`` about shards ``owner`` still holds (locked until commit)."""
    held = {r["shard"] for r in await tx.fetch("held_shards_fenced", owner=owner, now=now)}
    ids = {t for fire in batch.fires for t in fire.waits.values()}
    ids |= {t for waits, _ in batch.failures for t in waits.values()}
    if not ids:
        return batch
    shard = {r["id"]: r["shard"] for r in await tx.fetch("trigger_shards", ids=sorted(ids))}

    def mine(waits: Waits) -> Waits:
        # A trigger row already gone is no shard's: leave it to the row's owner (if any).
        return {row: t for row, t in waits.items() if shard.get(t) in held}

    out = TriggererBatch(logs=batch.logs)
    for fire in batch.fires:
        if waits := mine(fire.waits):
            out.fires.append(Fire(waits, fire.payload_json, fire.message, fire.error))
    for waits, why in batch.failures:
        if kept := mine(waits):
            out.failures.append((kept, why))
    dropped = len(batch.fires) - len(out.fires) + len(batch.failures) - len(out.failures)
    if dropped:
        # A routine hand-over (a peer joined, a lease moved): the new owner checks these
        # waits again, so nothing is lost. A pause or a lost lock has its own WARNING.
        log.info(
            "triggerer %s no longer holds the shards of %d fires/failures: not written "
            "(their waits belong to another triggerer now)", owner, dropped,
        )  # fmt: skip
    return out


async def _still_waiting(tx: Tx, waits: Waits) -> list[Row]:
    """The rows still DEFERRED on the very trigger the event or failure is about."""
    rows = await tx.fetch("deferred_rows", ids=list(waits))
    return [r for r in rows if r["trigger_id"] == waits[r["id"]]]


def _still_firable(rows: list[Row], now: float) -> list[Row]:
    """Checked at flush time, not when the check ran: an event fires no wait whose own
    timeout has passed (the timeout sweep ends it) nor one whose trigger row is gone (a fire
    from memory; orphan repair ends it, "trigger row missing")."""
    return [
        r
        for r in rows
        if r["has_trigger"] and (r["wait_timeout_at"] is None or r["wait_timeout_at"] > now)
    ]


async def _fail_waits(tx: Tx, waits: Waits, why: str, now: float) -> None:
    """A trigger that cannot fire: its tasks fail (or retry, if they have attempts left);
    a start wait is kept, re-armed after its interval, with the error on its DAG."""
    kinds = by_kind(waits)
    if starts := kinds[WaitKind.START]:
        await fail_starts(tx, starts, why, now)
    if runs := kinds[WaitKind.RUN]:
        # A time wait's moment is all it waits for: one past its moment is fired; one
        # not yet due stays armed, loaded again at the next full reload.
        await fire_run_waits(tx, runs, now, due_only=True)
    for r in await _still_waiting(tx, kinds[WaitKind.TASK]):
        await retry_or_fail(
            tx, r["id"], State.DEFERRED, attempt=r["attempt"], max_attempts=r["max_attempts"],
            now=now, why=why,
        )  # fmt: skip
