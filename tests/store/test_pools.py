"""Pools and queues in the store (executor/pools.py), on SQLite and PostgreSQL.

The bound that matters: however many claimers race, the RUNNING rows of a pool never hold
more than its slots. Claimers here are separate stores (separate connections, so separate
transactions on PostgreSQL), each claiming, holding for a moment and reporting in a loop,
while a sampler reads the pool's RUNNING rows from yet another connection.
"""

from __future__ import annotations

import asyncio
import json
import random
from datetime import date
from typing import Any

import pytest
from support import backends
from support.exchanging import claim, complete
from support.helpers import FakeClock, attempt_of

from executor import DAG
from executor.catalogue import _declared
from executor.dag import DagError
from executor.outcomes import Deferred, Failed, Succeeded
from executor.pools import PoolError
from executor.rows import MovedTask
from executor.sensing import deferral
from executor.store import Store, open_store
from executor.store.catalogue import DeclaredDag
from triggers.files import FileTrigger

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 4, 25)


def noop(ctx: Any) -> None:
    return None


def done(row: MovedTask) -> Succeeded:
    return Succeeded(**attempt_of(row), output_json="null", skip_children=[])


async def running_in(store: Store, pool: str) -> int:
    async with store.db.read() as tx:
        rows = await tx.fetch("pool_running", names=[pool])
    return int(rows[0]["used"]) if rows else 0


def pool_dag(name: str, n: int, pool: str = "warehouse", others: int = 0, **kw: Any) -> DAG:
    dag = DAG(name)
    for i in range(n):
        dag.task(noop, task_id=f"p{i:03d}", pool=pool, **kw)
    for i in range(others):
        dag.task(noop, task_id=f"d{i:03d}")
    return dag


# ----------------------------------------------------------------------------- the bound


async def test_racing_claimers_never_overshoot_a_pool(store: Store, url: str) -> None:
    """Six claimers on their own connections, 120 tasks in a pool of 4 beside 60 others:
    the pool's RUNNING rows, sampled throughout from a seventh connection, never exceed 4,
    and every task is claimed exactly once."""
    await store.pools.set_pool("warehouse", 4)
    run_id = await store.runs.create_run(pool_dag("race", 120, others=60), DAY)
    claimers = [await open_store(url) for _ in range(6)]
    sampler = await open_store(url)
    seen: list[int] = []
    claimed: list[int] = []
    finished = asyncio.Event()

    async def sample() -> None:
        while not finished.is_set():
            seen.append(await running_in(sampler, "warehouse"))
            await asyncio.sleep(0.002)

    async def claim_loop(s: Store, name: str) -> None:
        rng = random.Random(name)
        idle = 0
        while idle < 40:
            rows = await claim(s, f"{name}#{len(claimed)}", rng.randint(1, 5))
            claimed.extend(r.id for r in rows)
            if not rows:
                idle += 1
                await asyncio.sleep(0.005)
                continue
            idle = 0
            await asyncio.sleep(rng.uniform(0, 0.01))  # hold the slots a moment
            await complete(s, [done(r) for r in rows])

    try:
        watcher = asyncio.create_task(sample())
        await asyncio.wait_for(
            asyncio.gather(*(claim_loop(s, f"w{i}") for i, s in enumerate(claimers))), 120
        )
        finished.set()
        await watcher
    finally:
        for s in [*claimers, sampler]:
            await s.close()
    assert len(claimed) == 180 and len(set(claimed)) == 180
    assert max(seen) <= 4, f"the pool held {max(seen)} slots of 4"
    assert max(seen) >= 2  # the test raced: the pool was really shared
    assert (await store.views.run_info(run_id))["state"] == "SUCCESS"  # type: ignore[index]


