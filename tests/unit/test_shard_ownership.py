"""A triggerer holds exactly the waits of the shards it leases, whatever the interleaving of
lease changes (a newcomer joining, a peer dying, leases lost) with the pages of a load.

The real Loader, Leases and CheckTable over a store kept in memory: each call the loader
makes into the store is a point where the lease loop may run (a renewal granting another
set of shards, with its drop of the checks of the shards gone), as it does while a real
load awaits its next page. Hypothesis draws the grants, where they land and how the
loader's and the renewal's steps overlap.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.driver.liveness import NoLiveness
from triggerer import loading
from triggerer.checks import CheckTable
from triggerer.config import TriggererConfig
from triggerer.leasing import Leases
from triggerer.loading import Loader
from triggerer.store import WaitChanges
from triggerer.waitref import wait_sum
from triggerer.writing import Outbox
from triggers.base import SHARDS, BaseTrigger, TriggerEvent
from triggers.context import TriggerContext
from triggers.registry import register


@register
class NeverTrigger(BaseTrigger):
    """Never true: only held."""

    name: str

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        return None


CLASSPATH = NeverTrigger.classpath()
COLUMNS = (
    "trigger_id", "classpath", "kwargs", "poke_hash", "shard",
    "wait_kind", "wait_id", "next_method", "not_before",
)  # fmt: skip


class FakeRow(tuple[Any, ...]):
    """A row as both drivers' rows read: by position, and by name through keys()."""

    def keys(self) -> tuple[str, ...]:
        return COLUMNS


def wait_row(i: int) -> FakeRow:
    kwargs = json.dumps({"name": f"w{i}", "poke_interval": 60})
    # Shards by i, so every shard has waits whatever the count; ids ascending.
    return FakeRow((i, CLASSPATH, kwargs, f"h{i}", i % SHARDS, "task", 1000 + i, None, None))


@dataclass
class Interleaving:
    """At the loader's store call number ``at``, a renewal granting ``grant`` starts; the
    call returns after ``yields`` turns of the loop (0: before the renewal got anywhere)."""

    at: int
    grant: frozenset[int]
    yields: int


@dataclass
class MemoryStore:
    """The store's side of loads and renewals, in memory."""

    rows: list[FakeRow] = field(default_factory=list)
    grants: list[frozenset[int]] = field(default_factory=list)
    plan: list[Interleaving] = field(default_factory=list)
    calls: int = 0
    leases: Leases | None = None
    renewing: asyncio.Lock = field(default_factory=asyncio.Lock)
    renewals: list[asyncio.Task[None]] = field(default_factory=list)
    changed: set[int] = field(default_factory=set)  # the change log: shards named
    changes: WaitChanges = field(default_factory=WaitChanges)

    def write(self, rows: list[FakeRow]) -> None:
        """New waits, as a worker's deferral writes them (the log names their shards)."""
        self.rows += rows
        self.changed |= {r[4] for r in rows}

    async def _interleave(self) -> None:
        self.calls += 1
        for step in [s for s in self.plan if s.at == self.calls]:
            self.plan.remove(step)
            self.renewals.append(asyncio.create_task(self.renew(step.grant)))
            for _ in range(step.yields):
                await asyncio.sleep(0)

    async def renew(self, grant: frozenset[int]) -> None:
        async with self.renewing:  # one lease loop: renewals never overlap
            self.grants.append(grant)
            assert self.leases is not None
            await self.leases._renew()

    # -- the lease side

    async def lease_shards(self, *args: Any, **kwargs: Any) -> set[int]:
        return set(self.grants.pop(0))

    async def triggerer_beat(self, *args: Any) -> None: ...

    # -- the loader's side

    async def max_trigger_id(self) -> int:
        await self._interleave()
        return max((r[0] for r in self.rows), default=0)

    async def max_release_id(self) -> int:
        return 0

    async def take_wait_changes(self, shards: Collection[int]) -> WaitChanges:
        named = self.changed & set(shards)
        self.changed -= named
        self.changes.shards |= named
        await self._interleave()
        return self.changes

    async def drop_wait_changes(self, shards: Collection[int]) -> int:
        named = self.changed & set(shards)
        self.changed -= named
        await self._interleave()
        return len(named)

    async def released_waits(self, after_id: int) -> list[Any]:
        return []

    async def shard_sums(self, shards: Collection[int]) -> dict[int, tuple[int, int]]:
        sums: dict[int, tuple[int, int]] = {}
        for r in self.rows:
            if r[4] in shards:
                n, h = sums.get(r[4], (0, 0))
                sums[r[4]] = (n + 1, h + wait_sum(r[6], r[0]))
        await self._interleave()
        return sums

    async def load_triggers(
        self, shards: Collection[int], after_id: int = 0, upto: int | None = None
    ) -> list[Any]:
        top = upto if upto is not None else max((r[0] for r in self.rows), default=0)
        # The query saw the shards it was given: the answer comes back after the awaits.
        got = [r for r in self.rows if r[4] in shards and after_id < r[0] <= top]
        await self._interleave()
        return got


