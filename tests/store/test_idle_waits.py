"""Idle waits cost nothing, on SQLite and PostgreSQL: with thousands of waits held (polled
ones in the check table, event waits only in the database) and nothing happening, the
minutely reconcile, its orphan repair and the cleanup read none of them.

A real Triggerer on a real store, its reconcile and cleanup every 0.1 s: once its first
load and full repair are done, three more reconciles are recorded statement by statement
(each through the driver's own calls). None may run a statement that reads a shard's
waits whole (the checksums, the orphan searches of shards, the load of a shard), and on
SQLite, where the work is countable, the statements may cost 2,000 SQLite VM instructions
each on average (they cost a few hundred; one read of 4,000 waits costs tens of
thousands). The changes that do happen are still found: a wait ended and a trigger row
deleted behind the store's back, during the idle passes, are dropped and repaired by the
next.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from support import backends
from support.helpers import async_wait_until, raw_sql
from support.triggers import fast_config, write_flag_waits

from executor.driver import postgres, sqlite
from executor.store import Store
from triggerer.service import Triggerer
from triggers.base import SHARDS

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
live_store = backends.live_store  # fixture

pytestmark = pytest.mark.usefixtures("fresh_triggers")

POLLED = 2000  # held in the check table
EVENTS = 2000  # event waits: only in the database
# SQLite VM instructions a statement of an idle pass may cost on average.
PER_STATEMENT = 2000
# Statements that read the waits of whole shards: an idle pass must run none of them.
WHOLE_SHARDS = {
    "shard_sums",
    "orphan_deferred",
    "delete_orphan_triggers",
    "load_trigger_range",
}


class Statements:
    """The statements the driver runs while ``on``: (name, parameters) and rows returned."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.rows = 0
        self.rows_of: Counter[str] = Counter()  # rows returned, by statement

    def wrap(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for cls in (sqlite.SqliteTx, sqlite._ThreadTx, postgres.PostgresTx):
            # SQLite's fetchone is its fetch: counted there.
            for method in (
                "fetch",
                "execute",
                *(("fetchone",) if cls is postgres.PostgresTx else ()),
            ):
                if method in vars(cls):
                    monkeypatch.setattr(cls, method, self._recording(getattr(cls, method)))

    def _recording(self, real: Any) -> Any:
        async def call(tx: Any, name: str, /, **params: Any) -> Any:
            got = await real(tx, name, **params)
            if self.on:
                self.calls.append((name, params))
                n = len(got) if isinstance(got, list) else 0 if got is None else 1
                self.rows += n
                self.rows_of[name] += n
            return got

        return call


async def write_waits(store: Store) -> None:
    """POLLED never-true polled waits and EVENTS event waits, each on its own trigger row."""
    await write_flag_waits(store, "idle", POLLED + EVENTS, polled=POLLED, timeout_at=4e9)


async def count_vm_steps(store: Store) -> list[int]:
    """Count the SQLite VM instructions of the store's connection, by hundreds, from now
    (the list's one item grows)."""
    counter = [0]

    def tick() -> int:
        counter[0] += 1
        return 0  # go on

    conn = store.db._conn  # type: ignore[attr-defined]
    await conn._execute(lambda: conn._conn.set_progress_handler(tick, 100))
    return counter


async def test_an_idle_reconcile_and_cleanup_read_none_of_the_waits(
    live_store: Store, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_waits(live_store)
    statements = Statements()
    statements.wrap(monkeypatch)
    trig = Triggerer(
        live_store.views,
        config=fast_config(reload_every=0.1, cleanup_every=0.1, lease_every=0.5),
    )
    task = asyncio.create_task(trig.run())
    try:
        await asyncio.wait_for(trig.loaded(), 30)
        await async_wait_until(
            lambda: trig.table.subscriptions == POLLED, timeout=30, what="all polled waits held"
        )
        # Its first full repair is done once a reconcile after the first load has run.
        steps = await count_vm_steps(live_store) if url.startswith("sqlite") else None

        def reconciles() -> int:
            return sum(1 for name, _ in statements.calls if name == "max_trigger_id")

        statements.on = True
        await async_wait_until(lambda: reconciles() >= 2, timeout=30, what="two reconciles")
        statements.calls.clear()
        statements.rows = 0
        if steps is not None:
            steps[0] = 0
        await async_wait_until(lambda: reconciles() >= 3, timeout=30, what="three reconciles")
        names = Counter(name for name, _ in statements.calls)
        assert not WHOLE_SHARDS & set(names), names
        # The loads in the window are incremental (rows above the newest id): no full one.
        assert all(p.get("after", 1) > 0 for n, p in statements.calls if n == "load_triggers")
        assert statements.rows <= 3 * SHARDS, (statements.rows, names)  # shard leases, at most
        if steps is not None:
            # Each statement is a few hundred instructions (64 shards' index look-ups): a
            # read of 4,000 waits costs tens of thousands.
            per_statement = steps[0] * 100 / len(statements.calls)
            assert per_statement < PER_STATEMENT, (per_statement, names)

        # What does change is still found: a wait ended behind the store's back is dropped,
        # an event wait whose trigger row is deleted is repaired ("trigger row missing").
        async with live_store.db.read() as tx:
            rows = await tx.fetch("load_triggers", shards=list(range(SHARDS)), after=0)
        gone = rows[0]["wait_id"]
        await raw_sql(url, f"UPDATE task SET state = 'SUCCESS' WHERE id = {gone}")
        orphan = (
            await raw_sql(url, f"SELECT id, trigger_id FROM task WHERE task_id = 'w{POLLED + 1}'")
        )[0]
        await raw_sql(url, f"DELETE FROM trigger WHERE id = {orphan['trigger_id']}")

        async def repaired() -> bool:
            state = await raw_sql(url, f"SELECT state FROM task WHERE id = {orphan['id']}")
            return gone not in trig.table.by_row and state[0]["state"] == "FAILED"

        await async_wait_until(repaired, timeout=30, what="the changes found")
        assert trig.table.subscriptions == POLLED - 1
    finally:
        trig.stop()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_backlog_of_changes_is_taken_whole_a_few_rows_a_transaction(
    live_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change log of a bulk write (every wait began) is taken in transactions of a
    bounded size, none left behind."""
    from triggerer import store as triggerer_store
    from triggerer.store import TriggererStore

    await write_waits(live_store)
    monkeypatch.setattr(triggerer_store, "_CHANGES_PER_TAKE", 700)
    statements = Statements()
    statements.wrap(monkeypatch)
    statements.on = True
    ops = TriggererStore(live_store.db, live_store.clock)
    changes = await ops.take_wait_changes(range(SHARDS))
    takes = sum(1 for name, _ in statements.calls if name == "take_wait_changes")
    assert takes == (POLLED + EVENTS) // 700 + 1
    assert len(changes.task_rows) == len(changes.trigger_ids) == POLLED + EVENTS
    assert changes.shards == set(range(SHARDS))
    again = await ops.take_wait_changes(range(SHARDS))
    assert len(again.task_rows) == POLLED + EVENTS  # nothing new: the same, kept


async def test_a_start_after_a_bulk_write_reads_none_of_its_change_log(
    live_store: Store, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh triggerer reads and searches its shards whole: the bulk write's change log
    (a row per wait) is dropped unread, not read back row by row (a million of them read
    so doubled the CPU of a million-wait start, and delayed its load behind them). It is
    dropped before the load reads them, so no reconcile compares them after it, and what
    changes after the drop is still logged and found."""
    await write_waits(live_store)
    assert (await raw_sql(url, "SELECT count(*) AS n FROM wait_change"))[0]["n"] >= POLLED
    statements = Statements()
    statements.wrap(monkeypatch)
    statements.on = True
    trig = Triggerer(live_store.views, config=fast_config(reload_every=0.2, cleanup_every=0.1))
    task = asyncio.create_task(trig.run())
    try:
        await async_wait_until(
            lambda: trig.table.subscriptions == POLLED, timeout=30, what="all polled waits held"
        )
        await async_wait_until(
            lambda: trig.repair.settled(trig.leases.shards) == set(range(SHARDS)),
            timeout=30,
            what="a full repair of every shard",
        )
        assert statements.rows_of["take_wait_changes"] == 0, statements.rows_of
        assert "drop_all_wait_changes" in {name for name, _ in statements.calls}
        assert (await raw_sql(url, "SELECT count(*) AS n FROM wait_change"))[0]["n"] == 0
        # The log was dropped before the load read the shards: no reconcile after it has
        # a shard's checksum to compare.
        statements.calls.clear()
        await async_wait_until(
            lambda: sum(1 for name, _ in statements.calls if name == "max_trigger_id") >= 2,
            timeout=30,
            what="two reconciles",
        )
        assert "shard_sums" not in {name for name, _ in statements.calls}

        # A change after the drop is logged and found: a wait ended behind the store's back
        # is dropped by a reconcile, an event wait's trigger row deleted is repaired.
        async with live_store.db.read() as tx:
            rows = await tx.fetch("load_triggers", shards=list(range(SHARDS)), after=0)
        gone = rows[0]["wait_id"]
        await raw_sql(url, f"UPDATE task SET state = 'SUCCESS' WHERE id = {gone}")
        orphan = (
            await raw_sql(url, f"SELECT id, trigger_id FROM task WHERE task_id = 'w{POLLED + 1}'")
        )[0]
        await raw_sql(url, f"DELETE FROM trigger WHERE id = {orphan['trigger_id']}")

        async def found() -> bool:
            state = await raw_sql(url, f"SELECT state FROM task WHERE id = {orphan['id']}")
            return gone not in trig.table.by_row and state[0]["state"] == "FAILED"

        await async_wait_until(found, timeout=30, what="the changes found")
        assert statements.rows_of["take_wait_changes"] >= 2  # read, these two only
    finally:
        trig.stop()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_drop_deletes_the_log_of_its_shards_only_a_window_a_transaction(
    live_store: Store, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """drop_wait_changes of some shards deletes their rows, window by window of ids, and
    leaves the other shards' for their holders; of every shard, one statement."""
    from triggerer import store as triggerer_store
    from triggerer.store import TriggererStore

    await write_waits(live_store)
    monkeypatch.setattr(triggerer_store, "_CHANGES_PER_TAKE", 700)
    statements = Statements()
    statements.wrap(monkeypatch)
    statements.on = True
    ops = TriggererStore(live_store.db, live_store.clock)
    ours = set(range(0, SHARDS, 2))

    async def log() -> Counter[int]:
        rows = await raw_sql(url, "SELECT shard, count(*) AS n FROM wait_change GROUP BY shard")
        return Counter({int(r["shard"]): int(r["n"]) for r in rows})

    before = await log()
    assert set(before) == set(range(SHARDS))
    dropped = await ops.drop_wait_changes(ours)
    assert dropped == sum(n for s, n in before.items() if s in ours)
    assert await log() == Counter({s: n for s, n in before.items() if s not in ours})
    windows = sum(1 for name, _ in statements.calls if name == "drop_wait_changes")
    assert windows == (POLLED + EVENTS) // 700 + 1  # windows of any shard's ids
    assert statements.rows_of["wait_change_window"] == windows + 1  # the last finds none
    assert not ops.changes.shards  # named by the caller, not here

    assert await ops.drop_wait_changes(range(SHARDS)) == sum(
        n for s, n in before.items() if s not in ours
    )
    assert not await log()
    assert [name for name, _ in statements.calls][-1] == "drop_all_wait_changes"
