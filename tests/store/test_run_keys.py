"""Run keys on both backends: a run is created at most once per (dag_id, run_key), enforced
by the database, including two stores creating the same key at once; the conf is stored
with the run and checked against the DAG's params before anything is written."""

from __future__ import annotations

import asyncio
import json
from datetime import date

import pytest
from pydantic import BaseModel
from support import backends
from support.helpers import run_to_end

from executor import DAG, TaskContext
from executor.params import BadConf
from executor.store import Store, open_store
from executor.store import runs as store_runs
from executor.store.runs import NewRun, RunShape, insert_runs

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 4, 25)


class Window(BaseModel):
    days: int = 1
    region: str


def two_tasks(params: object = None) -> DAG:
    dag = DAG("keyed", params=params)  # type: ignore[arg-type]

    @dag.task
    def first(ctx: TaskContext) -> object:
        return ctx.params if isinstance(ctx.params, dict) else ctx.params.model_dump()

    @dag.task(parents=[first])
    def second(ctx: TaskContext) -> int:
        return 2

    return dag


async def runs(store: Store) -> list[dict]:
    async with store.db.read() as tx:
        rows = await tx.fetch("list_runs", n=100)
    return [dict(r) for r in rows]


async def task_count(store: Store, run_id: str) -> int:
    return len(await store.views.run_tasks(run_id))


async def test_a_key_creates_one_run_and_returns_it_again(store: Store) -> None:
    dag = two_tasks()
    first = await store.runs.start_run(dag, DAY, run_key="2026-04-25")
    again = await store.runs.start_run(dag, DAY, run_key="2026-04-25", conf={"x": 1})
    assert first.created and not again.created
    assert again.run_id == first.run_id and again.run_key == "2026-04-25"
    [row] = await runs(store)
    assert (row["run_key"], row["conf"]) == ("2026-04-25", None)  # the first one's conf stays
    assert await task_count(store, first.run_id) == 2  # no second set of tasks either
    # create_run is the same operation, returning the run id.
    assert await store.runs.create_run(dag, DAY, run_key="2026-04-25") == first.run_id


async def test_manual_runs_of_one_date_are_distinct_and_keep_the_dates_key_free(
    store: Store,
) -> None:
    dag = two_tasks()
    a = await store.runs.start_run(dag, DAY)
    b = await store.runs.start_run(dag, DAY)
    assert a.created and b.created and a.run_id != b.run_id
    assert a.run_key.startswith("2026-04-25~manual-") and a.run_key != b.run_key
    scheduled = await store.runs.start_run(dag, DAY, run_key="2026-04-25")
    assert scheduled.created
    # Another DAG may use the same key.
    other = DAG("other")
    assert (await store.runs.start_run(other, DAY, run_key="2026-04-25")).created
    assert len(await runs(store)) == 4


async def test_manual_runs_whose_random_parts_meet_are_still_two_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six hex digits meet among thousands of runs of one date: a drawn id or key that is
    taken is drawn again, never answered with the run that holds it, nor a failed insert."""
    a_then_b = ["abc123", "abc123", "abc123", "def456"]
    c_and_d = ["abc123", "abc123", "0a0a0a", "0a0a0a", "0b0b0b"]
    draws = iter([*a_then_b, *c_and_d])
    monkeypatch.setattr(store_runs, "new_token", lambda: next(draws))
    dag = two_tasks()
    a = await store.runs.start_run(dag, DAY)
    b = await store.runs.start_run(dag, DAY)  # abc123 is taken twice: def456
    assert b.created and (a.run_id, b.run_id) == ("keyed:2026-04-25:abc123",
                                                  "keyed:2026-04-25:def456")  # fmt: skip
    assert b.run_key == "2026-04-25~manual-def456"
    # Runs keyed elsewhere (an asset's, a start condition's) draw their ids the same way,
    # a batch's draws meeting each other too: abc123 is taken; 0a0a0a drawn twice.
    shape = RunShape.of(dag)
    async with store.db.write() as tx:
        c, d = await insert_runs(
            tx, [(shape, NewRun(DAY, "asset-1")), (shape, NewRun(DAY, "asset-2"))], 0.0
        )
    assert c.created and d.created
    assert (c.run_id, d.run_id) == ("keyed:2026-04-25:0a0a0a", "keyed:2026-04-25:0b0b0b")
    assert len({a.run_id, b.run_id, c.run_id, d.run_id}) == 4
    assert await task_count(store, b.run_id) == 2 and len(await runs(store)) == 4


async def test_conf_is_stored_and_becomes_ctx_params(store: Store) -> None:
    dag = two_tasks({"days": 1, "region": "eu"})
    run_id = await store.runs.create_run(dag, DAY, conf={"days": 7})
    [row] = await runs(store)
    assert json.loads(row["conf"]) == {"days": 7}
    assert (await run_to_end(store, run_id, dags={"keyed": dag}))["state"] == "SUCCESS"
    first = next(t for t in await store.views.run_tasks(run_id) if t["task_id"] == "first")
    assert json.loads(first["output"]) == {"days": 7, "region": "eu"}


async def test_a_model_validates_the_conf_and_a_bad_conf_stores_nothing(store: Store) -> None:
    dag = two_tasks(Window)
    for bad, says in (
        ({"region": "eu", "days": "many"}, "days: Input should be a valid integer"),
        ({"days": 2}, "region: Field required"),
        ({"region": "eu", "colour": "red"}, "unknown param 'colour'"),
    ):
        with pytest.raises(BadConf, match=says):
            await store.runs.create_run(dag, DAY, conf=bad, run_key=f"k{len(bad)}")
    assert await runs(store) == []
    run_id = await store.runs.create_run(dag, DAY, conf={"region": "us", "days": "3"})
    assert (await run_to_end(store, run_id, dags={"keyed": dag}))["state"] == "SUCCESS"
    first = next(t for t in await store.views.run_tasks(run_id) if t["task_id"] == "first")
    assert json.loads(first["output"]) == {"days": 3, "region": "us"}


async def test_two_stores_creating_one_key_at_once_create_one_run(url: str) -> None:
    """The race a schedule's two triggerers (or a takeover) run: on PostgreSQL the second
    insert waits for the first transaction and then inserts nothing; on SQLite writers take
    turns. Either way one run, with one set of tasks, and both callers get its id."""
    dag = two_tasks()
    stores = [await open_store(url) for _ in range(2)]
    try:
        for round_ in range(5):
            key = f"2026-04-{round_ + 1:02d}"
            started = await asyncio.gather(
                *(s.runs.start_run(dag, DAY, run_key=key) for s in stores)
            )
            assert sorted(s.created for s in started) == [False, True]
            assert started[0].run_id == started[1].run_id
            assert await task_count(stores[0], started[0].run_id) == 2
        assert len(await runs(stores[0])) == 5
    finally:
        for s in stores:
            await s.close()
