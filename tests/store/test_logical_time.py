"""A run's logical time, its clock and its type on both backends: an hourly schedule's runs
are distinct, readable and carry their time of day; every way a run starts says which it
was; the runs of a database written before migration 020 get their columns filled; status
and the JSON API show them (executor/runnames.py: logical_shown)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer
from rich.console import Console
from support import backends
from support.catalogued import all_runs, catalogue_file
from support.helpers import FakeClock, loaded_waits, ops, raw_sql, write_dag

import schema
from executor import DAG
from executor.catalogue import _declared
from executor.runnames import logical_shown
from executor.store import Store, open_store
from executor.store.catalogue import DeclaredDag
from executor.worker import Worker
from slotless.status import collect, render
from slotless.web.app import make_app
from triggerer.store import Fire, TriggererBatch

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)  # the test's "now", on the hour
TOKEN = "s3cret"

HOURLY = f"""
from datetime import datetime
from executor import DAG

dag = DAG("hourly_metrics", schedule="@hourly", catchup=True,
          start_date=datetime.fromisoformat("{(T0 - timedelta(hours=6)).isoformat()}"))

@dag.task
def work(ctx):
    return ctx.ds
"""

DAILY_PARIS = """
from datetime import datetime
from executor import DAG

dag = DAG("daily_paris", schedule="@daily", timezone="Europe/Paris", catchup=True,
          start_date=datetime(2026, 11, 24))  # naive: on the DAG's clock

@dag.task
def work(ctx):
    return ctx.ds
"""

LANDING = """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG("landing", timezone="Europe/Paris",
          start_when=FileTrigger(path="/in/{{ ds }}.csv", poke_interval=5))

@dag.task
def work(ctx):
    return ctx.start_event
