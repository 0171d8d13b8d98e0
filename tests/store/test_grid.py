"""A DAG's page reads on both backends: its runs paged back through all of its history by
keyset (ties of one creation time broken by run id), the page size capped, a mapped
task's instances counted by state and expanded by map index, the rows in topological
order, the calendar by logical date; a DAG never catalogued still has its grid."""

from __future__ import annotations

import asyncio
import json
from datetime import date, timedelta
from pathlib import Path

import pytest
from support import backends
from support.griddy import GRIDDY, TASKS
from support.helpers import FakeClock, write_dag

from executor import DAG
from executor.loader import load_dag
from executor.store import Store
from executor.store.catalogue import DeclaredDag
from executor.store.grid import MAX_RUNS, BadRunKey, Grid, GridCell, RunKey, task_order
from executor.store.runs import RunShape
from executor.worker import Worker

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture


def griddy(tmp_path: Path) -> DAG:
    return load_dag(str(write_dag(tmp_path, GRIDDY, "griddy.py")), "griddy")


async def make_runs(store: Store, clock: FakeClock, dag: DAG, n: int, *, tie: int = 0) -> list[str]:
    """``n`` runs, one a second, the last ``tie`` of them created at one instant; their ids
    newest first, as the grid pages them (a tie: the greater id first)."""
    made: list[tuple[float, str]] = []
    for i in range(n):
        if i < n - tie:
            clock.advance(1.0)
        run_id = await store.runs.create_run(dag, date(2026, 1, 1) + timedelta(days=i))
        made.append((clock(), run_id))
    return [run_id for _, run_id in sorted(made, reverse=True)]


def column_ids(grid: Grid) -> list[str]:
    return [r.run_id for r in grid.runs]