shard_sets = st.frozensets(st.integers(0, SHARDS - 1))
steps = st.lists(
    st.tuples(
        st.booleans(),  # a full load, or an incremental one
        st.integers(0, 40),  # new waits written before it
        st.lists(
            st.builds(Interleaving, st.integers(1, 12), shard_sets, st.integers(0, 3)),
            max_size=3,
        ),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=shard_sets, steps=steps, rows_per_query=st.sampled_from([3, 20, 20_000]))
def test_a_triggerer_holds_exactly_the_waits_of_the_shards_it_leases(
    first: frozenset[int],
    steps: list[tuple[bool, int, list[Interleaving]]],
    rows_per_query: int,
) -> None:
    async def scenario() -> None:
        store = MemoryStore(rows=[wait_row(i) for i in range(1, 300)])
        table = CheckTable()
        leases = Leases(
            store,  # type: ignore[arg-type]
            "me",
            NoLiveness(),
            table,
            TriggererConfig(),
            wake_checker=asyncio.Event(),
            moved=lambda: None,
            lag=lambda: 0.0,
        )
        store.leases = leases
        loader = Loader(store, table, Outbox(store), shards_per_query=4, clock=lambda: 1000.0)  # type: ignore[arg-type]
        await store.renew(first)
        await loader.load(leases.shards, full=True)
        for full, new, plan in steps:
            top = max(r[0] for r in store.rows)
            store.write([wait_row(i) for i in range(top + 1, top + 1 + new)])
            store.calls, store.plan = 0, list(plan)
            await loader.load(leases.shards, full=full)
            await asyncio.gather(*store.renewals)
            store.renewals.clear()
            # Whatever landed during it, nothing is held of a shard not leased.
            held = {check.shard for check in table.by_hash.values()}
            assert held <= leases.shards, sorted(held - leases.shards)
        # The reload a change of shards asks for, with the leases quiet: exactly theirs.
        store.plan = []
        await loader.load(leases.shards, full=True)
        want = {r[6] for r in store.rows if r[4] in leases.shards}
        assert set(table.by_row) == want
        assert sum(table.shard_sum(s)[0] for s in range(SHARDS)) == len(want)

    with _rows_per_query(rows_per_query):
        asyncio.run(scenario())


class _rows_per_query:
    """Pages of this many rows (windows of ids, groups of shards), restored after."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        self.old = loading._ROWS_PER_QUERY
        loading._ROWS_PER_QUERY = self.n

    def __exit__(self, *exc: object) -> None:
        loading._ROWS_PER_QUERY = self.old


def test_a_shard_taken_while_a_full_load_begins_is_loaded_by_the_next() -> None:
    """A renewal grants a shard while a full load awaits its first statement: that load
    pages over the shards it began with, and the reload the grant asks for reads the new
    one (it once counted as looked at, and its waits were never held)."""

    async def scenario() -> None:
        store = MemoryStore(rows=[wait_row(i) for i in range(1, 300)])
        table = CheckTable()
        leases = Leases(
            store,  # type: ignore[arg-type]
            "me",
            NoLiveness(),
            table,
            TriggererConfig(),
            wake_checker=asyncio.Event(),
            moved=lambda: None,
            lag=lambda: 0.0,
        )
        store.leases = leases
        loader = Loader(store, table, Outbox(store), shards_per_query=4, clock=lambda: 1000.0)  # type: ignore[arg-type]
        await store.renew(frozenset({0}))
        await loader.load(leases.shards, full=True)
        store.calls, store.plan = 0, [Interleaving(1, frozenset({0, 1}), 3)]  # max_trigger_id
        await loader.load(leases.shards, full=True)
        await asyncio.gather(*store.renewals)
        assert leases.shards == {0, 1}
        store.plan = []
        await loader.load(leases.shards, full=True)
        want = {r[6] for r in store.rows if r[4] in leases.shards}
        assert set(table.by_row) == want, sorted(want - set(table.by_row))

    asyncio.run(scenario())