async def test_a_claim_takes_what_fits_and_the_rest_waits_for_the_pool(store: Store) -> None:
    await store.pools.set_pool("warehouse", 2)
    dag = pool_dag("fit", 5, others=3)
    dag.task(noop, task_id="big", pool="warehouse", pool_slots=2, priority=10)
    run_id = await store.runs.create_run(dag, DAY)
    first = await claim(store, "w1", 10)
    # The 2-slot task comes first (priority), fills the pool; the default tasks still come.
    assert sorted(r.task_id for r in first) == ["big", "d000", "d001", "d002"]
    assert await running_in(store, "warehouse") == 2
    assert await claim(store, "w2", 10) == []
    held = await store.pools.held_back_tasks(20)
    assert len(held) == 5
    assert {why for _, why in held} == {"waiting for pool warehouse (2/2 used)"}
    assert next(p for p in await store.pools.pools() if p.name == "warehouse").used == 2
    await complete(store, [done(r) for r in first])
    second = await claim(store, "w3", 10)
    assert len(second) == 2 and all(r.task_id.startswith("p") for r in second)
    assert await state_of(store, run_id, "p004") == "PENDING"


async def test_a_pool_grown_or_shrunk_applies_at_the_next_claim(store: Store) -> None:
    await store.pools.set_pool("warehouse", 1)
    await store.runs.create_run(pool_dag("resize", 6), DAY)
    assert len(await claim(store, "w", 10)) == 1
    await store.pools.set_pool("warehouse", 3)
    assert len(await claim(store, "w", 10)) == 2
    await store.pools.set_pool("warehouse", 0)  # shrunk below use: running ones go on, none starts
    assert await claim(store, "w", 10) == []
    [(_, why), *_] = await store.pools.held_back_tasks(10)
    assert why == "waiting for pool warehouse (3/0 used)"


async def test_only_running_rows_hold_slots(store: Store, clock: FakeClock) -> None:
    """A deferral, a retry, a reaped attempt and a cancelled run each free their slot."""
    await store.pools.set_pool("warehouse", 1)
    dag = DAG("frees")
    dag.task(noop, task_id="a", pool="warehouse", retries=1)
    dag.task(noop, task_id="b", pool="warehouse")
    dag.task(noop, task_id="c", pool="warehouse", retries=1)
    dag.task(noop, task_id="d", pool="warehouse")
    run_id = await store.runs.create_run(dag, DAY)

    [a] = await claim(store, "w", 10)
    assert a.task_id == "a" and await claim(store, "w", 10) == []
    # a defers (a sensor handing its wait to the triggerer): DEFERRED holds no slot.
    d = deferral(
        FileTrigger(path="/nonexistent/x"), method=None, method_kwargs={},
        wait_started_at=clock(), timeout=60.0, soft_fail=False,
    )  # fmt: skip
    await complete(store, [Deferred(**attempt_of(a), deferral=d)])
    assert await state_of(store, run_id, "a") == "DEFERRED"
    [b] = await claim(store, "w", 10)
    assert b.task_id == "b"
    # b fails for good... and c, retried, goes RETRYING: neither holds a slot.
    await complete(store, [Failed(**attempt_of(b), message="boom", retry_delay=0.0)])
    [c] = await claim(store, "w", 10)
    assert c.task_id == "c"
    await complete(store, [Failed(**attempt_of(c), message="boom", retry_delay=60.0)])
    assert await state_of(store, run_id, "c") == "RETRYING"
    [d_row] = await claim(store, "w", 10)
    assert d_row.task_id == "d"
    # d's worker goes silent: reaped, its slot is free again.
    clock.advance(31)
    assert await store.exchange.reap(30) == 1
    assert await running_in(store, "warehouse") == 0
    clock.advance(60)  # c's retry is due: it takes the slot
    [c2] = await claim(store, "w", 10)
    assert c2.task_id == "c" and await running_in(store, "warehouse") == 1
    await store.runs.cancel(run_id, who="test", reason="done")
    assert await running_in(store, "warehouse") == 0


async def test_mapped_instances_hold_their_templates_pool(store: Store) -> None:
    await store.pools.set_pool("warehouse", 2)
    dag = DAG("mapped")

    @dag.task
    def items(ctx: Any) -> list[int]:
        return [1, 2, 3, 4, 5]

    @dag.task(expand=items, pool="warehouse", queue="default")
    def each(ctx: Any) -> int:
        return int(ctx.item)

    run_id = await store.runs.create_run(dag, DAY)
    [src] = await claim(store, "w", 10)
    await complete(store, [Succeeded(**attempt_of(src), output_json=json.dumps([1, 2, 3, 4, 5]),
                                    skip_children=[])])  # fmt: skip
    # The template is RUNNING while its instances run, and holds no slot.
    assert await state_of(store, run_id, "each") == "RUNNING"
    rows = await claim(store, "w", 10)
    assert [r.map_index for r in rows] == [0, 1]
    assert await running_in(store, "warehouse") == 2


