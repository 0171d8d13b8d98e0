"""The triggerer's outgoing batch: fired events, failed waits and check logs, and its flush.

Loading and checking only append here; the writing loop commits whatever has gathered,
in one transaction, every ``flush_every`` seconds. A batch that fails to commit is kept
and goes out with the next one: a fire written twice changes nothing (the row is no
longer DEFERRED on that trigger), a fire lost would leave its tasks waiting for good.
"""

from __future__ import annotations

from collections.abc import Iterable

from .store import Fire, TriggererBatch, TriggererStore, Waits


class Outbox:
    """What the triggerer has decided and not yet written."""

    def __init__(self, ops: TriggererStore) -> None:
        self._ops = ops
        self.batch = TriggererBatch()

    def fire(self, fire: Fire) -> None:
        self.batch.fires.append(fire)

    def fail(self, waits: Waits, why: str) -> None:
        self.batch.failures.append((waits, why))

    def log(self, rows: Iterable[int], line: str) -> None:
        self.batch.logs.extend((row, line) for row in rows)

    async def flush(self) -> None:
        """Commit the batch gathered so far; on failure keep it (ahead of newer lines) and raise."""
        batch, self.batch = self.batch, TriggererBatch()
        if not batch:
            return
        try:
            await self._ops.triggerer_commit(batch)
        except BaseException:  # cancelled at stop mid-commit too: the last flush retries it
            self.batch.fires[:0] = batch.fires
            self.batch.failures[:0] = batch.failures
            self.batch.logs[:0] = batch.logs
            raise
