"""The store's side of delivering callbacks and notifications (a mixin of :class:`Store`).

A ``callback`` row (recorded by :func:`executor.notifications.record` in the transaction
of the change that raised it) is claimed like a task: :func:`claim_callbacks` in the
worker's exchange, an owner token, heartbeats, and :meth:`Callbacks.reap_callbacks` for
a worker that died holding one. Its lifecycle is its own (PENDING -> RUNNING -> DONE,
FAILED, or PENDING again later); it never moves a task or a run, so it does not go
through the state machine. What happens to it is written in its task's log.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..driver.db import Row, Tx
from .part import Part


@dataclass(frozen=True, slots=True)
class CallbackRow:
    """A claimed callback row: the event, and which of its handlers already ran."""

    id: int
    run_id: str
    task_row: int | None
    task_id: str | None
    event: str
    attempt: int | None
    message: str | None
    context: dict[str, Any]
    tries: int  # this claim included
    delivered: tuple[str, ...]
    created_at: float

    @classmethod
    def of(cls, r: Row) -> CallbackRow:
        return cls(
            id=r["id"],
            run_id=r["run_id"],
            task_row=r["task_row"],
            task_id=r["task_id"],
            event=r["event"],
            attempt=r["attempt"],
            message=r["message"],
            context=json.loads(r["context"] or "{}"),
            tries=r["tries"],
            delivered=tuple(json.loads(r["delivered"] or "[]")),
            created_at=r["created_at"],
        )


async def claim_callbacks(tx: Tx, owner: str, limit: int, now: float) -> list[CallbackRow]:
    """Claim up to ``limit`` due callback rows for ``owner`` inside ``tx``."""
    if limit <= 0:
        return []
    rows = await tx.fetch("claim_callbacks", owner=owner, now=now, n=limit)
    return sorted((CallbackRow.of(r) for r in rows), key=lambda c: c.id)


class Callbacks(Part):
    """Delivering callbacks: a worker's claimed callback rows, their ends and logs."""

    async def callback_delivered(self, row: CallbackRow, owner: str, done: Sequence[str]) -> bool:
        """Remember that these handlers of ``row`` ran; False if the row was taken back."""
        async with self.db.write() as tx:
            moved = await tx.fetchone(
                "callback_delivered",
                delivered=json.dumps(list(done)),
                now=self.clock(),
                id=row.id,
                owner=owner,
            )
        return moved is not None

    async def end_callback(
        self,
        row: CallbackRow,
        owner: str,
        *,
        state: str,
        done: Sequence[str],
        error: str | None,
        ready_at: float | None,
        log_lines: Sequence[str],
    ) -> bool:
        """End ``row``'s try (DONE, FAILED, or PENDING again at ``ready_at``) and write
        ``log_lines`` in its task's log, in one transaction; False if it was taken back."""
        now = self.clock()
        async with self.db.write() as tx:
            moved = await tx.fetchone(
                "end_callback",
                state=state,
                ready_at=ready_at,
                ended_at=now if state in ("DONE", "FAILED") else None,
                error=error,
                delivered=json.dumps(list(done)),
                id=row.id,
                owner=owner,
            )
            if moved is not None:
                await _task_log(tx, row.task_row, row.attempt, now, log_lines)
        return moved is not None

    async def heartbeat_callbacks(self, owner: str, ids: Sequence[int]) -> list[int]:
        async with self.db.write() as tx:
            rows = await tx.fetch(
                "callback_heartbeat", now=self.clock(), ids=list(ids), owner=owner
            )
        return [r["id"] for r in rows]

    async def reap_callbacks(self, stale_after: float) -> int:
        """Callback rows whose worker stopped heartbeating become claimable again (their
        handlers not yet marked delivered run again: a worker killed mid-send may repeat
        that one send, never lose it)."""
        now = self.clock()
        why = f"worker lost while delivering: no heartbeat for {stale_after:g} s"
        async with self.db.write() as tx:
            rows = await tx.fetch("stale_callbacks", now=now, before=now - stale_after, why=why)
            await _retry_later(tx, rows, now, why)
        return len(rows)

    async def callback_log_tail(self, task_row: int, before: float, n: int) -> list[str]:
        """The task's last ``n`` log lines (and tracebacks) up to ``before``."""
        async with self.db.read() as tx:
            rows = await tx.fetch("callback_log_tail", task_row=task_row, before=before, n=n)
        return [str(r["message"]) for r in reversed(rows) if r["message"]]

    async def run_callbacks(self, run_id: str) -> list[Row]:
        """A run's callback rows, oldest first (for people and tests)."""
        async with self.db.read() as tx:
            return await tx.fetch("run_callbacks", run_id=run_id)


async def reclaim_callbacks_of(tx: Tx, worker_id: str, now: float, why: str) -> int:
    """Make the callback rows a gone worker held claimable again (its liveness lock was
    released), in the caller's transaction, as :meth:`Callbacks.reap_callbacks` does
    for a worker that stopped heartbeating."""
    why = f"worker lost while delivering: {why}"
    rows = await tx.fetch("callbacks_of_worker", prefix=f"{worker_id}#", now=now, why=why)
    await _retry_later(tx, rows, now, why)
    return len(rows)


async def _retry_later(tx: Tx, rows: Sequence[Row], now: float, why: str) -> None:
    for r in rows:
        await _task_log(
            tx, r["task_row"], r["attempt"], now, [f"{r['event']}: {why}; will try again"]
        )


async def _task_log(
    tx: Tx, task_row: int | None, attempt: int | None, now: float, lines: Sequence[str]
) -> None:
    if task_row is None or not lines:
        return  # a run's own event has no task log: the worker's log has it
    await tx.executemany(
        "insert_event",
        [
            {
                "task_row": task_row,
                "ts": now,
                "kind": "callback",  # its own kind: not part of a later event's log tail
                "from_state": None,
                "to_state": None,
                "attempt": attempt or 0,
                "message": line,
            }
            for line in lines
        ],
    )