"""


async def fire_start_waits(store: Store, payload: object = None) -> dict[int, int]:
    """Fire every armed start wait, as the triggerer does when their triggers fire."""
    waits = await loaded_waits(store, "start")
    await ops(store).triggerer_commit(
        TriggererBatch(fires=[Fire(waits, json.dumps(payload), "fired")])
    )
    return waits


def of(runs: list[dict], dag_id: str) -> list[dict]:
    return sorted((r for r in runs if r["dag_id"] == dag_id), key=lambda r: r["logical_time"])


async def test_an_hourly_schedule_creates_distinct_readable_runs_once(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    await catalogue_file(store, write_dag(tmp_path, HOURLY))
    waits = await fire_start_waits(store)
    runs = of(await all_runs(store), "hourly_metrics")
    hours = range(6, 12)  # 06:00 to 11:00: the intervals ended by 12:00
    assert [r["run_id"] for r in runs] == [f"hourly_metrics:2026-11-26T{h:02d}:00" for h in hours]
    assert [r["logical_time"] for r in runs] == [f"2026-11-26T{h:02d}:00:00+00:00" for h in hours]
    assert [logical_shown(r) for r in runs] == [f"2026-11-26 {h:02d}:00" for h in hours]
    assert {(r["logical_date"], r["timezone"], r["run_type"]) for r in runs} == {
        ("2026-11-26", "UTC", "scheduled")
    }

    # Once per key, though the id is the key's: a replayed fire, then a backfill of the
    # same intervals, create nothing and find the same runs.
    await ops(store).triggerer_commit(TriggererBatch(fires=[Fire(waits, "null", "again")]))
    spec = await store.catalogue.start_spec("hourly_metrics")
    assert spec.schedule is not None
    done = await store.runs.backfill(
        spec, list(spec.schedule.intervals(T0 - timedelta(hours=6), T0)), max_active=16
    )
    assert [(b.how, b.run_id) for b in done] == [("existing", r["run_id"]) for r in runs]
    assert of(await all_runs(store), "hourly_metrics") == runs

    # slotless status: the time is on each run, in its text and its JSON.
    view = await collect(store)  # created at one tick: in no particular order
    by_id = {r["run_id"]: r for r in view.to_json()["runs"]}
    assert sorted(
        (r["logical_time"], r["logical_shown"], r["run_type"]) for r in by_id.values()
    ) == [(f"2026-11-26T{h:02d}:00:00+00:00", f"2026-11-26 {h:02d}:00", "scheduled") for h in hours]
    console = Console(record=True, width=200)
    render(view, console)
    text = console.export_text()
    assert "2026-11-26 06:00" in text and "hourly_metrics:2026-11-26T06:00" in text


async def test_a_zoned_schedule_is_named_on_its_clock(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    await catalogue_file(store, write_dag(tmp_path, DAILY_PARIS))
    await fire_start_waits(store)
    runs = of(await all_runs(store), "daily_paris")
    # Midnight in Paris (23:00 UTC): the run's date is its Paris date, as its ds.
    assert [r["run_id"] for r in runs] == [
        "daily_paris:2026-11-24T00:00+01:00",
        "daily_paris:2026-11-25T00:00+01:00",
    ]
    assert [r["logical_time"] for r in runs] == [
        "2026-11-23T23:00:00+00:00",
        "2026-11-24T23:00:00+00:00",
    ]
    assert [r["logical_date"] for r in runs] == ["2026-11-24", "2026-11-25"]
    assert [logical_shown(r) for r in runs] == ["2026-11-24", "2026-11-25"]
    assert {r["timezone"] for r in runs} == {"Europe/Paris"}


async def test_every_way_a_run_starts_says_which(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    await catalogue_file(store, write_dag(tmp_path, HOURLY, "hourly.py"))
    await catalogue_file(store, write_dag(tmp_path, LANDING, "landing.py"))
    spec = await store.catalogue.start_spec("hourly_metrics")
    assert spec.schedule is not None
    # backfill before the schedule fires: its intervals are the backfill's, the rest the
    # schedule's; a rerun of a failed interval is a backfill's too.
    first = list(spec.schedule.intervals(T0 - timedelta(hours=6), T0 - timedelta(hours=4)))
    done = await store.runs.backfill(spec, first, max_active=16)
    assert [b.how for b in done] == ["created", "created"]
    assert (await store.runs.mark(done[0].run_id, "work", "failed")).run_state == "FAILED"
    [rerun] = await store.runs.backfill(spec, first[:1], max_active=16, rerun_failed=True)
    assert rerun.how == "rerun" and rerun.run_id == f"{done[0].run_id}~rerun-1"
    await fire_start_waits(store, {"path": "/in/2026-11-26.csv"})
    manual = DAG("by_hand", timezone="Europe/Paris")
    manual.task(lambda ctx: None, task_id="t")
    started = await store.runs.start_run(manual, date(2026, 11, 26))

    runs = {r["run_id"]: r for r in await all_runs(store)}
    hourly = of(list(runs.values()), "hourly_metrics")
    assert [(r["run_id"], r["run_type"]) for r in hourly] == [
        ("hourly_metrics:2026-11-26T06:00", "backfill"),
        ("hourly_metrics:2026-11-26T06:00~rerun-1", "backfill"),
        ("hourly_metrics:2026-11-26T07:00", "backfill"),
        *((f"hourly_metrics:2026-11-26T{h:02d}:00", "scheduled") for h in range(8, 12)),
    ]
    assert hourly[1]["logical_time"] == hourly[0]["logical_time"]  # one interval, two runs
    [event] = of(list(runs.values()), "landing")
    assert event["run_type"] == "event" and event["run_key"] == "2026-11-26"
    # A run for a date has midnight of it on its DAG's clock as its logical time.
    assert (event["logical_time"], event["timezone"]) == (
        "2026-11-25T23:00:00+00:00",
        "Europe/Paris",
    )
    assert logical_shown(event) == "2026-11-26"
    by_hand = runs[started.run_id]
    assert by_hand["run_type"] == "manual"
    assert by_hand["logical_time"] == "2026-11-25T23:00:00+00:00"
    assert logical_shown(by_hand) == "2026-11-26"
    with pytest.raises(ValueError, match="'sometimes' is not a valid RunType"):
        await store.runs.start_run(manual, date(2026, 11, 26), run_type="sometimes")


async def test_the_api_says_a_runs_logical_time_and_type(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    await catalogue_file(store, write_dag(tmp_path, HOURLY))
    await fire_start_waits(store)
    async with TestClient(TestServer(make_app(store, token=f"alice:{TOKEN}"))) as client:
        got = await client.get("/api/v1/runs/" + quote("hourly_metrics:2026-11-26T06:00", safe=""))
        assert got.status == 200, await got.text()
        run = await got.json()
        assert {
            k: run[k] for k in ("logical_date", "logical_time", "logical_shown", "run_type")
        } == {
            "logical_date": "2026-11-26",
            "logical_time": "2026-11-26T06:00:00+00:00",
            "logical_shown": "2026-11-26 06:00",
            "run_type": "scheduled",
        }
        posted = await client.post(
            "/api/v1/dags/hourly_metrics/runs",
            json={"logical_date": "2026-11-26", "run_key": "by-api"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert posted.status == 201, await posted.text()
        started = await posted.json()
        assert started["created"] and started["run_type"] == "manual"
        assert (started["logical_time"], started["logical_shown"]) == (
            "2026-11-26T00:00:00+00:00",
            "2026-11-26",
        )
        again = await client.get("/api/v1/runs/" + quote(started["run_id"], safe=""))
        assert (await again.json())["run_type"] == "manual"
        doc = await (await client.get("/api/v1/openapi.json")).json()
    for model in ("RunOut", "RunStatusOut"):
        props = doc["components"]["schemas"][model]["properties"]
        assert {"logical_time", "logical_shown", "run_type"} <= set(props)
        assert props["run_type"]["anyOf"][0]["enum"] == [
            "scheduled",
            "manual",
            "backfill",
            "event",
            "asset",
        ]


async def test_runs_written_before_020_get_their_columns_filled(
    url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The columns of runs created before migration 020, filled as its comments say."""
    clock.set(T0.timestamp())
    real = {b: schema.migrations(b) for b in schema.BACKENDS}
    monkeypatch.setattr(schema, "migrations", lambda b: tuple(m for m in real[b] if m.version < 20))
    paris = DAG("paris", schedule="@hourly", timezone="Europe/Paris", start_date=T0)
    paris.task(lambda ctx: None, task_id="work")
    old = await open_store(url, clock=clock)
    try:
        declared = DeclaredDag(**_declared(paris, paris.dag_id))  # type: ignore[arg-type]
        assert await old.catalogue.record_parse("/dags/paris.py", 1.0, [declared], None) is None
    finally:
        await old.close()
    interval = "'2026-11-25T05:00:00+00:00', '2026-11-25T06:00:00+00:00'"
    await raw_sql(
        url,
        "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at, tasks_unfinished,"
        " run_key, data_interval_start, data_interval_end, start_event) VALUES"
        f" ('s', 'paris', '2026-11-25', 'SUCCESS', 1, 0, '2026-11-25T05:00:00Z', {interval}, NULL),"
        " ('r', 'paris', '2026-11-25', 'SUCCESS', 2, 0, '2026-11-25T05:00:00Z~rerun-1',"
        f" {interval}, NULL),"
        f" ('g', 'gone', '2026-11-25', 'SUCCESS', 3, 0, '2026-11-25T05:00:00Z', {interval}, NULL),"
        " ('d', 'landing', '2026-11-25', 'SUCCESS', 4, 0, '2026-11-25', NULL, NULL, NULL),"
        " ('e', 'landing', '2026-11-25', 'SUCCESS', 5, 0, 'in/a.csv', NULL, NULL, '{\"k\": 1}'),"
        " ('m', 'report', '2026-11-25', 'SUCCESS', 6, 0, '2026-11-25~manual-3fa9c1', NULL, NULL,"
        " NULL),"
        " ('old:run', 'old', '2026-11-24', 'SUCCESS', 7, 0, 'old:run', NULL, NULL, NULL)",
    )
    monkeypatch.setattr(schema, "migrations", lambda b: real[b])

    store = await open_store(url, clock=clock)
    try:
        runs = {r["run_id"]: r for r in await all_runs(store)}
        filled = {
            i: (r["logical_time"], r["timezone"], r["run_type"], logical_shown(r))
            for i, r in runs.items()
        }
        hour = "2026-11-25T05:00:00+00:00"
        assert filled == {
            "s": (hour, "Europe/Paris", "scheduled", "2026-11-25 06:00"),
            "r": (hour, "Europe/Paris", "backfill", "2026-11-25 06:00"),
            "g": (hour, "UTC", "scheduled", "2026-11-25 05:00"),  # its DAG is gone: UTC
            "d": ("2026-11-25T00:00:00+00:00", "UTC", "event", "2026-11-25"),
            "e": ("2026-11-25T00:00:00+00:00", "UTC", "event", "2026-11-25"),
            "m": ("2026-11-25T00:00:00+00:00", "UTC", "manual", "2026-11-25"),
            "old:run": ("2026-11-24T00:00:00+00:00", "UTC", "manual", "2026-11-24"),
        }
        manual = DAG("after")
        manual.task(lambda ctx: None, task_id="t")
        started = await store.runs.start_run(manual, date(2026, 11, 26))  # the new schema works
        assert (await store.views.run_info(started.run_id) or {})["run_type"] == "manual"
    finally:
        await store.close()


async def test_a_notification_names_the_run_by_its_logical_time(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    said = tmp_path / "said.txt"
    source = f"""
from datetime import datetime
from executor import DAG

def tell(ctx):
    with open({str(said)!r}, "a") as f:
        f.write(ctx.body().splitlines()[0] + "\\n")

dag = DAG("hourly_metrics", schedule="@hourly", on_failure=tell,
          start_date=datetime.fromisoformat("{(T0 - timedelta(hours=1)).isoformat()}"))

@dag.task
def work(ctx):
    raise RuntimeError("no data")
"""
    await catalogue_file(store, write_dag(tmp_path, source))
    await fire_start_waits(store)
    [run] = await all_runs(store)
    assert run["run_id"] == "hourly_metrics:2026-11-26T11:00"

    async def told() -> bool:
        return said.exists() and said.read_text().endswith("\n")

    await asyncio.wait_for(Worker(store, poll_interval=0.02).run(until=told), 30)
    assert said.read_text() == "run hourly_metrics:2026-11-26T11:00 (2026-11-26 11:00)\n"
