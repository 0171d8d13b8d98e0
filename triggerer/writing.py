"""The triggerer's outgoing batch: fired events, failed waits and check logs, and its flush.

Loading and checking only append here; the writing loop (:meth:`Outbox.flushing`)
commits whatever has gathered, in one transaction, every ``flush_every`` seconds, and at
once when a fire or a failure is added (:attr:`Outbox.urgent`): a pushed wait is not held
back by the flush tick, and a burst still goes out in few transactions (what arrives while
one commits waits for the next). A batch that fails to commit is kept and goes out with
the next one: a fire written twice changes nothing (the row is no longer DEFERRED on that
trigger), a fire lost would leave its tasks waiting for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence

from executor.driver.faults import Backoff, is_transient, split_apart

from .store import Fire, TriggererBatch, TriggererStore
from .waitref import Waits

log = logging.getLogger("slotless.triggerer.writing")

# Check log lines written per transaction (5,000 take ~30 ms to build and write here).
LOGS_PER_FLUSH = 5000


class Outbox:
    """What the triggerer has decided and not yet written."""

    def __init__(self, ops: TriggererStore, owner: str | None = None) -> None:
        self._ops = ops
        self._owner = owner  # fenced writes: only for shards this triggerer still leases
        self.batch = TriggererBatch()
        # Set when a fire or a failure is added: the writing loop commits without waiting
        # for its tick (check logs alone wait for it).
        self.urgent = asyncio.Event()

    async def flushing(self, every: float) -> None:
        """The writing loop: a fire is written at once (what comes meanwhile joins the next
        commit); logs wait for the tick."""
        # Reported on the triggerer's logger, as its other loops' failures are.
        backoff = Backoff("triggerer: writing events", logging.getLogger("slotless.triggerer"))
        while True:
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that
                # races the event being set, and stop() then waits for this loop forever.
                async with asyncio.timeout(every):
                    await self.urgent.wait()
            self.urgent.clear()
            try:
                await self.flush()  # kept for the next try if it fails
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(backoff.failed(exc))

    def fire(self, fire: Fire) -> None:
        self.batch.fires.append(fire)
        self.urgent.set()

    def fail(self, waits: Waits, why: str) -> None:
        self.batch.failures.append((waits, why))
        self.urgent.set()

    def log(self, rows: Iterable[int], line: str) -> None:
        self.batch.logs.extend((row, line) for row in rows)

    async def flush(self) -> None:
        """Commit the batch gathered so far; on failure keep it (ahead of newer lines) and raise."""
        batch, self.batch = self.batch, TriggererBatch()
        if not batch:
            return
        if len(batch.logs) > LOGS_PER_FLUSH:
            # A cycle of a million cheap checks logs a line for each of its waits at once
            # (checks 1, 2, 4, ...): built and written in one go, the lines would stall
            # the loop. The rest go out with the next flushes; fires never wait for them.
            # The backlog keeps its list: a copy of the rest at each flush would allocate
            # a new list of up to a million lines, young, for the collector to walk.
            rest = batch.logs
            batch.logs = rest[:LOGS_PER_FLUSH]
            del rest[:LOGS_PER_FLUSH]
            self.batch.logs = rest
        try:
            await self._ops.triggerer_commit(batch, self._owner)
        except BaseException as exc:  # cancelled at stop mid-commit too: the last flush retries it
            if isinstance(exc, Exception) and not is_transient(exc):
                try:
                    await self._commit_apart(batch)
                    return
                except Exception as again:  # the database went away meanwhile: keep it all
                    exc = again
            self.batch.fires[:0] = batch.fires
            self.batch.failures[:0] = batch.failures
            self.batch.logs[:0] = batch.logs
            raise

    async def _commit_apart(self, batch: TriggererBatch) -> None:
        """A deterministic error: commit the batch in halves, one wait per unit at the
        bottom, so that every other wait goes through; a fire that fails alone fails its
        task with the error instead, a failure or a log line that fails alone is dropped
        (logged here). Writing a unit twice changes nothing (compare-and-set)."""
        units = [
            TriggererBatch(fires=[Fire({row: trigger_id}, f.payload_json, f.message, f.error)])
            for f in batch.fires
            for row, trigger_id in f.waits.items()
        ]
        units += [
            TriggererBatch(failures=[({row: trigger_id}, why)])
            for waits, why in batch.failures
            for row, trigger_id in waits.items()
        ]
        units += [TriggererBatch(logs=[line]) for line in batch.logs]

        async def commit(part: Sequence[TriggererBatch]) -> None:
            merged = TriggererBatch()
            for u in part:
                merged.fires += u.fires
                merged.failures += u.failures
                merged.logs += u.logs
            await self._ops.triggerer_commit(merged, self._owner)

        for unit, err in await split_apart(units, commit):
            why = f"cannot record this wait's event: {type(err).__name__}: {err}"
            log.error("triggerer flush: %s (%s)", why, unit)
            if unit.fires:
                try:
                    await commit([TriggererBatch(failures=[(unit.fires[0].waits, why)])])
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    log.exception("cannot fail the wait either: it waits for its timeout")
