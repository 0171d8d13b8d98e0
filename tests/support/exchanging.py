"""The worker's exchange taken apart, for tests that play a worker one step at a time."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from executor.outcomes import Outcome
from executor.rows import MovedTask
from executor.store import Store
from executor.store.exchange import DEFAULT_QUEUES


async def claim(
    store: Store, owner: str, limit: int, queues: Sequence[str] = DEFAULT_QUEUES
) -> list[MovedTask]:
    """Take up to ``limit`` claimable tasks of ``queues`` for ``owner``, highest
    priority first, within their pools' slots."""
    return await store.exchange.exchange([], owner, limit, queues)


async def complete(store: Store, outcomes: Iterable[Outcome]) -> None:
    """Record a batch of finished attempts in one transaction."""
    await store.exchange.exchange(outcomes, "", 0)


async def run_counts(store: Store, run_id: str) -> dict[str, int]:
    """Task instances by state (a mapped task counts as its instances)."""
    counts: dict[str, int] = defaultdict(int)
    async with store.db.read() as tx:
        for row in await tx.fetch("run_counts", run_id=run_id):
            counts[row["state"]] += row["n"]
    return dict(counts)
