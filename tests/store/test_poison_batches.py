"""No poison batches: a batched write that fails with a deterministic error is split until
the offending row is found; that row's task fails with the error, the others go through.

The bad rows are real: PostgreSQL refuses a NUL character in a text column, so a task
that logs one, or a trigger whose description holds one, cannot be written as it is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import date

import pytest
from support import pg
from support.helpers import async_wait_until
from support.triggers import FLAGS, FlagTrigger, serving

from executor import DAG
from executor.driver.faults import is_transient, split_apart
from executor.store import Store, open_store
from triggers.registry import register

pg_server, pg_url = pg.pg_server, pg.pg_url  # fixtures

DAY = date(2026, 4, 25)

pytestmark = pytest.mark.usefixtures("fresh_triggers")


@register
class NulTrigger(FlagTrigger):
    """A FlagTrigger whose description PostgreSQL cannot store (a NUL character) once it
    fires: its deferral is written, its fire message cannot be."""

    def describe(self) -> str:
        return f"nul\x00{self.name}" if self.name in FLAGS else self.name


@register
class NulDeferTrigger(FlagTrigger):
    """A FlagTrigger whose description PostgreSQL cannot store from the start: its
    deferral cannot be written."""

    def describe(self) -> str:
        return f"nul\x00{self.name}"


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[Store]:
    s = await open_store(pg_url)
    try:
        yield s
    finally:
        await s.close()


async def states(store: Store, run_id: str) -> dict[str, str]:
    return {r["task_id"]: r["state"] for r in await store.views.run_tasks(run_id)}


async def messages(store: Store, run_id: str, task_id: str) -> str:
    rows = await store.views.task_log(run_id, task_id)
    return "\n".join(str(r["message"]) for r in rows or [])


async def test_split_apart_finds_each_bad_item() -> None:
    written: list[int] = []

    async def write(part) -> None:
        if any(x in (3, 11) for x in part):
            raise ValueError("bad item")
        written.extend(part)

    bad = await split_apart(list(range(16)), write)
    assert [item for item, _ in bad] == [3, 11]
    assert sorted(written) == [x for x in range(16) if x not in (3, 11)]
    assert not is_transient(ValueError("x")) and is_transient(ConnectionResetError())


async def test_a_bad_outcome_fails_its_task_and_the_others_go_through(pg_store) -> None:
    dag = DAG("poison_exchange")

    @dag.task
    def bad(ctx):
        ctx.log("a NUL \x00 in a log line")
        return 1

    @dag.task
    def good(ctx):
        return 2

    @dag.task(parents=[good])
    def after_good(ctx):
        return 3

    run_id = await pg_store.runs.create_run(dag, DAY)
    async with serving(pg_store, dag, triggerer=False, slots=4):

        async def settled() -> bool:
            s = await states(pg_store, run_id)
            return s["bad"] == "FAILED" and s["after_good"] == "SUCCESS"

        await async_wait_until(settled, timeout=60, what="bad failed, the others succeeded")
    assert (await states(pg_store, run_id))["good"] == "SUCCESS"
    text = await messages(pg_store, run_id, "bad")
    assert "could not record this attempt's outcome" in text
    assert "0x00" in text  # PostgreSQL's own words for the bad character


async def test_a_bad_fire_fails_its_wait_and_the_others_fire(pg_store) -> None:
    dag = DAG("poison_flush")
    dag.sensor("bad", NulTrigger(name="nul-fires", poke_interval=0.05), mode="deferrable")
    dag.sensor("good", FlagTrigger(name="ok-fires", poke_interval=0.05), mode="deferrable")
    run_id = await pg_store.runs.create_run(dag, DAY)
    async with serving(pg_store, dag) as h:

        async def both_deferred() -> bool:
            return set((await states(pg_store, run_id)).values()) == {"DEFERRED"}

        await async_wait_until(both_deferred, timeout=30)
        assert h.triggerer is not None
        trig = h.triggerer
        await async_wait_until(lambda: trig.table.subscriptions == 2, timeout=30)
        FLAGS.update({"nul-fires", "ok-fires"})  # both fire, into one flush

        async def settled() -> bool:
            return await states(pg_store, run_id) == {"bad": "FAILED", "good": "SUCCESS"}

        await async_wait_until(settled, timeout=60, what="bad failed, good fired")
    assert "cannot record this wait's event" in await messages(pg_store, run_id, "bad")


async def test_a_bad_deferral_in_a_batch_fails_its_task_and_the_others_defer(pg_store) -> None:
    """Deferrals of one exchange are written in one statement; one that cannot be written
    fails only its own task, and the others (two of them equal waits) defer."""
    dag = DAG("poison_deferrals")
    dag.sensor("bad", NulDeferTrigger(name="never-a"), mode="deferrable")
    for i in range(5):
        dag.sensor(f"good{i}", FlagTrigger(name=f"never-{i % 3}"), mode="deferrable")
    run_id = await pg_store.runs.create_run(dag, DAY)
    async with serving(pg_store, dag, triggerer=False, slots=8):

        async def settled() -> bool:
            s = await states(pg_store, run_id)
            return s["bad"] == "FAILED" and all(s[f"good{i}"] == "DEFERRED" for i in range(5))

        await async_wait_until(settled, timeout=60, what="bad failed, the others deferred")
    text = await messages(pg_store, run_id, "bad")
    assert "could not record this attempt's outcome" in text
    assert "cannot be converted to text" in text  # the NUL, in PostgreSQL's words