# ----------------------------------------------------------------------------- queues


async def test_a_worker_claims_only_its_queues(store: Store) -> None:
    await store.pools.add_queue("gpu")
    dag = DAG("routed")
    dag.task(noop, task_id="train", queue="gpu")
    dag.task(noop, task_id="report")
    await store.runs.create_run(dag, DAY)
    assert [r.task_id for r in await claim(store, "cpu", 10)] == ["report"]
    assert await claim(store, "cpu", 10) == []
    held = await store.pools.held_back_tasks(10)
    assert [(r["task_id"], why) for r, why in held] == [
        ("train", "waiting for a worker of queue gpu (no live worker serves it)")
    ]
    await store.exchange.worker_beat("gpu-worker", ["gpu"], 4, ttl=30)
    assert await store.pools.held_back_tasks(10) == []
    assert {q.name: q.workers for q in await store.pools.queues()} == {"default": 0, "gpu": 1}
    assert [r.task_id for r in await claim(store, "gpu-worker", 10, ["gpu"])] == ["train"]
    await store.exchange.worker_leave("gpu-worker")
    assert {q.name: q.workers for q in await store.pools.queues()}["gpu"] == 0


async def test_a_registry_row_expires_with_its_ttl(store: Store, clock: FakeClock) -> None:
    await store.pools.add_queue("gpu")
    await store.exchange.worker_beat("w", ["gpu", "default"], 8, ttl=10)
    assert {q.name: q.workers for q in await store.pools.queues()} == {"default": 1, "gpu": 1}
    clock.advance(11)  # killed without leaving: no longer live
    assert {q.name: q.workers for q in await store.pools.queues()} == {"default": 0, "gpu": 0}


# ----------------------------------------------------------------------------- bad input


async def test_unknown_pools_and_queues_are_refused_naming_them(store: Store) -> None:
    dag = DAG("typo")
    dag.task(noop, task_id="load", pool="warehuose")
    dag.task(noop, task_id="train", queue="gpu")
    with pytest.raises(DagError) as err:
        await store.runs.create_run(dag, DAY)
    assert "unknown pool 'warehuose' (task load)" in str(err.value)
    assert "unknown queue 'gpu' (task train)" in str(err.value)
    assert await store.views.recent_runs(20) == []  # nothing stored
    await store.pools.set_pool("warehuose", 1)
    await store.pools.add_queue("gpu")
    await store.runs.create_run(dag, DAY)


async def test_the_catalogue_breaks_a_file_naming_an_unknown_pool(store: Store) -> None:
    dag = DAG("catalogued")
    dag.task(noop, task_id="load", pool="warehouse")
    declared = DeclaredDag(**_declared(dag, dag.dag_id))  # type: ignore[arg-type]
    error = await store.catalogue.record_parse("/dags/c.py", 1.0, [declared], None)
    assert error is not None and "unknown pool 'warehouse' (task load)" in error
    # parsed again at the next scan (mtime forgotten), and accepted once the pool exists
    assert (await store.catalogue.catalogue_files())["/dags/c.py"] is None
    await store.pools.set_pool("warehouse", 2)
    assert await store.catalogue.record_parse("/dags/c.py", 1.0, [declared], None) is None


@pytest.mark.parametrize(
    ("name", "slots", "why"),
    [
        ("warehouse", -1, "whole number >= 0"),
        ("warehouse", "four", "whole number >= 0"),
        ("bad name", 3, "invalid pool name"),
        ("", 3, "invalid pool name"),
        ("default", 3, "default pool is unlimited"),
    ],
)
async def test_bad_pool_settings_are_refused(store: Store, name: str, slots: Any, why: str) -> None:
    with pytest.raises(PoolError, match=why):
        await store.pools.set_pool(name, slots)
    assert [p.name for p in await store.pools.pools()] == ["default"]


