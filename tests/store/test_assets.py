"""Assets on both backends: an event starts the DAGs whose condition it completes, in its
own transaction, once per satisfied set: `a & b`, `[a, b]`, `a | b`; events from a task's
success (with its extra), from outside (the store's send, as the CLI and the API call it);
a replayed event; concurrent writers of the two events a run needs."""

from __future__ import annotations

import asyncio
import json
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.catalogued import all_runs, catalogue_file
from support.helpers import (
    FakeClock,
    async_wait_until,
    loaded_waits,
    ops,
    run_to_end,
    write_dag,
)
from support.triggers import serving

from executor.assets import Asset, AssetError, holds, to_tree
from executor.loader import load_dag
from executor.store import Store, open_store
from executor.store.assets import asset_run_key
from triggerer.store import Fire, TriggererBatch

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

A, B, C = "s3://lake/a", "s3://lake/b", "s3://lake/c"

CONSUMERS = f"""
from executor import DAG
from executor.assets import Asset

a, b, c = Asset("{A}"), Asset("{B}", name="bees"), Asset("{C}")
both = DAG("both", schedule=a & b)
listed = DAG("listed", schedule=[a, b])
either = DAG("either", schedule=a | b)
nested = DAG("nested", schedule=a & (b | c))

for d in (both, listed, either, nested):
    @d.task(task_id="see")
    def see(ctx):
        return {{u: [e["extra"] for e in evs] for u, evs in ctx.triggering_asset_events.items()}}
"""


async def runs_of(store: Store, dag_id: str) -> list[dict]:
    return [r for r in await all_runs(store) if r["dag_id"] == dag_id]


async def send(store: Store, uri: str, key: str | None = None, **extra: object) -> list[str]:
    rec = await store.assets.send_event(
        uri, json.dumps(extra) if extra else None, source="api", dedup_key=key
    )
    return rec.runs


async def test_conditions_start_once_per_satisfied_set(store: Store, tmp_path: Path) -> None:
    await catalogue_file(store, write_dag(tmp_path, CONSUMERS))

    started = await send(store, A, n=1)
    # a alone: `either` holds, `both`, `listed` and `nested` do not.
    assert [r["dag_id"] for r in await all_runs(store)] == ["either"]
    assert len(started) == 1
    await send(store, A, n=2)  # a again: `either` again (a new set), the rest still wait
    assert len(await runs_of(store, "either")) == 2
    assert await runs_of(store, "both") == [] and await runs_of(store, "listed") == []

    started = await send(store, B, n=3)
    for dag_id in ("both", "listed", "nested", "either"):
        assert len(await runs_of(store, dag_id)) == (3 if dag_id == "either" else 1), dag_id
    [run] = await runs_of(store, "both")
    assert run["run_type"] == "asset" and run["run_key"].startswith("asset~")
    # Both a events count toward the one run: they were all queued since the last.
    shown = json.loads(run["start_event"])["triggering_asset_events"]
    assert [e["extra"] for e in shown[A]] == [{"n": 1}, {"n": 2}]
    assert [e["extra"] for e in shown[B]] == [{"n": 3}]

    # Consumed: b alone now starts nothing but `either`.
    await send(store, B)
    assert len(await runs_of(store, "both")) == 1 and len(await runs_of(store, "listed")) == 1
    assert len(await runs_of(store, "either")) == 4
    await send(store, C)  # (b | c) held already for nested: a is still missing
    assert len(await runs_of(store, "nested")) == 1
    await send(store, A)  # then a completes nested (with b and c queued), both and listed
    assert len(await runs_of(store, "nested")) == 2
    assert len(await runs_of(store, "both")) == 2 and len(await runs_of(store, "listed")) == 2

    listed = {a.uri: a for a in await store.assets.list_assets()}
    assert listed[B].name == "bees" and listed[A].events == 3
    assert sorted(listed[A].consumers) == ["both", "either", "listed", "nested"]


