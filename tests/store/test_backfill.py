"""Backfill's run creation on both backends: one run per interval from the catalogue's
stored shape, keyed as the schedule keys it (so a backfill again, or the schedule firing
for the same intervals, creates nothing), queued over ``max_active``; a FAILED interval
gets one ``~rerun-N`` run only when asked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from support import backends
from support.catalogued import all_runs, catalogue_file
from support.helpers import FakeClock, loaded_waits, ops, run_to_end, write_dag

from executor.store import Store
from executor.store.runs import scheduled_run_key
from triggerer.store import Fire, TriggererBatch

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)  # the test's "now", on the hour

HOURLY = f"""
from datetime import datetime
from executor import DAG

dag = DAG("hourly", schedule="@hourly", catchup=True, max_active_runs=16,
          start_date=datetime.fromisoformat("{(T0 - timedelta(hours=5)).isoformat()}"))

@dag.task
def work(ctx):
    if ctx.data_interval_start.hour == 9:
        raise RuntimeError("no data for 09:00")
    return ctx.data_interval_start.isoformat()
"""


async def catalogued(store: Store, tmp_path: Path) -> None:
    await catalogue_file(store, write_dag(tmp_path, HOURLY))


async def test_one_run_per_interval_keyed_as_the_schedule_queued_over_max_active(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    await catalogued(store, tmp_path)
    spec = await store.catalogue.start_spec("hourly")
    assert spec.schedule is not None
    intervals = list(spec.schedule.intervals(T0 - timedelta(days=1), T0))
    assert len(intervals) == 5  # from start_date, 07:00, to 11:00
    done = await store.runs.backfill(spec, intervals, max_active=2)
    assert [b.how for b in done] == ["created"] * 5
    assert [b.run_key for b in done] == [scheduled_run_key(iv) for iv in intervals]
    assert [b.state for b in done] == ["RUNNING", "RUNNING", "QUEUED", "QUEUED", "QUEUED"]
    rows = {r["run_id"]: r for r in await all_runs(store)}
    first = rows[done[0].run_id]
    assert first["dag_file"] == spec.file and first["max_active"] == 2
    assert first["data_interval_start"] == intervals[0].start.isoformat()
    assert first["logical_date"] == "2026-11-20"

    # Again: every interval found, nothing created.
    again = await store.runs.backfill(spec, intervals, max_active=2)
    assert [(b.how, b.run_id) for b in again] == [("existing", b.run_id) for b in done]

    # The schedule (catchup from 07:00) fires for the same intervals: nothing created.
    waits = await loaded_waits(store, "start")
    assert waits, "the catalogue armed the schedule"
    await ops(store).triggerer_commit(TriggererBatch(fires=[Fire(waits, "null", "fired")]))
    assert len(await all_runs(store)) == 5
    assert (await store.views.runs_states([b.run_id for b in done])) == {
        b.run_id: b.state for b in done
    }


async def test_a_failed_interval_is_rerun_once_only_when_asked(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(T0.timestamp())
    await catalogued(store, tmp_path)
    spec = await store.catalogue.start_spec("hourly")
    assert spec.schedule is not None
    nine = list(spec.schedule.intervals(T0 - timedelta(hours=3), T0 - timedelta(hours=2)))
    assert [iv.start.hour for iv in nine] == [9]
    [first] = await store.runs.backfill(spec, nine, max_active=1)
    assert (await run_to_end(store, first.run_id))["state"] == "FAILED"

    [left] = await store.runs.backfill(spec, nine, max_active=1)
    assert (left.how, left.run_id, left.state) == ("existing", first.run_id, "FAILED")

    [rerun] = await store.runs.backfill(spec, nine, max_active=1, rerun_failed=True)
    assert rerun.how == "rerun" and rerun.rerun_of == first.run_id
    assert rerun.run_key == first.run_key + "~rerun-1" and rerun.state == "RUNNING"
    # Asked again while the rerun goes on: the rerun is the interval's run, found.
    [going] = await store.runs.backfill(spec, nine, max_active=1, rerun_failed=True)
    assert (going.how, going.run_id, going.rerun_of) == ("existing", rerun.run_id, None)

    assert (await run_to_end(store, rerun.run_id))["state"] == "FAILED"
    [second] = await store.runs.backfill(spec, nine, max_active=1, rerun_failed=True)
    assert second.run_key == first.run_key + "~rerun-2" and second.rerun_of == rerun.run_id
    assert len(await all_runs(store)) == 3
    row = next(r for r in await all_runs(store) if r["run_id"] == second.run_id)
    assert row["data_interval_start"] == nine[0].start.isoformat()
