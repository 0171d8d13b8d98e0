"""Loading a triggerer's waits at scale (issue 17), on SQLite and PostgreSQL, with the real
loader, table and store:

- a full reconcile reads again only the shards whose waits changed: the database's
  per-shard checksum (``shard_sums``) equals the table's own when nothing did, so an
  unchanged table is one aggregate query; a wait ended elsewhere is dropped, a row no
  incremental load returned is taken;
- a load of many shards reads windows of trigger ids, and misses none across gaps;
- a big load's first checks are spread over a window instead of all due at once; a small
  load's are all due at once.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from datetime import date
from itertools import pairwise

import pytest
from support import backends
from support.helpers import async_wait_until
from support.triggers import FlagTrigger, serving

from executor import DAG
from executor.store import Row, Store
from triggerer import loading
from triggerer.checks import CheckTable
from triggerer.loading import Loader
from triggerer.store import TriggererStore
from triggerer.writing import Outbox
from triggers.base import SHARDS

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
live_store = backends.live_store  # fixture

DAY = date(2026, 4, 27)
WAITS = 12

pytestmark = pytest.mark.usefixtures("fresh_triggers")


class CountingStore(TriggererStore):
    """The real store, noting which shards each load_triggers call read."""

    def __init__(self, store: Store) -> None:
        super().__init__(store.db, store.clock)
        self.reads: list[list[int]] = []
        self.windows: list[tuple[int, int | None]] = []  # (after_id, upto) of each read

    async def load_triggers(
        self, shards: Collection[int], after_id: int = 0, upto: int | None = None
    ) -> list[Row]:
        self.reads.append(sorted(shards))
        self.windows.append((after_id, upto))
        return await super().load_triggers(shards, after_id, upto)


async def deferred_waits(store: Store, dag_id: str, n: int = WAITS) -> str:
    """``n`` deferrable sensors of one run, DEFERRED by a worker (no triggerer)."""
    dag = DAG(dag_id)
    for i in range(n):
        dag.sensor(f"s{i}", FlagTrigger(name=f"{dag_id}{i}", poke_interval=60), mode="deferrable")
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False):

        async def all_deferred() -> bool:
            async with store.db.read() as tx:
                waits = await tx.fetch("load_triggers", shards=list(range(SHARDS)), after=0)
            return len(waits) >= n

        await async_wait_until(all_deferred, timeout=60, what=f"{n} sensors deferred")
    return run_id


def loader_on(ops: TriggererStore, table: CheckTable) -> Loader:
    return Loader(ops, table, Outbox(ops), shards_per_query=4, clock=time.time)


async def test_a_reconcile_reads_again_only_the_shards_that_changed(live_store) -> None:
    run_id = await deferred_waits(live_store, "reconcile")
    ops, table = CountingStore(live_store), CheckTable()
    loader = loader_on(ops, table)
    everything = range(SHARDS)
    await loader.load(everything, full=True)
    assert table.subscriptions == WAITS
    # The table's checksums are the database's, shard by shard.
    sums = await ops.shard_sums(everything)
    assert sums == {s: table.shard_sum(s) for s in sums}
    assert sum(n for n, _ in sums.values()) == WAITS

    ops.reads.clear()
    await loader.load(everything, full=True)
    assert ops.reads == [], "nothing changed: no rows read"
    assert table.subscriptions == WAITS

    # One wait ends elsewhere (its task resumed by another hand): only its shard is read,
    # and it is dropped.
    async with live_store.db.read() as tx:
        waits = await tx.fetch("load_triggers", shards=list(everything), after=0)
    gone = waits[0]
    assert gone["wait_kind"] == "task"  # its key in the table is its row id
    async with live_store.db.write() as tx:
        await tx.script(f"UPDATE task SET state = 'SUCCESS' WHERE id = {gone['wait_id']}")
    ops.reads.clear()
    await loader.load(everything, full=True)
    assert len(ops.reads) == 1 and gone["shard"] in ops.reads[0]
    assert table.subscriptions == WAITS - 1
    assert gone["wait_id"] not in table.by_row

    # A wait no incremental load returned (written behind its back) is taken.
    async with live_store.db.write() as tx:
        await tx.script(f"UPDATE task SET state = 'DEFERRED' WHERE id = {gone['wait_id']}")
    await loader.load(everything, full=True)
    assert table.subscriptions == WAITS
    assert gone["wait_id"] in table.by_row
    sums = await ops.shard_sums(everything)
    assert sums == {s: table.shard_sum(s) for s in sums}
    assert run_id


async def test_a_load_of_many_shards_reads_windows_of_ids_and_misses_none(
    live_store, monkeypatch
) -> None:
    await deferred_waits(live_store, "windows")
    async with live_store.db.read() as tx:
        ids = sorted(
            w["trigger_id"]
            for w in await tx.fetch("load_triggers", shards=list(range(SHARDS)), after=0)
        )
    # A gap in the ids: four waits in the middle ended elsewhere.
    gone = ids[4:8]
    async with live_store.db.write() as tx:
        await tx.script(
            f"UPDATE task SET state = 'SUCCESS' WHERE trigger_id IN ({', '.join(map(str, gone))})"
        )
    # Windows of two rows, widened across the gap.
    monkeypatch.setattr(loading, "_ROWS_PER_QUERY", 2)
    ops, table = CountingStore(live_store), CheckTable()
    await loader_on(ops, table).load(range(SHARDS), full=True)
    assert table.subscriptions == WAITS - len(gone)
    assert {sub.trigger_id for c in table.by_hash.values() for sub in c.subscribers.values()} == (
        set(ids) - set(gone)
    )
    windows = ops.windows
    assert len(windows) >= 4 and all(upto is not None for _, upto in windows), windows
    # They tile the ids from 0 to the newest, neither overlapping nor leaving a hole.
    assert windows[0][0] == 0 and windows[-1][1] == ids[-1]
    assert all(a[1] == b[0] for a, b in pairwise(windows)), windows

    # A load of a few shards reads them by shard, from the index on shard.
    ops.windows.clear()
    await loader_on(ops, CheckTable()).load(range(SHARDS // 8), full=True)
    assert ops.windows and all(upto is None for _, upto in ops.windows)


async def test_a_big_load_spreads_its_first_checks(live_store, monkeypatch) -> None:
    await deferred_waits(live_store, "spread")
    # As if 12 waits were many, at 4 checks/s: spread over 3 s (< their 60 s interval).
    monkeypatch.setattr(loading, "SPREAD_ABOVE", 10)
    monkeypatch.setattr(loading, "FIRST_CHECKS_PER_S", 4)
    table = CheckTable()
    ops = TriggererStore(live_store.db, live_store.clock)
    began = time.time()
    await Loader(ops, table, Outbox(ops), shards_per_query=SHARDS, clock=time.time).load(
        range(SHARDS), full=True
    )
    dues = sorted(check.due for check in table.by_hash.values())
    assert len(dues) == WAITS
    assert dues[0] < began + 1.0
    assert dues[-1] - dues[0] > 1.5, dues  # spread, not all at once
    assert dues[-1] < time.time() + 3.0

    # Really, a dozen waits are all due at once.
    monkeypatch.undo()
    table = CheckTable()
    began = time.time()
    await Loader(ops, table, Outbox(ops), shards_per_query=SHARDS, clock=time.time).load(
        range(SHARDS), full=True
    )
    assert all(check.due <= time.time() for check in table.by_hash.values())


def test_a_big_loads_first_checks_begin_when_the_load_is_expected_to_end() -> None:
    spread = loading._Spread.of(1_000_000, 100.0)
    assert spread is not None and spread.started == 100.0
    guessed = spread.began  # before a page is in: a fast machine's rate
    assert guessed == 100.0 + 1_000_000 / loading._GUESS_ROWS_PER_S
    spread.read(250_000, 105.0)  # a quarter in 5 s: the load ends at 120
    assert spread.began == 120.0
    assert spread.first_at(105.0, 250_000, 60.0) >= 120.0  # nothing due inside the load
    spread.read(900_000, 106.0)  # faster now: the estimate never moves back
    assert spread.began == 120.0
    assert loading._Spread.of(loading.SPREAD_ABOVE, 0.0) is None  # a small load: at once
