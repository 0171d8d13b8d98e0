"""The audit list in the store (executor/store/audit.py), on SQLite and PostgreSQL: rows
come back newest first, ``since`` and ``limit`` bound them, a row written in a write's
transaction rolls back with it, and text neither backend could hold is kept escaped."""

from __future__ import annotations

import pytest
from support import backends
from support.helpers import FakeClock

from executor.store import Store
from executor.store.audit import MAX_DETAIL, MAX_LIST, record_in

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture


async def test_rows_come_back_newest_first_bounded_by_since_and_limit(
    store: Store, clock: FakeClock
) -> None:
    t0 = clock()
    await store.audit.record(who="alice", role="operator", via="web", action="trigger",
                             target="dag:hello", detail={"conf": {"n": 2}})  # fmt: skip
    clock.advance(10)
    await store.audit.record(who="bob", role="viewer", via="api", action="pause",
                             target="dag:hello", outcome="refused")  # fmt: skip
    rows = await store.audit.since()
    assert [(r.who, r.role, r.via, r.action, r.target, r.outcome) for r in rows] == [
        ("bob", "viewer", "api", "pause", "dag:hello", "refused"),
        ("alice", "operator", "web", "trigger", "dag:hello", "ok"),
    ]
    assert rows[1].detail == {"conf": {"n": 2}} and rows[0].detail == {}
    assert rows[1].ts == pytest.approx(t0) and rows[0].ts == pytest.approx(t0 + 10)
    assert [r.who for r in await store.audit.since(t0 + 5)] == ["bob"]
    assert [r.who for r in await store.audit.since(limit=1)] == ["bob"]
    assert await store.audit.since(t0 + 11) == []
    assert len(await store.audit.since(limit=MAX_LIST + 5)) == 2


async def test_a_row_in_a_write_transaction_rolls_back_with_it(
    store: Store, clock: FakeClock
) -> None:
    with pytest.raises(RuntimeError):
        async with store.db.write() as tx:
            await record_in(tx, ts=clock(), who="alice", role="admin", via="api",
                            action="pause", target="dag:x")  # fmt: skip
            raise RuntimeError("the write failed")
    assert await store.audit.since() == []
    async with store.db.write() as tx:
        await record_in(tx, ts=clock(), who="alice", role="admin", via="api",
                        action="pause", target="dag:x")  # fmt: skip
    assert [r.action for r in await store.audit.since()] == ["pause"]


async def test_text_no_backend_holds_is_escaped_and_long_fields_are_cut(store: Store) -> None:
    await store.audit.record(
        who="a\x00b", role="operator", via="web", action="clear",
        target="task:\ud800/" + "t" * 2000, detail={"conf": "x\x00\udfff" + "y" * 10_000},
    )  # fmt: skip
    [row] = await store.audit.since()
    assert row.who == "a\\0b" and row.target.startswith("task:\\ud800/")
    assert len(row.target) <= 500 + 10
    assert set(row.detail) == {"cut"} and len(row.detail["cut"]) < MAX_DETAIL