async def test_paging_back_and_forth_through_all_history_by_keyset(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    newest_first = await make_runs(store, clock, griddy(tmp_path), 30, tie=3)
    seen: list[str] = []
    pages: list[Grid] = []
    before = None
    while True:
        grid = await store.grids.grid("griddy", 7, before)
        assert grid is not None
        pages.append(grid)
        # Columns oldest first (left to right); the page goes back from where it started.
        assert column_ids(grid) == list(reversed(newest_first[len(seen) : len(seen) + 7]))
        seen += list(reversed(column_ids(grid)))
        if grid.older is None:
            break
        assert grid.older == grid.runs[0].key
        before = grid.older
    assert seen == newest_first  # every run once, none skipped, across the tie too
    assert [len(p.runs) for p in pages] == [7, 7, 7, 7, 2]
    assert pages[0].at_newest and pages[0].newer is None
    # Forward again: each page's newer link leads to the page before it.
    assert pages[1].newer is None and not pages[1].at_newest  # back to the newest page
    for later, earlier in zip(pages[2:], pages[1:], strict=False):
        assert later.newer is not None
        again = await store.grids.grid("griddy", 7, later.newer)
        assert again is not None and column_ids(again) == column_ids(earlier)
    # Every task a row, in topological order, each run a cell.
    assert pages[0].tasks == TASKS
    assert len(pages[0].cells) == 7 * 6
    # A key past the oldest run: an empty page of a DAG that exists, not an unknown DAG.
    empty = await store.grids.grid("griddy", 7, RunKey(0.0, ""))
    assert empty is not None and empty.runs == [] and empty.older is None
    assert await store.grids.grid("no-such-dag") is None
    assert await store.grids.grid("no-such-dag", 5, RunKey(1e12, "x")) is None


async def test_the_page_size_is_capped(store: Store, clock: FakeClock, tmp_path: Path) -> None:
    dag = griddy(tmp_path)
    await make_runs(store, clock, dag, MAX_RUNS + 2)
    grid = await store.grids.grid("griddy", 10_000)
    assert grid is not None and len(grid.runs) == MAX_RUNS and grid.older is not None
    rest = await store.grids.grid("griddy", 10_000, grid.older)
    assert rest is not None and len(rest.runs) == 2 and rest.older is None
    one = await store.grids.grid("griddy", 0)
    assert one is not None and len(one.runs) == 1


async def test_a_mapped_task_is_one_cell_with_its_instances_by_state_and_expands(
    store: Store, tmp_path: Path
) -> None:
    dag = griddy(tmp_path)
    good = await store.runs.create_run(dag, date(2026, 2, 1))
    bad = await store.runs.create_run(dag, date(2026, 2, 2), conf={"fail_item": 4})
    worker = Worker(store, dags={"griddy": dag}, poll_interval=0.02, slots=4)

    async def ended() -> bool:
        states = await store.views.runs_states([good, bad])
        return all(s in ("SUCCESS", "FAILED") for s in states.values()) and len(states) == 2

    await asyncio.wait_for(worker.run(until=ended), 30)
    grid = await store.grids.grid("griddy", 25, None, expand=["shard", "merge", "nope"])
    assert grid is not None and not grid.live
    assert [r.run_id for r in grid.runs] == [good, bad]
    ok, failed = grid.cells[(good, "shard")], grid.cells[(bad, "shard")]
    assert ok.mapped and ok.counts == {"SUCCESS": 6} and ok.state == "SUCCESS"
    assert failed.counts == {"SUCCESS": 5, "FAILED": 1} and failed.state == "FAILED"
    assert failed.seconds(grid.now) is not None
    assert not grid.cells[(bad, "merge")].mapped
    assert grid.cells[(bad, "merge")].state == "UPSTREAM_FAILED"
    assert grid.cells[(bad, "report")].state == "SUCCESS"  # all_done
    # Expanded: one cell per run and map index; an unmapped or unknown task is not.
    assert list(grid.instances) == ["shard"] and grid.map_indexes["shard"] == list(range(6))
    by_index = {i: c.state for (run, i), c in grid.instances["shard"].items() if run == bad}
    assert by_index == {0: "SUCCESS", 1: "SUCCESS", 2: "SUCCESS", 3: "SUCCESS",
                        4: "FAILED", 5: "SUCCESS"}  # fmt: skip
    # Not catalogued (run from a file): the rows in the order they first appear.
    assert grid.dag is None and grid.tasks == TASKS


async def test_a_tasks_durations_over_its_dags_newest_runs(store: Store, tmp_path: Path) -> None:
    """The task page's chart: one task across its DAG's runs, oldest first, each with how
    long it ran; a run not started yet has none, an instance reads its own row."""
    dag = griddy(tmp_path)
    done = [await store.runs.create_run(dag, date(2026, 3, d)) for d in (1, 2)]
    worker = Worker(store, dags={"griddy": dag}, poll_interval=0.02, slots=4)

    async def ended() -> bool:
        return set((await store.views.runs_states(done)).values()) == {"SUCCESS"}

    await asyncio.wait_for(worker.run(until=ended), 30)
    waiting = await store.runs.create_run(dag, date(2026, 3, 3))
    times = await store.grids.task_durations(done[0], "merge")
    assert [t.run_id for t in times] == [*done, waiting]
    assert [t.state for t in times] == ["SUCCESS", "SUCCESS", "PENDING"]
    for t in times[:2]:
        assert t.started_at is not None and t.ended_at is not None
        assert t.seconds(0.0) == t.ended_at - t.started_at >= 0
    assert times[2].seconds(1e12) is None
    assert len(await store.grids.task_durations(waiting, "merge", n=2)) == 2  # the newest two
    shard3 = await store.grids.task_durations(done[1], "shard", 3)
    assert [t.state for t in shard3[:2]] == ["SUCCESS", "SUCCESS"]
    assert await store.grids.task_durations("no-such-run", "merge") == []


async def test_catalogued_shape_orders_rows_topologically(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    dag = griddy(tmp_path)
    shape = RunShape.of(dag)
    # Declared children first: the rows still put every parent above its children.
    backwards = RunShape("griddy", tuple(reversed(shape.tasks))).to_json()
    await store.catalogue.record_parse(
        str(tmp_path / "griddy.py"), 1.0, [DeclaredDag("griddy", shape=backwards)], None
    )
    grid = await store.grids.grid("griddy")
    assert grid is not None and grid.runs == [] and grid.dag is not None
    rows = grid.tasks
    assert sorted(rows) == sorted(TASKS)
    for t in shape.tasks:
        for p in t.parents:
            assert rows.index(p) < rows.index(t.task_id), (p, t.task_id, rows)
    # A task the runs have and the shape no longer declares keeps a row, after the rest.
    assert task_order(backwards, ["gone", "extract"])[-1] == "gone"
    assert task_order(None, ["b", "a"]) == ["b", "a"]


async def test_the_calendar_counts_runs_by_logical_date(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    dag = griddy(tmp_path)
    clock.set(1_780_000_000.0)  # 2026-05-28 UTC
    today = date(2026, 5, 28)
    for day in (today, today, today - timedelta(days=3), date(2024, 1, 1)):
        await store.runs.create_run(dag, day)
    cal = await store.grids.calendar("griddy")
    assert cal is not None and cal.end == today and cal.start.weekday() == 0
    assert 365 <= (cal.end - cal.start).days < 372
    assert {d: c.runs for d, c in cal.days.items()} == {
        today.isoformat(): 2,
        (today - timedelta(days=3)).isoformat(): 1,
    }  # the run of 2024 is older than a year: not read
    assert cal.days[today.isoformat()].status == "running"
    days = cal.every_day()
    assert days[0].day == cal.start.isoformat() and days[-1].day == today.isoformat()
    assert days[0].status == "none"
    assert await store.grids.calendar("no-such-dag") is None


def test_a_page_key_reads_back_exactly_and_a_bad_one_says_what_it_should_be() -> None:
    key = RunKey(1_780_000_000.123456789, "griddy:2026-01-01:a,b")
    assert RunKey.parse(key.text()) == key
    for bad in ("", "garbage", "12", "nan,x", "inf,x", ",x", "1.5,"):
        with pytest.raises(BadRunKey, match="before must be <created_at>,<run_id>"):
            RunKey.parse(bad)
    assert json.dumps(key.text())  # a plain string in the API


def test_a_cells_duration_counts_to_now_only_while_it_goes() -> None:
    def cell(state: str, started: float | None, ended: float | None) -> GridCell:
        return GridCell("r", "t", state, started, ended)

    assert cell("SUCCESS", 10.0, 12.5).seconds(100.0) == 2.5
    assert cell("RUNNING", 10.0, None).seconds(100.0) == 90.0
    assert cell("DEFERRED", 10.0, None).seconds(100.0) == 90.0  # a sensor's wait so far
    assert cell("RETRYING", 10.0, 11.0).seconds(100.0) == 1.0  # its last attempt
    assert cell("PENDING", None, None).seconds(100.0) is None  # never started
    assert cell("UPSTREAM_FAILED", None, None).seconds(100.0) is None
