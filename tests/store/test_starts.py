"""Schedules and start conditions on both backends: the catalogue arms start waits, a fire
(as the triggerer commits it) creates the runs once per key and re-arms; catchup,
max_active_runs, pause and unpause, a condition keyed by date."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support import backends
from support.catalogued import all_runs, catalogue_file
from support.helpers import (
    FakeClock,
    held_as_loaded,
    loaded_waits,
    ops,
    raw_sql,
    run_to_end,
    write_dag,
)

import schema
from executor import DAG
from executor.catalogue import _declared
from executor.store import Store, open_store
from executor.store.catalogue import DeclaredDag
from executor.store.starts import MAX_RUNS_PER_FIRE, RETRY_AFTER
from triggerer.store import Fire, TriggererBatch
from triggerer.waitref import WaitKind, unpack
from triggers.base import BaseTrigger, TriggerEvent
from triggers.context import TriggerContext
from triggers.registry import register

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)  # the test's "now", on the hour


def hourly(start: datetime, *, catchup: bool, max_active: int = 16) -> str:
    return f"""
from datetime import datetime, timezone
from executor import DAG

dag = DAG("hourly", schedule="@hourly", catchup={catchup}, max_active_runs={max_active},
          start_date=datetime.fromisoformat("{start.isoformat()}"))

@dag.task
def work(ctx):
    return [ctx.ds, ctx.data_interval_start.isoformat(), ctx.data_interval_end.isoformat()]
