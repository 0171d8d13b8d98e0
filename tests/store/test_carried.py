"""What a transition carries (executor/carried.py) is written by the compare-and-set itself,
on both backends: each variant sets its columns, per row where it is per row, and keeps
the rest; a retry forgets the wait whatever it is given."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from support import backends
from support.helpers import raw_sql

from executor import DAG
from executor.carried import (
    Carried,
    Defer,
    Defers,
    Output,
    Outputs,
    Resume,
    Resumes,
    Wait,
    params,
)
from executor.statemachine import transition
from executor.states import State
from executor.store import Store

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

NOW = 1_000.0
COLUMNS = (
    "state, output, event, next_method, next_kwargs, trigger_id, soft_fail, wait_started_at,"
    " wait_timeout_at"
)


def two_tasks() -> DAG:
    dag = DAG("carried")

    @dag.task
    def a(ctx):
        return 1

    @dag.task
    def b(ctx):
        return 2

    return dag


async def rows_in(store: Store, url: str, state: State, **columns: Any) -> tuple[int, int]:
    """Both tasks of a new run, put in ``state`` with ``columns`` (test setup only)."""
    run_id = await store.runs.create_run(two_tasks(), date(2026, 3, 1))
    ids = {r["task_id"]: r["id"] for r in await store.views.run_tasks(run_id)}
    sets = ", ".join([f"state = '{state.value}'", "ready_at = NULL"] + [
        f"{k} = {'NULL' if v is None else repr(v)}" for k, v in columns.items()
    ])  # fmt: skip
    await raw_sql(url, f"UPDATE task SET {sets} WHERE run_id = '{run_id}'")
    return ids["a"], ids["b"]


async def move(
    store: Store, ids: list[int], old: State, new: State, carry: Carried | None
) -> list[int]:
    async with store.db.write() as tx:
        moved = await transition(tx, ids, old, new, now=NOW, message="m", carry=carry)
    return [m.id for m in moved]


async def read(url: str, row_id: int) -> dict[str, Any]:
    (row,) = await raw_sql(url, f"SELECT {COLUMNS} FROM task WHERE id = {row_id}")
    return dict(row)


async def test_outputs_each_row_its_own(store: Store, url: str) -> None:
    a, b = await rows_in(store, url, State.RUNNING, output='"old"')
    carry = Outputs({a: '"x"', b: None})
    assert sorted(await move(store, [a, b], State.RUNNING, State.SUCCESS, carry)) == [a, b]
    assert (await read(url, a))["output"] == '"x"'
    assert (await read(url, b))["output"] is None


async def test_output_the_same_for_every_row(store: Store, url: str) -> None:
    a, b = await rows_in(store, url, State.DEFERRED, next_method=None)
    await move(store, [a, b], State.DEFERRED, State.SUCCESS, Output("[1]"))
    assert [(await read(url, i))["output"] for i in (a, b)] == ["[1]", "[1]"]


async def test_defers_write_each_rows_deferral_and_clear_the_event(store: Store, url: str) -> None:
    a, b = await rows_in(store, url, State.RUNNING, event='"stale"')
    await raw_sql(url, f"UPDATE task SET wait_started_at = 5.0 WHERE id = {a}")  # a re-deferral
    carry = Defers(
        {
            a: Defer(7, "resume", '{"k":1}', True, Wait(900.0, 1900.0)),
            b: Defer(8, None, None, False, Wait(950.5, None)),
        }
    )
    await move(store, [a, b], State.RUNNING, State.DEFERRED, carry)
    ra, rb = await read(url, a), await read(url, b)
    assert ra == {
        "state": "DEFERRED", "output": None, "event": None, "next_method": "resume",
        "next_kwargs": '{"k":1}', "trigger_id": 7, "soft_fail": 1,
        "wait_started_at": 5.0,  # the wait that already started is kept
        "wait_timeout_at": 1900.0,
    }  # fmt: skip
    assert rb == {
        "state": "DEFERRED", "output": None, "event": None, "next_method": None,
        "next_kwargs": None, "trigger_id": 8, "soft_fail": 0, "wait_started_at": 950.5,
        "wait_timeout_at": None,
    }  # fmt: skip


async def test_resumes_keep_the_resume_point(store: Store, url: str) -> None:
    a, b = await rows_in(store, url, State.DEFERRED, next_method="go", trigger_id=3)
    await move(store, [a, b], State.DEFERRED, State.PENDING, Resumes({a: '"ea"', b: '"eb"'}))
    ra, rb = await read(url, a), await read(url, b)
    assert (ra["event"], rb["event"]) == ('"ea"', '"eb"')
    assert (ra["next_method"], ra["trigger_id"]) == ("go", 3)


async def test_resume_the_same_event_for_every_row(store: Store, url: str) -> None:
    a, b = await rows_in(store, url, State.DEFERRED, next_method="go")
    await move(store, [a, b], State.DEFERRED, State.PENDING, Resume('{"e":1}'))
    assert [(await read(url, i))["event"] for i in (a, b)] == ['{"e":1}', '{"e":1}']


async def test_wait_starts_once_and_moves_its_timeout(store: Store, url: str) -> None:
    a, _ = await rows_in(store, url, State.RUNNING)
    await move(store, [a], State.RUNNING, State.SENSING, Wait(10.0, 70.0))
    await raw_sql(url, f"UPDATE task SET state = 'RUNNING' WHERE id = {a}")
    await move(store, [a], State.RUNNING, State.SENSING, Wait(20.0, 80.0))
    row = await read(url, a)
    assert (row["wait_started_at"], row["wait_timeout_at"]) == (10.0, 80.0)


@pytest.mark.parametrize("carry", [None, Resume('"e"'), Wait(1.0, 2.0)])
async def test_a_retry_forgets_the_wait(store: Store, url: str, carry: Carried | None) -> None:
    a, _ = await rows_in(
        store, url, State.RUNNING, next_method="go", next_kwargs="{}", event='"e0"',
        trigger_id=4, soft_fail=1, wait_started_at=1.0, wait_timeout_at=9.0,
    )  # fmt: skip
    await move(store, [a], State.RUNNING, State.RETRYING, carry)
    assert await read(url, a) == {
        "state": "RETRYING", "output": None, "event": None, "next_method": None,
        "next_kwargs": None, "trigger_id": 4, "soft_fail": 1, "wait_started_at": None,
        "wait_timeout_at": None,
    }  # fmt: skip


async def test_nothing_carried_keeps_every_column(store: Store, url: str) -> None:
    a, _ = await rows_in(
        store, url, State.DEFERRED, output='"o"', next_method="go", next_kwargs="{}",
        event='"e"', trigger_id=4, wait_started_at=1.0, wait_timeout_at=9.0,
    )  # fmt: skip
    before = await read(url, a)
    await move(store, [a], State.DEFERRED, State.SKIPPED, None)
    assert await read(url, a) == {**before, "state": "SKIPPED"}
    logged = await raw_sql(
        url, f"SELECT from_state, to_state, message FROM task_event WHERE task_row = {a}"
    )
    assert [dict(r) for r in logged] == [
        {"from_state": "DEFERRED", "to_state": "SKIPPED", "message": "m"}
    ]


def test_a_payload_is_one_kind_of_variant() -> None:
    with pytest.raises(TypeError, match="not a carried payload"):
        params(Defer(1, None, None, False, Wait(0.0, None)), State.DEFERRED)  # type: ignore[arg-type]
