"""Three triggerers join while the first one's load is in flight, on SQLite and PostgreSQL:
each ends up holding exactly the waits of the shards it leases.

Real Triggerers (leases, loader, reconcile, their loops) over a real store, in one loop. The
first one's load is held after its query, until its lease loop has given shards away to
the newcomers: the page then lands with rows of shards no longer its own, which is what a
slow page of a 10,000-wait load meets by chance. Forced so, 2,000 waits show it every time
on both backends (held: all 2,000 against its 500 before the fix, still there after its
reconcile, which runs every second here) in a few seconds; a bigger load only makes the
window wider, and the property test (tests/unit/test_shard_ownership.py) covers the
interleavings.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import backends
from support.helpers import async_wait_until
from support.triggers import fast_config, write_flag_waits

from executor.store import Store
from triggerer.service import Triggerer
from triggers.base import SHARDS

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
live_store = backends.live_store  # fixture

pytestmark = pytest.mark.usefixtures("fresh_triggers")

WAITS = 2000
JOINING = 3


async def write_waits(store: Store, n: int) -> dict[int, int]:
    """``n`` DEFERRED tasks, each on its own never-true trigger row; task id -> shard."""
    await write_flag_waits(store, "handover", n)
    async with store.db.read() as tx:
        rows = await tx.fetch("load_triggers", shards=list(range(SHARDS)), after=0)
    return {r["wait_id"]: r["shard"] for r in rows}


async def test_triggerers_joining_during_a_load_hold_exactly_the_waits_of_their_shards(
    live_store: Store,
) -> None:
    waits = await write_waits(live_store, WAITS)
    assert len(waits) == WAITS
    config: dict[str, Any] = dict(lease_ttl=3.0, lease_every=0.1, reload_every=1.0)
    first = Triggerer(live_store.views, config=fast_config(**config))
    joined = asyncio.Event()
    real_load = first.ops.load_triggers

    async def held_page(*args: Any, **kwargs: Any) -> Any:
        rows = await real_load(*args, **kwargs)
        if not joined.is_set():  # the first page of its first load, read: others join now
            joined.set()
            await async_wait_until(
                lambda: 0 < len(first.shards) < SHARDS, timeout=20, what="shards given away"
            )
        return rows

    first.ops.load_triggers = held_page  # type: ignore[method-assign]
    triggerers = [first]
    tasks = [asyncio.create_task(first.run())]
    try:
        await asyncio.wait_for(joined.wait(), 20)
        for _ in range(JOINING):
            t = Triggerer(live_store.views, config=fast_config(**config))
            triggerers.append(t)
            tasks.append(asyncio.create_task(t.run()))

        async def leased() -> dict[str, set[int]]:
            async with live_store.db.read() as tx:
                got = await tx.fetch("ops_shard_leases")
            out: dict[str, set[int]] = {}
            for r in got:
                out.setdefault(r["owner"], set()).add(r["shard"])
            return out

        def exact(owners: dict[str, set[int]]) -> bool:
            return (
                all(
                    set(t.table.by_row)
                    == {w for w, s in waits.items() if s in owners.get(t.id, ())}
                    and t.shards == owners.get(t.id, set())
                    for t in triggerers
                )
                and sum(map(len, owners.values())) == SHARDS
            )

        async def settled() -> bool:
            return all(len(t.shards) == SHARDS // (JOINING + 1) for t in triggerers) and exact(
                await leased()
            )

        try:
            await async_wait_until(settled, timeout=20, what="each holding its shards' waits")
        except AssertionError as exc:
            owners = await leased()
            tgs = triggerers
            held = {t.id: (len(t.shards), t.table.subscriptions) for t in tgs}
            want = {t.id: sum(s in owners.get(t.id, ()) for s in waits.values()) for t in tgs}
            raise AssertionError(f"held (shards, waits) {held}, their shards' {want}") from exc
    finally:
        for t in triggerers:
            t.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
