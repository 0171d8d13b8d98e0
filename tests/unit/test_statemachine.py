"""The state machine: every legal transition goes through the one compare-and-set, every
illegal one is refused, and a repeated or stale compare-and-set changes nothing."""

from __future__ import annotations

import asyncio
import itertools
from datetime import date
from typing import Any

import pytest
from support.exchanging import claim, complete, run_counts
from support.helpers import FakeClock, sql

from executor import DAG
from executor.outcomes import Failed, Succeeded
from executor.statemachine import transition
from executor.states import ALLOWED, TERMINAL, IllegalTransition, State
from executor.store import Store, open_store

PAIRS = list(itertools.product(State, State))
LEGAL = [(a, b) for a, b in PAIRS if b in ALLOWED[a]]
ILLEGAL = [(a, b) for a, b in PAIRS if b not in ALLOWED[a]]
NOW = 5_000.0


def small_dag() -> DAG:
    dag = DAG("sm")

    @dag.task
    def parent(ctx):
        return 1

    @dag.task(parents=[parent])
    def child(ctx):
        return 2

    return dag


async def new_run(store: Store) -> tuple[str, int, int]:
    run_id = await store.runs.create_run(small_dag(), date(2026, 3, 1))
    rows = {r["task_id"]: r["id"] for r in await store.views.run_tasks(run_id)}
    return run_id, rows["parent"], rows["child"]


def put(db_path, row_id: int, state: State, owner: str | None = None) -> None:
    """Force a row into a state (test setup only), as if earlier transitions had led there."""
    sql(
        db_path,
        "UPDATE task SET state = ?, owner = ?, ready_at = NULL WHERE id = ?",
        state.value,
        owner,
        row_id,
    )


def row(db_path, row_id: int) -> dict:
    return sql(db_path, "SELECT * FROM task WHERE id = ?", row_id)[0]


def transitions(db_path, row_id: int) -> list[dict]:
    return sql(
        db_path,
        "SELECT * FROM task_event WHERE task_row = ? AND kind = 'transition' ORDER BY id",
        row_id,
    )


def test_the_table_covers_every_state() -> None:
    assert set(ALLOWED) == set(State)
    for state in TERMINAL:
        # Terminal for the engine: only an operator's clear leaves it (back to PENDING).
        assert ALLOWED[state] == {State.PENDING}, f"{state} is terminal but for a clear"
    # the core transitions are all there
    for a, b in [
        ("PENDING", "RUNNING"),
        ("RUNNING", "SUCCESS"),
        ("RUNNING", "RETRYING"),
        ("RUNNING", "FAILED"),
        ("RETRYING", "RUNNING"),
        ("PENDING", "SKIPPED"),
        ("PENDING", "UPSTREAM_FAILED"),
    ]:
        assert State(b) in ALLOWED[State(a)]
    assert State.RUNNING not in ALLOWED[State.RUNNING]


@pytest.mark.parametrize(("expected", "new"), LEGAL, ids=[f"{a}->{b}" for a, b in LEGAL])
async def test_every_legal_transition(store: Store, db_path, expected: State, new: State):
    run_id, parent, child = await new_run(store)
    put(db_path, parent, expected, owner="w#1" if expected is State.RUNNING else None)
    before = len(transitions(db_path, parent))
    owner = "w#2" if new is State.RUNNING else None
    async with store.db.write() as tx:
        moved = await transition(
            tx,
            [parent],
            expected,
            new,
            now=NOW,
            message="by the test",
            owner=owner,
            ready_at=NOW + 10 if new is State.RETRYING else None,
        )
    assert [m.id for m in moved] == [parent]
    assert moved[0].state == new.value
    r = row(db_path, parent)
    assert r["state"] == new.value
    assert r["updated_at"] == NOW
    events = transitions(db_path, parent)
    assert len(events) == before + 1
    last = events[-1]
    assert (last["from_state"], last["to_state"], last["message"], last["ts"]) == (
        expected.value,
        new.value,
        "by the test",
        NOW,
    )
    if new is State.RUNNING:
        assert (r["owner"], r["heartbeat_at"]) == ("w#2", NOW)
    if new in TERMINAL:
        assert r["ended_at"] == NOW
        # the parent's end is counted in the child's counters in the same transaction
        c = row(db_path, child)
        assert c["n_done"] == 1
        assert c["n_success"] == int(new is State.SUCCESS)
        assert c["n_failed"] == int(new is State.FAILED)
        assert c["n_upstream_failed"] == int(new is State.UPSTREAM_FAILED)
        assert c["n_skipped"] == int(new is State.SKIPPED)
        if new is State.SUCCESS:
            assert c["state"] == "PENDING" and c["ready_at"] == NOW
        else:
            assert c["state"] == ("SKIPPED" if new is State.SKIPPED else "UPSTREAM_FAILED")
            info = await store.views.run_info(run_id)
            assert info is not None and info["tasks_unfinished"] == 0
    else:
        assert row(db_path, child)["n_done"] == 0