"""


async def fire_start_waits(store: Store, payload: object = None) -> dict[int, int]:
    """Fire every armed start wait, as the triggerer does when their triggers fire."""
    waits = await loaded_waits(store, "start")
    await ops(store).triggerer_commit(
        TriggererBatch(fires=[Fire(waits, json.dumps(payload), "fired")])
    )
    return waits


async def replay(store: Store, waits: dict[int, int]) -> None:
    await ops(store).triggerer_commit(TriggererBatch(fires=[Fire(waits, "null", "again")]))


async def runs_by_state(store: Store) -> dict[str, int]:
    async with store.db.read() as tx:
        rows = await tx.fetch("list_runs", n=10_000)
    out: dict[str, int] = {}
    for r in rows:
        out[r["state"]] = out.get(r["state"], 0) + 1
    return out


async def test_catchup_creates_every_interval_once_and_queues_over_max_active(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    path = write_dag(tmp_path, hourly(T0 - timedelta(days=3), catchup=True, max_active=4))
    await catalogue_file(store, path)
    [wait] = await store.catalogue.start_waits()
    assert wait["kind"] == "schedule" and wait["interval_end"] is not None

    waits = await fire_start_waits(store)
    assert await runs_by_state(store) == {"RUNNING": 4, "QUEUED": 68}  # 72 hourly intervals
    keys = sorted(r["run_key"] for r in await all_runs(store))
    assert keys[0] == "2026-11-17T12:00:00Z" and keys[-1] == "2026-11-20T11:00:00Z"
    # Re-armed on the interval still running: [12:00, 13:00), due at 13:00.
    [wait] = await store.catalogue.start_waits()
    assert datetime.fromisoformat(wait["interval_end"]) == T0 + timedelta(hours=1)

    await replay(store, waits)  # the same fire again (a takeover, a retried batch)
    assert sum((await runs_by_state(store)).values()) == 72
    assert len(await store.catalogue.start_waits()) == 1

    # Runs end, queued ones start, never more than 4 at once.
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            most = max(most, (await runs_by_state(store)).get("RUNNING", 0))
            await asyncio.sleep(0.005)  # the sampling period, not a wait for something

    watcher = asyncio.create_task(watch())
    oldest = min(await all_runs(store), key=lambda r: r["run_key"])
    try:
        for _ in range(72):
            going = [r for r in await all_runs(store) if r["state"] == "RUNNING"]
            if not going:
                break
            await run_to_end(store, going[0]["run_id"], slots=2)
    finally:
        watcher.cancel()
    assert await runs_by_state(store) == {"SUCCESS": 72}
    assert most <= 4
    out = await store.views.run_tasks(oldest["run_id"])
    assert json.loads(out[0]["output"]) == [
        "2026-11-17",
        "2026-11-17T12:00:00+00:00",
        "2026-11-17T13:00:00+00:00",
    ]


async def test_a_start_wait_is_loaded_under_its_key_and_counted_in_its_shards_checksum(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    await catalogue_file(store, write_dag(tmp_path, hourly(T0, catchup=False)))
    assert len(await store.catalogue.start_waits()) == 1
    table = await held_as_loaded(store)
    held = {key: check.subscribers[key].trigger_id for key, check in table.by_row.items()}
    assert held == await loaded_waits(store, "start")
    [key] = held
    assert unpack(key)[0] is WaitKind.START


async def test_without_catchup_only_the_latest_interval_runs(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp() + 600)
    await catalogue_file(store, write_dag(tmp_path, hourly(T0 - timedelta(days=3), catchup=False)))
    await fire_start_waits(store)
    [run] = await all_runs(store)
    assert run["run_key"] == "2026-11-20T11:00:00Z" and run["state"] == "RUNNING"
    assert run["data_interval_end"] == (T0).isoformat()
    # Not due yet: the next fire (before 13:00) creates nothing.
    await fire_start_waits(store)
    assert len(await all_runs(store)) == 1
    clock.set((T0 + timedelta(hours=1, seconds=1)).timestamp())
    await fire_start_waits(store)
    assert sorted(r["run_key"] for r in await all_runs(store))[-1] == "2026-11-20T12:00:00Z"
    # A fire five hours late (the triggerers were down): the latest interval only.
    clock.set((T0 + timedelta(hours=7, minutes=30)).timestamp())
    await fire_start_waits(store)
    keys = sorted(r["run_key"] for r in await all_runs(store))
    assert keys[-2:] == ["2026-11-20T12:00:00Z", "2026-11-20T18:00:00Z"]


async def test_a_long_catchup_goes_on_over_several_fires(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    days = MAX_RUNS_PER_FIRE // 24 + 2
    await catalogue_file(
        store, write_dag(tmp_path, hourly(T0 - timedelta(days=days), catchup=True))
    )
    await fire_start_waits(store)
    assert len(await all_runs(store)) == MAX_RUNS_PER_FIRE
    await fire_start_waits(store)
    assert len(await all_runs(store)) == days * 24


async def test_pause_drops_the_wait_and_unpause_does_not_flood(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    await catalogue_file(store, write_dag(tmp_path, hourly(T0 - timedelta(days=1), catchup=False)))
    waits = await fire_start_waits(store)
    assert len(await all_runs(store)) == 1
    await store.catalogue.set_paused("hourly", True)
    assert await store.catalogue.start_waits() == []
    clock.advance(3 * 86400)
    await replay(store, waits)  # a fire of the old wait, already in flight: nothing
    await fire_start_waits(store)
    assert len(await all_runs(store)) == 1
    await store.catalogue.set_paused("hourly", False)
    await fire_start_waits(store)
    keys = sorted(r["run_key"] for r in await all_runs(store))
    assert keys == ["2026-11-20T11:00:00Z", "2026-11-23T11:00:00Z"]  # the latest, not 72


async def test_a_broken_file_starts_nothing_until_fixed(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    path = write_dag(tmp_path, hourly(T0 - timedelta(days=1), catchup=True))
    await catalogue_file(store, path)
    await store.catalogue.record_parse(str(path), 1.0, [], "SyntaxError: invalid syntax")
    assert await store.catalogue.start_waits() == []
    await catalogue_file(store, path)
    await fire_start_waits(store)
    assert len(await all_runs(store)) == 24


async def test_a_condition_starts_one_run_per_date_with_its_event(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    path = write_dag(
        tmp_path,
        """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG("landing", start_when=FileTrigger(path="/in/{{ ds }}.csv", poke_interval=5))

@dag.task
def work(ctx):
    return ctx.start_event