async def test_replayed_event_starts_nothing_more(store: Store, tmp_path: Path) -> None:
    await catalogue_file(store, write_dag(tmp_path, CONSUMERS))
    await send(store, A, key="req-1")
    first = await store.assets.send_event(B, None, source="api", dedup_key="req-2")
    assert first.created and len(first.runs) == 4  # both, listed, nested, either
    again = await store.assets.send_event(B, None, source="api", dedup_key="req-2")
    assert not again.created and again.runs == [] and again.id == first.id
    assert len(await all_runs(store)) == 5
    [b] = [a for a in await store.assets.list_assets() if a.uri == B]
    assert b.events == 1
    for n in range(7):
        await send(store, C, n=n)
    [c] = [a for a in await store.assets.list_assets() if a.uri == C]
    assert c.events == 7 and [e["extra"]["n"] for e in c.last_events] == [6, 5, 4, 3, 2]
    assert c.last_ts == c.last_events[0]["ts"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_task_success_records_the_event_and_its_extra(
    store: Store, tmp_path: Path, isolation: str
) -> None:
    """In a forked child too: ctx.asset_event's extra crosses the pipe with the logs."""
    path = write_dag(
        tmp_path,
        f"""
        from executor import DAG
        from executor.assets import Asset

        orders = Asset("{A}")
        producer = DAG("producer")

        @producer.task(outlets=[orders])
        def write(ctx):
            ctx.asset_event(orders, extra={{"rows": 12}})
            return 1

        consumer = DAG("consumer", schedule=[orders])

        @consumer.task
        def read(ctx):
            return ctx.triggering_asset_events
        """,
    )
    await catalogue_file(store, path)
    producer = load_dag(path, "producer")
    started = await store.runs.start_run(producer, date(2026, 11, 26), dag_file=str(path))
    await run_to_end(store, started.run_id, isolation=isolation)
    [run] = await runs_of(store, "consumer")
    assert run["run_type"] == "asset"
    await run_to_end(store, run["run_id"])
    [out] = await store.views.run_tasks(run["run_id"])
    seen = json.loads(out["output"])
    [event] = seen[A]
    assert event["extra"] == {"rows": 12} and event["source"] == "task"
    assert event["run_id"] == started.run_id and event["task_id"] == "write"
    [asset] = [a for a in await store.assets.list_assets() if a.uri == A]
    assert asset.producers == [("producer", "write")] and asset.consumers == ["consumer"]


async def test_a_deferred_sensors_success_records_its_outlets_event(
    store: Store, tmp_path: Path
) -> None:
    """A deferrable sensor whose condition holds on the triggerer: it comes back to a worker,
    which writes its SUCCESS and its outlets' event together, and the consumer starts. A
    sensor without outlets still ends on the triggerer, with no worker round trip."""
    flag = tmp_path / "landed.flag"
    path = write_dag(
        tmp_path,
        f"""
        from executor import DAG
        from executor.assets import Asset
        from triggers.files import FileTrigger

        landed = Asset("{A}")
        producer = DAG("producer")
        producer.sensor("wait", FileTrigger(path="{flag}", poke_interval=0.05), outlets=[landed])
        producer.sensor("plain", FileTrigger(path="{flag}", poke_interval=0.05))
        consumer = DAG("consumer", schedule=[landed])

        @consumer.task
        def read(ctx):
            return ctx.triggering_asset_events
        """,
    )
    await catalogue_file(store, path)
    producer = load_dag(path, "producer")
    started = await store.runs.start_run(producer, date(2026, 11, 26), dag_file=str(path))
    async with serving(store, producer):
        await async_wait_until(
            lambda: store_states(store, started.run_id, {"wait": "DEFERRED", "plain": "DEFERRED"})
        )
        assert await runs_of(store, "consumer") == []
        flag.write_text("here")
        await async_wait_until(
            lambda: store_states(store, started.run_id, {"wait": "SUCCESS", "plain": "SUCCESS"})
        )
    [run] = await runs_of(store, "consumer")
    assert run["run_type"] == "asset"
    events = json.loads(run["start_event"])["triggering_asset_events"][A]
    assert [(e["source"], e["run_id"], e["task_id"]) for e in events] == [
        ("task", started.run_id, "wait")
    ]
    tasks = {t["task_id"]: t for t in await store.views.run_tasks(started.run_id)}
    # Both outputs are the trigger's event; only the one with outlets had a worker resume it.
    assert json.loads(tasks["wait"]["output"]) == json.loads(tasks["plain"]["output"])
    assert tasks["wait"]["attempt"] == tasks["plain"]["attempt"] == 1
    said = {t: " ".join(str(dict(r)) for r in await store.views.task_log(started.run_id, t) or [])
            for t in tasks}  # fmt: skip
    assert "recording its outlets' asset events" in said["wait"], said["wait"]
    assert "recording its outlets" not in said["plain"], said["plain"]


async def store_states(store: Store, run_id: str, want: dict[str, str]) -> bool:
    return {t["task_id"]: t["state"] for t in await store.views.run_tasks(run_id)} == want


async def test_concurrent_writers_start_one_run_per_set(
    url: str, clock: FakeClock, tmp_path: Path
) -> None:
    """Two connections send the two events `both` needs at the same instant, round after
    round: each round is one satisfied set, so exactly one run, never zero or two."""
    first = await open_store(url, clock=clock)
    second = await open_store(url, clock=clock)
    try:
        await catalogue_file(first, write_dag(tmp_path, CONSUMERS))
        rounds = 25
        for i in range(rounds):
            await asyncio.gather(send(first, A, i=i), send(second, B, i=i))
            assert len(await runs_of(first, "both")) == i + 1, f"round {i}"
        runs = await runs_of(first, "both")
        assert len({r["run_key"] for r in runs}) == rounds
        # Each run consumed one a and one b, of its own round.
        for r in runs:
            shown = json.loads(r["start_event"])["triggering_asset_events"]
            assert len(shown[A]) == 1 and len(shown[B]) == 1
            assert shown[A][0]["extra"] == shown[B][0]["extra"]
    finally:
        await first.close()
        await second.close()


def test_conditions_and_uris() -> None:
    a, b, c = Asset(A), Asset(B), Asset(C)
    tree = {"all": [A, {"any": [B, C]}]}
    assert to_tree(a & (b | c)) == tree
    assert not holds(tree, {A}) and holds(tree, {A, C}) and not holds(tree, {B, C})
    assert asset_run_key([3, 1, 2]) == asset_run_key([1, 2, 3])
    for bad in ("orders", "s3://", "s3://a b", "", "x" * 3000):
        with pytest.raises(AssetError):
            Asset(bad)


async def test_a_watchers_fire_records_one_event_and_is_armed_again(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    """A watcher is a start wait: its fire (as the triggerer commits it) records an event,
    starts the consumer and re-arms the same watcher after its poke interval; the same fire
    written again (a retried batch, a takeover) records nothing."""
    clock.set(1_800_000_000.0)
    flag = tmp_path / "flag"
    await catalogue_file(
        store,
        write_dag(
            tmp_path,
            f"""
            from executor import DAG, Asset
            from triggers.files import FileTrigger

            c = Asset("{C}", watchers=[FileTrigger(path="{flag}", poke_interval=30)])
            on_c = DAG("on_c", schedule=[c])

            @on_c.task
            def see(ctx):
                return 1
            """,
        ),
    )
    [wait] = await store.catalogue.start_waits()
    assert wait["kind"] == f"watch:0:{C}"
    waits = await loaded_waits(store, "start")
    batch = TriggererBatch(fires=[Fire(waits, json.dumps({"path": str(flag)}), "fired")])
    await ops(store).triggerer_commit(batch)
    [run] = await runs_of(store, "on_c")
    [event] = json.loads(run["start_event"])["triggering_asset_events"][C]
    assert event["source"] == "watcher" and event["extra"] == {"path": str(flag)}
    await ops(store).triggerer_commit(batch)  # the same fire again
    assert len(await runs_of(store, "on_c")) == 1
    [asset] = [a for a in await store.assets.list_assets() if a.uri == C]
    assert asset.events == 1
    # Armed again: the same watcher, not checked before its poke interval.
    [again] = await store.catalogue.start_waits()
    assert again["kind"] == wait["kind"] and again["not_before"] == clock() + 30
    assert set(await loaded_waits(store, "start")) == set(waits)
    assert await loaded_waits(store, "start") != waits  # on a new trigger row
    # Paused, the watcher is no longer held.
    await store.catalogue.set_paused("on_c", True)
    assert await store.catalogue.start_waits() == []
