"""The triggerer's compact table and plain-call checks (issue 17): what must not change
when a wait is a small record and a cheap check costs no Task.

- a check that awaits after its first step finishes in a Task of its own, with its own
  ``asyncio.timeout`` (not the checking loop's), and the other checks go on meanwhile;
- the table holds no trigger object between checks, and its records are frozen out of
  the garbage collector after a load;
- a transaction body for ``Database.transact`` that awaits something else fails,
  rolled back, and the store goes on.
"""

from __future__ import annotations

import asyncio
import gc
import json
from datetime import date

import pytest
from support.helpers import async_wait_until
from support.triggers import FLAGS, FlagTrigger, serving, state_of, task_rows

from executor import DAG
from executor.driver.db import Tx
from triggers.base import BaseTrigger, TriggerEvent
from triggers.context import TriggerContext
from triggers.registry import register

DAY = date(2026, 4, 26)

pytestmark = pytest.mark.usefixtures("fresh_triggers")

SLOW_DONE: list[str] = []


@register
class SlowThenTrueTrigger(BaseTrigger):
    """Awaits (a real suspension, under its own timeout) before it answers: true."""

    name: str

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        # The timeout binds to the Task this coroutine runs in: if the check had started
        # in the checking loop's Task and moved, this would cancel that loop instead.
        async with asyncio.timeout(0.05):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.01):
                    await asyncio.sleep(1)
        async with asyncio.timeout(5):
            await asyncio.sleep(0.02)
        SLOW_DONE.append(self.name)
        return TriggerEvent(payload={"slow": self.name})


def waiting_dag(dag_id: str, triggers: list[BaseTrigger]) -> DAG:
    dag = DAG(dag_id)
    for i, trig in enumerate(triggers):
        dag.sensor(f"s{i}", trig, mode="deferrable")
    return dag


async def test_a_check_that_awaits_finishes_in_its_own_task(store, db_path) -> None:
    SLOW_DONE.clear()
    triggers: list[BaseTrigger] = [
        SlowThenTrueTrigger(name="slow", poke_interval=0.1),
        FlagTrigger(name="quick", poke_interval=0.05),
    ]
    dag = waiting_dag("awaits", triggers)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag) as h:
        await async_wait_until(
            lambda: state_of(db_path, run_id, "s0") == "SUCCESS", what="the slow check fired"
        )
        # The cheap check kept running beside it, and still does.
        trig = h.triggerer
        assert trig is not None
        before = trig.checks_done
        await async_wait_until(lambda: trig.checks_done > before + 3, what="more checks")
        FLAGS.add("quick")
        await async_wait_until(
            lambda: state_of(db_path, run_id, "s1") == "SUCCESS", what="the quick one fired"
        )
    assert SLOW_DONE == ["slow"]
    out = {r["task_id"]: r["output"] for r in task_rows(db_path, run_id)}
    assert json.loads(out["s0"]) == {"slow": "slow"}


async def test_the_table_keeps_no_trigger_object_between_checks(store, db_path) -> None:
    triggers: list[BaseTrigger] = [FlagTrigger(name=f"f{i}", poke_interval=0.05) for i in range(5)]
    # Two waits on one condition: one record, two subscribers.
    triggers.append(FlagTrigger(name="f0", poke_interval=3600))
    dag = waiting_dag("compact", triggers)
    await store.runs.create_run(dag, DAY)
    async with serving(store, dag) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(lambda: trig.table.subscriptions == 6, what="all loaded")
        await async_wait_until(lambda: trig.checks_done >= 20, what="a few cycles")
        table = trig.table
        assert len(table) == 5
        for check in table.by_hash.values():
            if not check.running:
                assert check._model is None  # built for a check, let go after it
            assert isinstance(check.kwargs, str) and check.cls is FlagTrigger
            assert check.trigger == FlagTrigger.model_validate_json(check.kwargs)
        shared = table.by_hash[FlagTrigger(name="f0").poke_hash()]
        assert len(shared.subscribers) == 2 and shared.interval == 0.05
        # Loaded records are out of the collector's generations.
        assert gc.get_freeze_count() >= len(table)


async def test_a_transaction_body_that_awaits_elsewhere_fails_and_rolls_back(store) -> None:
    async def body(tx: Tx) -> None:
        await tx.execute(
            "upsert_dag_file", path="/never/written.py", mtime=1.0, now=0.0, parse_error=None
        )
        await asyncio.sleep(0)  # a wait that is not the transaction: refused on SQLite

    if store.db.backend != "sqlite":
        pytest.skip("only SQLite runs a body in its driver's thread")
    with pytest.raises(RuntimeError, match="awaited something other than its transaction"):
        await store.db.transact(body)

    async def count(tx: Tx) -> int:
        return len(await tx.fetch("catalogue_files"))

    # The store is usable, and nothing of the failed body was kept.
    assert await store.db.transact(count) == 0


async def test_a_burst_of_check_lines_goes_out_over_several_flushes() -> None:
    """A cycle of many cheap checks logs a line per wait at once: the lines are written a
    bounded number per transaction, in order, and a fire never waits behind them."""
    from triggerer.store import Fire, TriggererBatch
    from triggerer.writing import LOGS_PER_FLUSH, Outbox

    commits: list[TriggererBatch] = []

    class Recording:
        async def triggerer_commit(self, batch: TriggererBatch, owner: str | None = None) -> None:
            commits.append(batch)

    outbox = Outbox(Recording())  # type: ignore[arg-type]
    total = 2 * LOGS_PER_FLUSH + 7
    outbox.log(range(total), "checked noop: not yet")
    await outbox.flush()
    outbox.fire(Fire({-3: 9}, "{}", "fired"))
    while outbox.batch:
        await outbox.flush()
    assert [len(c.logs) for c in commits] == [LOGS_PER_FLUSH, LOGS_PER_FLUSH, 7]
    assert [row for c in commits for row, _ in c.logs] == list(range(total))
    assert [len(c.fires) for c in commits] == [0, 1, 0]


async def test_the_young_generation_is_collected_as_checks_go_by(store, db_path) -> None:
    # A check frees old tracked objects as it makes new ones, and CPython lowers the young
    # count at each free: left to its threshold, the young list grew to ~764,000 objects
    # at a million waits before one long collection. The runner collects it itself every
    # few thousand checks; automatic collection is off here, so only those are seen.
    young: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 0:
            young.append(1)

    n = 200
    dag = waiting_dag("young", [FlagTrigger(name=f"y{i}", poke_interval=0.05) for i in range(n)])
    await store.runs.create_run(dag, DAY)
    gc.disable()
    gc.callbacks.append(seen)
    try:
        async with serving(store, dag) as h:
            trig = h.triggerer
            assert trig is not None
            await async_wait_until(
                lambda: trig.checks_done >= 3 * 4096, timeout=60, what="12,288 checks"
            )
    finally:
        gc.callbacks.remove(seen)
        gc.enable()
    assert len(young) >= 2