async def test_a_pool_in_use_cannot_be_deleted(store: Store) -> None:
    await store.pools.set_pool("warehouse", 1)
    await store.pools.add_queue("gpu")
    dag = DAG("inuse")
    dag.task(noop, task_id="a", pool="warehouse", queue="gpu")
    run_id = await store.runs.create_run(dag, DAY)
    with pytest.raises(PoolError, match="named by 1 unfinished task"):
        await store.pools.delete_pool("warehouse")
    with pytest.raises(PoolError, match="named by 1 unfinished task"):
        await store.pools.delete_queue("gpu")
    with pytest.raises(PoolError, match="no pool 'nope'"):
        await store.pools.delete_pool("nope")
    await store.runs.cancel(run_id, who="test", reason="")
    await store.pools.delete_pool("warehouse")
    await store.pools.delete_queue("gpu")
    assert [p.name for p in await store.pools.pools()] == ["default"]


async def test_a_pool_a_catalogued_dag_names_is_deleted_only_with_force(store: Store) -> None:
    """Deleted, the DAG's next parse and next run would be refused for want of it."""
    await store.pools.set_pool("warehouse", 1)
    await store.pools.set_pool("ware_house", 1)  # like the other to LIKE: not named
    await store.pools.add_queue("gpu")
    declared = []
    for name in ("loads", "audits"):
        dag = DAG(name)
        dag.task(noop, task_id="load", pool="warehouse", queue="gpu")
        declared.append(DeclaredDag(**_declared(dag, dag.dag_id)))  # type: ignore[arg-type]
    assert await store.catalogue.record_parse("/dags/w.py", 1.0, declared, None) is None
    for delete, kind in ((store.pools.delete_pool, "pool"), (store.pools.delete_queue, "queue")):
        with pytest.raises(PoolError) as refused:
            await delete("warehouse" if kind == "pool" else "gpu")
        assert str(refused.value) == (
            f"{kind} {'warehouse' if kind == 'pool' else 'gpu'!r} is named by catalogued "
            "DAG(s) audits, loads: their runs would be refused without it; change them "
            "first, or --force"
        )
    await store.pools.delete_pool("ware_house")  # no DAG names it
    assert [p.name for p in await store.pools.pools()] == ["default", "warehouse"]
    await store.pools.delete_pool("warehouse", force=True)
    await store.pools.delete_queue("gpu", force=True)
    assert [p.name for p in await store.pools.pools()] == ["default"]


async def test_a_deleted_pool_holds_its_tasks_back_saying_so(store: Store) -> None:
    await store.pools.set_pool("etl", 1)
    dag = DAG("gone")
    dag.task(noop, task_id="a", pool="etl")
    async with store.db.write() as tx:  # deleted behind the store's back (an old database)
        await tx.execute("pool_delete", name="etl")
    with pytest.raises(DagError):
        await store.runs.create_run(dag, DAY)
    await store.pools.set_pool("etl", 1)
    await store.runs.create_run(dag, DAY)
    async with store.db.write() as tx:
        await tx.execute("pool_delete", name="etl")
    assert await claim(store, "w", 10) == []
    [(_, why)] = await store.pools.held_back_tasks(10)
    assert why == "waiting for pool etl (no such pool: slotless pools set etl SLOTS)"


async def state_of(store: Store, run_id: str, task_id: str, map_index: int = -1) -> str:
    async with store.db.read() as tx:
        row = await tx.fetchone("task_row", run_id=run_id, task_id=task_id, map_index=map_index)
    assert row is not None
    return str(row["state"])


async def test_a_worker_found_dead_stops_serving_its_queues_at_once(store: Store) -> None:
    # The liveness lock said so: no TTL passes, its queues go with its attempts.
    await store.pools.add_queue("gpu")
    await store.exchange.worker_beat("gpu-worker", ["gpu"], 4, ttl=3600)
    await store.exchange.worker_beat("cpu-worker", ["default"], 8, ttl=3600)
    await store.exchange.reap_worker("gpu-worker", "its process is gone")
    assert {q.name: q.workers for q in await store.pools.queues()} == {"default": 1, "gpu": 0}
    assert await store.exchange.other_workers("me") == ["cpu-worker"]
