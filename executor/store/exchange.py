"""The engine's exchange with the store: claiming tasks and recording what their attempts
did, heartbeats, and taking back the attempts of a worker that is gone.

A worker's steady state is one :meth:`Exchange.exchange` per batch: outcomes in, newly
claimable tasks out, in one transaction.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from ..driver.db import Tx
from ..outcomes import Outcome
from ..pools import DEFAULT, claim_rounds
from ..rows import MovedTask
from ..statemachine import retry_or_fail, transition
from ..states import State
from .callbacks import CallbackRow, claim_callbacks, reclaim_callbacks_of
from .part import Part
from .recording import record_outcomes

DEFAULT_QUEUES = (DEFAULT,)


class Exchange(Part):
    """Claiming and recording, for the workers: every attempt's way in and out."""

    async def exchange(
        self,
        outcomes: Iterable[Outcome],
        owner: str,
        limit: int,
        queues: Sequence[str] = DEFAULT_QUEUES,
        callbacks: list[CallbackRow] | None = None,
        busy: Sequence[int] = (),
    ) -> list[MovedTask]:
        """Record finished attempts and claim up to ``limit`` new tasks, in one transaction.

        A worker's steady state is one transaction per batch in each direction at once:
        what finished goes in, what is now runnable (often its children) comes out. Only
        tasks of ``queues`` are claimed, and only as many of a pool as its free slots
        (:func:`executor.pools.claim_rounds`: the check and the claim in this transaction).
        Given a ``callbacks`` list, the slots no task took claim due callback rows into it.
        Rows in ``busy`` are not claimed: the worker still runs an earlier, taken-back copy
        of them (a thread cannot always stop at once), and one worker holds one copy of a
        row at a time.
        """
        outcomes = list(outcomes)
        if not outcomes and limit <= 0:
            return []
        now = self.clock()

        async def body(tx: Tx) -> list[MovedTask]:
            if outcomes:
                await record_outcomes(tx, outcomes, now)
            if limit <= 0:
                return []
            claimed: list[MovedTask] = []
            async for batch in claim_rounds(tx, now, queues, limit, busy):
                by_state: dict[str, list[int]] = defaultdict(list)
                for c in batch:
                    by_state[c.state].append(c.id)
                for state, ids in by_state.items():
                    claimed += await transition(
                        tx,
                        ids,
                        State(state),
                        State.RUNNING,
                        now=now,
                        message=f"claimed by {owner}",
                        owner=owner,
                    )
            for row in claimed:
                # A chain's next task: its parents' outputs read here, not in a second
                # transaction before it runs. A mapped instance's row does not say whether
                # it has parents besides its source: its attempt reads them.
                if row.n_parents and row.map_index < 0:
                    row.inputs = await _parent_outputs(tx, row)
            if callbacks is not None:
                callbacks.extend(await claim_callbacks(tx, owner, limit - len(claimed), now))
            return claimed

        # One call into SQLite's driver thread for the whole transaction (the worker's
        # hot path: a round trip per statement was most of a no-op task's cost).
        return await self.db.transact(body)

    async def parent_outputs(self, row: MovedTask) -> dict[str, Any]:
        """``ctx.inputs`` for a claimed task: each parent's output, a mapped one as a list."""
        async with self.db.read() as tx:
            return await _parent_outputs(tx, row)

    async def heartbeat(self, owner: str, ids: Sequence[int]) -> list[int]:
        """Heartbeat ``owner``'s rows; returns those it still holds (the others were taken
        back: reaped, cleared with force, cancelled)."""
        async with self.db.write() as tx:
            rows = await tx.fetch("heartbeat", now=self.clock(), ids=list(ids), owner=owner)
        return [r["id"] for r in rows]

    # -- liveness: the workers that run, and taking back a dead one's attempts ----------

    async def worker_beat(
        self, worker_id: str, queues: Sequence[str], slots: int, ttl: float
    ) -> None:
        """List this worker, live for the next ``ttl`` seconds unless its liveness lock is
        released first, with the queues it serves (read by the others' liveness checks and
        by status, to find queues nobody serves)."""
        now = self.clock()
        async with self.db.write() as tx:
            await tx.execute("worker_beat", id=worker_id, now=now, expires_at=now + ttl)
            await tx.executemany(
                "worker_serves",
                [{"worker_id": worker_id, "queue": q, "slots": slots} for q in queues],
            )

    async def worker_leave(self, worker_id: str) -> None:
        async with self.db.write() as tx:
            await _forget_worker(tx, worker_id)

    async def other_workers(self, me: str) -> list[str]:
        async with self.db.read() as tx:
            return [r["id"] for r in await tx.fetch("other_workers", me=me)]

    async def reap_worker(self, worker_id: str, why: str) -> int:
        """Take back every attempt of a worker whose process is gone (its liveness lock was
        released), retrying or failing each per its policy, make the callbacks it was
        delivering claimable again, and forget the worker. Returns how many rows moved."""
        now = self.clock()
        taken = 0
        async with self.db.write() as tx:
            for row in await tx.fetch("running_of_worker", prefix=f"{worker_id}#"):
                moved = await retry_or_fail(
                    tx, row["id"], State.RUNNING, attempt=row["attempt"],
                    max_attempts=row["max_attempts"], now=now,
                    why=f"worker {row['owner']} lost: {why}", expect_owner=row["owner"],
                    queued_since=row["run_created_at"],
                )  # fmt: skip
                taken += len(moved)
            taken += await reclaim_callbacks_of(tx, worker_id, now, why)
            await _forget_worker(tx, worker_id)
        return taken

    async def reap(self, stale_after: float) -> int:
        """Take back tasks whose worker stopped heartbeating; retry or fail them per policy."""
        now = self.clock()
        taken = 0
        async with self.db.write() as tx:
            await tx.execute("forget_stale_workers", before=now - stale_after)
            await tx.execute("worker_queues_forget")
            for row in await tx.fetch("stale_running", before=now - stale_after):
                why = (
                    f"worker {row['owner']} lost: no heartbeat for "
                    f"{now - row['heartbeat_at']:.1f} s"
                )
                moved = await retry_or_fail(
                    tx, row["id"], State.RUNNING, attempt=row["attempt"],
                    max_attempts=row["max_attempts"], now=now, why=why,
                    expect_owner=row["owner"], queued_since=row["run_created_at"],
                )  # fmt: skip
                taken += len(moved)
        return taken


async def _parent_outputs(tx: Tx, row: MovedTask) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    rows = await tx.fetch(
        "parent_outputs",
        run_id=row.run_id,
        task_id=row.task_id,
        leave_out=row.expand_from if row.map_index >= 0 else None,
    )
    for r in rows:
        value = None if r["output"] is None else json.loads(r["output"])
        if r["map_index"] < 0:
            inputs[r["task_id"]] = [] if r["expand_from"] is not None else value
        else:
            inputs[r["task_id"]].append(value)
    return inputs


async def _forget_worker(tx: Tx, worker_id: str) -> None:
    await tx.execute("worker_leave", id=worker_id)
    await tx.execute("worker_queues_leave", id=worker_id)