""",
    )
    await catalogue_file(store, path)
    [wait] = await store.catalogue.start_waits()
    assert wait["kind"] == "condition" and wait["logical_date"] == "2026-11-20"
    assert "/in/2026-11-20.csv" in wait["description"]
    waits = await fire_start_waits(store, {"path": "/in/2026-11-20.csv"})
    [run] = await all_runs(store)
    assert run["run_key"] == "2026-11-20" and run["logical_date"] == "2026-11-20"
    assert json.loads(run["start_event"]) == {"path": "/in/2026-11-20.csv"}
    # Re-armed for the next date; a replayed event creates nothing.
    [wait] = await store.catalogue.start_waits()
    assert wait["logical_date"] == "2026-11-21" and "/in/2026-11-21.csv" in wait["description"]
    await replay(store, waits)
    assert len(await all_runs(store)) == 1
    info = await run_to_end(store, run["run_id"])
    assert info["state"] == "SUCCESS"
    [task] = await store.views.run_tasks(run["run_id"])
    assert json.loads(task["output"]) == {"path": "/in/2026-11-20.csv"}


@register
class KeyedBadly(BaseTrigger):
    """A start condition whose run_requests() is wrong: a run key that is not a string."""

    name: str = "x"

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        return None

    def run_requests(self, payload: object) -> list[tuple[str | None, object]]:
        return [(42, payload)]  # type: ignore[list-item]


async def catalogue_in_process(store: Store, dag: DAG) -> None:
    """Record a DAG as the catalogue would, without a child (its trigger class is this
    module's, which a child process could not import)."""
    declared = DeclaredDag(**_declared(dag, dag.dag_id))  # type: ignore[arg-type]
    assert (
        await store.catalogue.record_parse(f"/dags/{dag.dag_id}.py", 1.0, [declared], None) is None
    )


async def test_a_condition_that_fails_is_its_dags_error_and_nothing_else(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0.timestamp())
    good = DAG("good", schedule="@hourly", start_date=T0 - timedelta(hours=2))
    good.task(lambda ctx: None, task_id="work")
    bad = DAG("bad", start_when=KeyedBadly())
    bad.task(lambda ctx: None, task_id="work")
    for dag in (good, bad):
        await catalogue_in_process(store, dag)
    # Fired together, in one batch: the good DAG's run is created, the bad one's error kept.
    await fire_start_waits(store, {"anything": 1})
    assert [r["dag_id"] for r in await all_runs(store)] == ["good"]
    rows = {r["dag_id"]: r for r in await store.catalogue.catalogue_dags()}
    assert "run key 42" in rows["bad"]["start_error"] and rows["good"]["start_error"] is None
    [wait] = [w for w in await store.catalogue.start_waits() if w["dag_id"] == "bad"]
    assert wait["not_before"] == T0.timestamp() + RETRY_AFTER  # checked again, later
    # A trigger that reports an error (or raises) is the same: kept on the DAG, retried.
    waits = await loaded_waits(store, "start")
    await ops(store).triggerer_commit(
        TriggererBatch(fires=[Fire(waits, "null", "boom", error="the bucket is gone")])
    )
    rows = {r["dag_id"]: r for r in await store.catalogue.catalogue_dags()}
    assert rows["bad"]["start_error"] == "the bucket is gone"
    assert rows["good"]["start_error"] == "the bucket is gone"  # its schedule wait was fired too
    assert len(await store.catalogue.start_waits()) == 2


async def test_a_schedule_catalogued_in_separate_columns_is_migrated_and_fires_as_before(
    url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database written before 017 held the schedule in five columns (text, timezone,
    start_date, end_date, catchup): 017 folds them into the JSON the readers take."""
    clock.set(T0.timestamp())
    real = {b: schema.migrations(b) for b in schema.BACKENDS}
    monkeypatch.setattr(schema, "migrations", lambda b: tuple(m for m in real[b] if m.version < 17))
    start = T0 - timedelta(hours=3)
    dag = DAG("hourly", schedule="@hourly", timezone="Europe/Paris", start_date=start,
              catchup=True)  # fmt: skip
    dag.task(lambda ctx: None, task_id="work")
    old = await open_store(url, clock=clock)
    try:
        await catalogue_in_process(old, dag)
    finally:
        await old.close()
    # The same declaration as the code before 017 wrote it, never armed yet.
    await raw_sql(
        url,
        "UPDATE dag SET schedule = '@hourly', timezone = 'Europe/Paris', catchup = 1, "
        f"start_date = '{start.isoformat()}', end_date = NULL",
    )
    await raw_sql(url, "DELETE FROM start_wait")
    monkeypatch.setattr(schema, "migrations", lambda b: real[b])

    store = await open_store(url, clock=clock)
    try:
        spec = await store.catalogue.start_spec("hourly")
        assert spec.schedule is not None and spec.schedule == dag.schedule
        assert spec.schedule.catchup
        await store.catalogue.set_paused("hourly", False)  # armed from the migrated row
        await fire_start_waits(store)
        assert len(await all_runs(store)) == 3  # catchup kept: every interval since 09:00
        # A parse of the same file finds the same schedule: its wait is not armed again.
        waits = await store.catalogue.start_waits()
        await catalogue_in_process(store, dag)
        assert await store.catalogue.start_waits() == waits
    finally:
        await store.close()