@pytest.mark.parametrize(("expected", "new"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
async def test_every_illegal_transition_is_refused(
    store: Store, db_path, expected: State, new: State
):
    _run_id, parent, child = await new_run(store)
    put(db_path, parent, expected)
    before_row, before_events = row(db_path, parent), transitions(db_path, parent)
    with pytest.raises(IllegalTransition, match=f"{expected} -> {new}"):
        async with store.db.write() as tx:
            await transition(tx, [parent], expected, new, now=NOW, message="never")
    assert row(db_path, parent) == before_row
    assert transitions(db_path, parent) == before_events
    assert row(db_path, child)["n_done"] == 0


async def test_repeated_cas_changes_nothing(store: Store, db_path) -> None:
    _, parent, _ = await new_run(store)
    async with store.db.write() as tx:
        first = await transition(
            tx, [parent], State.PENDING, State.RUNNING, now=NOW, message="claim", owner="a#1"
        )
    assert len(first) == 1
    snapshot, events = row(db_path, parent), transitions(db_path, parent)
    async with store.db.write() as tx:
        again = await transition(
            tx, [parent], State.PENDING, State.RUNNING, now=NOW + 1, message="claim", owner="b#1"
        )
    assert again == []
    assert row(db_path, parent) == snapshot  # still owned by a#1, same timestamps
    assert transitions(db_path, parent) == events


async def test_wrong_expected_state_changes_nothing(store: Store, db_path) -> None:
    run_id, parent, child = await new_run(store)
    put(db_path, parent, State.RUNNING, owner="a#1")
    snapshot, events = row(db_path, parent), transitions(db_path, parent)
    child_before = row(db_path, child)
    async with store.db.write() as tx:
        moved = await transition(
            tx, [parent], State.PENDING, State.SKIPPED, now=NOW, message="too late"
        )
        moved += await transition(
            tx, [parent], State.RETRYING, State.FAILED, now=NOW, message="too late"
        )
    assert moved == []
    assert row(db_path, parent) == snapshot
    assert transitions(db_path, parent) == events
    assert row(db_path, child) == child_before
    info = await store.views.run_info(run_id)
    assert info is not None and info["tasks_unfinished"] == 2


async def test_wrong_owner_changes_nothing(store: Store, db_path) -> None:
    _run_id, parent, child = await new_run(store)
    async with store.db.write() as tx:
        await transition(
            tx, [parent], State.PENDING, State.RUNNING, now=NOW, message="claim", owner="a#1"
        )
    snapshot, events = row(db_path, parent), transitions(db_path, parent)
    child_before = row(db_path, child)
    async with store.db.write() as tx:
        moved = await transition(
            tx, [parent], State.RUNNING, State.SUCCESS, now=NOW, message="x", expect_owner="b#7"
        )
    assert moved == []
    assert row(db_path, parent) == snapshot
    assert transitions(db_path, parent) == events
    assert row(db_path, child) == child_before
    # the right owner still can
    async with store.db.write() as tx:
        moved = await transition(
            tx, [parent], State.RUNNING, State.SUCCESS, now=NOW, message="ok", expect_owner="a#1"
        )
    assert len(moved) == 1
    assert row(db_path, child)["ready_at"] == NOW


async def test_a_batch_moves_only_the_rows_in_the_expected_state(store: Store, db_path) -> None:
    dag = DAG("batch")
    for i in range(5):
        dag.task(lambda ctx: None, task_id=f"t{i}")
    run_id = await store.runs.create_run(dag, date(2026, 3, 1))
    ids = [r["id"] for r in await store.views.run_tasks(run_id)]
    put(db_path, ids[1], State.RUNNING, owner="x#1")
    put(db_path, ids[3], State.SKIPPED)
    async with store.db.write() as tx:
        moved = await transition(
            tx, ids, State.PENDING, State.RUNNING, now=NOW, message="claim", owner="w#1"
        )
    assert sorted(m.id for m in moved) == [ids[0], ids[2], ids[4]]
    for i in (1, 3):
        assert transitions(db_path, ids[i]) == []
    assert row(db_path, ids[1])["owner"] == "x#1"


async def test_stale_outcome_changes_nothing(store: Store, db_path) -> None:
    """A worker that lost its claim reports late: no state change, no output, no transition."""
    run_id, parent, _child = await new_run(store)
    (claimed,) = await claim(store, "a#1", 1)
    assert claimed.id == parent
    async with store.db.write() as tx:  # someone took it back meanwhile
        await transition(
            tx,
            [parent],
            State.RUNNING,
            State.FAILED,
            now=NOW,
            message="taken back",
            expect_owner="a#1",
        )
    snapshot, events = row(db_path, parent), transitions(db_path, parent)
    late: dict[str, Any] = {
        "row_id": parent,
        "owner": "a#1",
        "attempt": 1,
        "max_attempts": 3,
        "run_id": run_id,
    }
    for outcome in (Succeeded(**late, output_json='"late"'), Failed(**late, message="late")):
        await complete(store, [outcome])
    assert row(db_path, parent) == snapshot
    assert transitions(db_path, parent) == events


async def test_racing_claims_from_two_connections_are_disjoint(db_url: str, db_path) -> None:
    clock = FakeClock()
    a = await open_store(db_url, clock=clock)
    b = await open_store(db_url, clock=clock)
    try:
        dag = DAG("wide")
        for i in range(60):
            dag.task(lambda ctx: None, task_id=f"t{i:02d}")
        run_id = await a.runs.create_run(dag, date(2026, 3, 1))
        got = await asyncio.gather(
            *[claim(s, f"{n}#{i}", 7) for i in range(6) for n, s in (("a", a), ("b", b))]
        )
        ids = [r.id for rows in got for r in rows]
        assert len(ids) == len(set(ids)) == 60
        claims = sql(
            db_path,
            "SELECT task_row, count(*) AS n FROM task_event WHERE to_state = 'RUNNING'"
            " GROUP BY task_row",
        )
        assert len(claims) == 60 and all(c["n"] == 1 for c in claims)
        assert (await run_counts(a, run_id)) == {"RUNNING": 60}
    finally:
        await a.close()
        await b.close()
