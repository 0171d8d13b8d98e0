"""A DAG's own page, read cheaply however big the store: its runs as a grid's columns and
its tasks as rows (Airflow's grid view), and a calendar of a year of its runs.

The :class:`Grids` part of the store. A page of runs is read by keyset on ``(created_at,
run_id)`` (index ``dag_run_by_dag_created``): the newest, or those created before a run
already shown, so that paging back through all of a DAG's history reads only the runs
shown, however many it has. Then only those runs' task rows are read: each task's own row
(a mapped task's counts its instances), the mapped tasks' instances grouped by state, and
the instances of a task the page expands (its first :data:`INSTANCES_SHOWN` indexes). The
calendar is one grouped read of a year of logical dates. Each view is read in one read
transaction, so that everything on it held at one moment. Statements in
``schema/common/grid.sql``.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import NamedTuple, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from executor.rows import _FromRow, _typed
from executor.states import RUN_TERMINAL, TERMINAL

from ..driver.db import Tx
from .part import Part
from .runs import shape_parts
from .viewrows import DagRow

# A page shows this many runs unless asked for another number (Airflow's grid shows 25),
RUNS_SHOWN = 25
# and never more than this many: each is a column, and the page reads all their task rows.
MAX_RUNS = 100
# An expanded mapped task shows one row per map index, its first this many.
INSTANCES_SHOWN = 100
# A page expands at most this many mapped tasks at once.
MAX_EXPANDED = 10
# The calendar: this many whole weeks back from the current one (a year), Monday first.
CALENDAR_WEEKS = 53
# A task taking time now: its duration is counted to the present.
_GOING = frozenset({"RUNNING", "DEFERRED", "SENSING"})
# A run that has not ended, as the calendar colours its day.
_UNFINISHED = frozenset({"RUNNING", "QUEUED", "PAUSED"})


# A row of grid_task_rows, in its columns' order: run_id, task_id, state, attempt,
# max_attempts, started_at, ended_at, map_total, expand_from, id.
_TaskRow = tuple[str, str, str, int, int, float | None, float | None, int | None, object, int]


class BadRunKey(ValueError):
    """A page key that is not ``<created_at>,<run_id>``: its message says so in one line."""


@dataclass(frozen=True, slots=True, order=True)
class RunKey:
    """Where a page of runs starts: a run's creation time and id (ids break a tie)."""

    created_at: float
    run_id: str

    def text(self) -> str:
        """As a URL carries it: ``<created_at>,<run_id>`` (repr: the float read back exact)."""
        return f"{self.created_at!r},{self.run_id}"

    @classmethod
    def parse(cls, text: str) -> RunKey:
        at, comma, run_id = text.partition(",")
        try:
            created_at = float(at)
        except ValueError:
            created_at = math.nan
        if not comma or not run_id or not math.isfinite(created_at):
            raise BadRunKey(
                f"before must be <created_at>,<run_id> as the page's links give it, "
                f"not {text[:80]!r}"
            )
        return cls(created_at, run_id)


@_typed
@dataclass(frozen=True, slots=True)
class GridRun(_FromRow):
    """A run as a column of the grid."""

    run_id: str
    logical_date: str
    state: str
    created_at: float
    ended_at: float | None
    # what executor.runnames.logical_shown reads to name the run for people
    logical_time: str | None
    timezone: str | None
    data_interval_end: str | None

    @property
    def finished(self) -> bool:
        return self.state in RUN_TERMINAL

    @property
    def key(self) -> RunKey:
        return RunKey(self.created_at, self.run_id)


class GridCell(NamedTuple):
    """A task in a run: its state, when it started and ended (a mapped task: from its first
    instance's start to its last one's end), and a mapped task's instances by state.

    A named tuple, not a dataclass: a page reads 5,000 of them, and a frozen dataclass's
    construction (a guarded setattr per field) cost several times a tuple's."""

    run_id: str
    task_id: str
    state: str
    started_at: float | None
    ended_at: float | None
    attempt: int = 1
    max_attempts: int = 1
    map_index: int = -1
    counts: dict[str, int] | None = None  # None: not mapped; {}: mapped, not expanded yet

    @property
    def mapped(self) -> bool:
        return self.counts is not None

    def seconds(self, now: float) -> float | None:
        """How long it ran: so far while it runs (or waits in a sensor), else from its
        (last attempt's) start to its end; None if it never started."""
        if self.started_at is None:
            return None
        if self.state in _GOING:
            return max(0.0, now - self.started_at)
        if self.ended_at is not None:
            return max(0.0, self.ended_at - self.started_at)
        return None


@dataclass(slots=True)
class Grid:
    """A page of a DAG's runs (oldest first: left to right) and its tasks (top to bottom)."""

    dag_id: str
    dag: DagRow | None  # its catalogue row; None: run from a file, never catalogued
    shape: str | None  # its catalogued shape (JSON), for the task order
    runs: list[GridRun]
    tasks: list[str]
    cells: dict[tuple[str, str], GridCell]  # (run_id, task_id) -> its cell
    instances: dict[str, dict[tuple[str, int], GridCell]]  # expanded task -> (run, index)
    map_indexes: dict[str, list[int]]  # expanded task -> the indexes shown
    older: RunKey | None  # the key of the page of older runs; None: these are the oldest
    newer: RunKey | None  # the key of the page of newer runs (None: the newest page)
    at_newest: bool  # whether these are the newest runs (no page of newer ones)
    now: float
    max_active_runs: int | None = None  # the catalogue's; None: not catalogued
    file_mtime: float | None = None  # its file's mtime as the catalogue last parsed it
    mapped_tasks: frozenset[str] = frozenset()  # tasks mapped in a run shown

    @property
    def live(self) -> bool:
        """A run shown has not finished: the page goes on refreshing."""
        return any(not r.finished for r in self.runs)

    def mapped(self, task_id: str) -> bool:
        """Whether the task is mapped in a run shown (one cell for its instances)."""
        return task_id in self.mapped_tasks


@dataclass(frozen=True, slots=True)
class CalendarDay:
    day: str  # YYYY-MM-DD: a logical date
    states: dict[str, int]  # its runs by state

    @property
    def runs(self) -> int:
        return sum(self.states.values())

    @property
    def status(self) -> str:
        """failed (a run failed), running (one has not ended), success (all succeeded),
        other (cancelled ones, with or without successes), none (no run)."""
        if not self.states:
            return "none"
        if self.states.get("FAILED"):
            return "failed"
        if _UNFINISHED & self.states.keys():
            return "running"
        if set(self.states) == {"SUCCESS"}:
            return "success"
        return "other"


@dataclass(slots=True)
class Calendar:
    """A year of a DAG's runs by logical date: every day from ``start`` (a Monday) to
    ``end`` (today on the DAG's clock), those with runs in ``days``."""

    dag_id: str
    start: date
    end: date
    days: dict[str, CalendarDay] = field(default_factory=dict)

    def every_day(self) -> list[CalendarDay]:
        out = []
        day = self.start
        while day <= self.end:
            text = day.isoformat()
            out.append(self.days.get(text) or CalendarDay(text, {}))
            day += timedelta(days=1)
        return out


@dataclass(slots=True)
class DagPageView:
    grid: Grid
    calendar: Calendar | None


@_typed
@dataclass(frozen=True, slots=True)
class TaskRunTime(_FromRow):
    """One task in one of its DAG's runs: a bar of the task page's durations chart."""

    run_id: str
    logical_date: str
    logical_time: str | None
    timezone: str | None
    data_interval_end: str | None
    state: str
    started_at: float | None
    ended_at: float | None

    def seconds(self, now: float) -> float | None:
        """How long it ran (so far, if it runs); None if it never started."""
        if self.started_at is None:
            return None
        return (self.ended_at if self.ended_at is not None else now) - self.started_at


class Grids(Part):
    """A DAG's runs as a grid and a calendar: nothing here writes."""

    async def task_durations(
        self, run_id: str, task_id: str, map_index: int = -1, n: int = RUNS_SHOWN
    ) -> list[TaskRunTime]:
        """``task_id`` in the ``n`` newest runs of ``run_id``'s DAG, oldest first."""
        async with self.db.read() as tx:
            rows = await tx.fetch(
                "task_durations", run_id=run_id, task_id=task_id, map_index=map_index, n=n
            )
        return TaskRunTime.all(rows)[::-1]

    async def grid(
        self,
        dag_id: str,
        n: int = RUNS_SHOWN,
        before: RunKey | None = None,
        expand: Sequence[str] = (),
    ) -> Grid | None:
        """``n`` runs of ``dag_id`` (at most :data:`MAX_RUNS`), the newest or those created
        just before ``before``, and their tasks; None if the DAG is neither catalogued nor
        ever ran. ``expand``: mapped tasks to show one row per map index."""
        async with self.db.snapshot() as tx:
            return await self._grid(tx, dag_id, n, before, expand)

    async def calendar(self, dag_id: str) -> Calendar | None:
        """A year of ``dag_id``'s runs by logical date; None for an unknown DAG."""
        async with self.db.snapshot() as tx:
            dag = await tx.fetchone("grid_dag", dag_id=dag_id)
            if dag is None and await tx.fetchone("grid_dag_has_runs", dag_id=dag_id) is None:
                return None
            return await self._calendar(tx, dag_id, None if dag is None else dag["timezone"])

    async def dag_page(
        self,
        dag_id: str,
        n: int = RUNS_SHOWN,
        before: RunKey | None = None,
        expand: Sequence[str] = (),
        *,
        calendar: bool = True,
    ) -> DagPageView | None:
        """The grid and (``calendar``) the calendar of a DAG's page, in one read."""
        async with self.db.snapshot() as tx:
            grid = await self._grid(tx, dag_id, n, before, expand)
            if grid is None:
                return None
            cal = None
            if calendar:
                cal = await self._calendar(tx, dag_id, grid.dag.timezone if grid.dag else None)
        return DagPageView(grid, cal)

    async def _grid(
        self, tx: Tx, dag_id: str, n: int, before: RunKey | None, expand: Sequence[str]
    ) -> Grid | None:
        n = max(1, min(MAX_RUNS, n))
        now = self.clock()
        found = await tx.fetchone("grid_dag", dag_id=dag_id)
        dag = None if found is None else DagRow.of(found)
        if before is None:
            rows = await tx.fetch("grid_runs_newest", dag_id=dag_id, n=n + 1)
        else:
            rows = await tx.fetch(
                "grid_runs_before",
                dag_id=dag_id,
                before_at=before.created_at,
                before_id=before.run_id,
                n=n + 1,
            )
        if (
            dag is None
            and not rows
            and (before is None or await tx.fetchone("grid_dag_has_runs", dag_id=dag_id) is None)
        ):
            return None
        newest_first = GridRun.all(rows)
        older = newest_first[n - 1].key if len(newest_first) > n else None
        runs = list(reversed(newest_first[:n]))
        newer: RunKey | None = None
        at_newest = before is None
        if not at_newest:
            # The page of newer runs ends just before the (n+1)th run after the newest
            # shown; fewer than that after it: the newest page.
            start = runs[-1].key if runs else before
            assert start is not None
            after = await tx.fetch(
                "grid_runs_after",
                dag_id=dag_id,
                after_at=start.created_at,
                after_id=start.run_id,
                n=n + 1,
            )
            if len(after) > n:
                newer = RunKey(after[n]["created_at"], after[n]["run_id"])
        run_ids = [r.run_id for r in runs]
        cells: dict[tuple[str, str], GridCell] = {}
        first_seen: dict[str, tuple[int, int]] = {}
        instances: dict[str, dict[tuple[str, int], GridCell]] = {}
        map_indexes: dict[str, list[int]] = {}
        mapped_tasks: set[str] = set()  # tasks mapped in a run shown
        if run_ids:
            order = {run_id: i for i, run_id in enumerate(reversed(run_ids))}  # newest: 0
            spans: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
            starts: dict[tuple[str, str], float] = {}
            ends: dict[tuple[str, str], float] = {}
            for r in await tx.fetch("grid_mapped_counts", run_ids=run_ids):
                key = (r["run_id"], r["task_id"])
                spans[key][r["state"]] = r["n"]
                if r["started_at"] is not None:
                    starts[key] = min(starts.get(key, r["started_at"]), r["started_at"])
                if r["ended_at"] is not None:
                    ends[key] = max(ends.get(key, r["ended_at"]), r["ended_at"])
            # The rows unpacked by position (grid_task_rows' column order): a page reads
            # 5,000 of them, and a sqlite3.Row's lookup by name compares the names one by
            # one. Both drivers' rows (sqlite3.Row, asyncpg.Record) are sequences too.
            task_rows = cast(list[_TaskRow], await tx.fetch("grid_task_rows", run_ids=run_ids))
            for (
                run_id, task_id, state, attempt, max_attempts, started_at, ended_at, map_total,
                expand_from, row_id,
            ) in task_rows:  # fmt: skip
                key = (run_id, task_id)
                if map_total is not None or expand_from is not None:
                    counts = spans.get(key, {})
                    done = not (counts.keys() - TERMINAL) and state in TERMINAL
                    cells[key] = GridCell(
                        run_id, task_id, state, starts.get(key, started_at),
                        ends.get(key, ended_at) if done else None,
                        attempt, max_attempts, -1, dict(counts),
                    )  # fmt: skip
                    mapped_tasks.add(task_id)
                else:
                    cells[key] = GridCell(
                        run_id, task_id, state, started_at, ended_at, attempt, max_attempts
                    )
                seen = (order[run_id], row_id)
                first = first_seen.get(task_id)
                if first is None or seen < first:
                    first_seen[task_id] = seen
            for task_id in list(dict.fromkeys(expand))[:MAX_EXPANDED]:
                if not any(cells[(run_id, task_id)].mapped for run_id in run_ids
                           if (run_id, task_id) in cells):  # fmt: skip
                    continue
                got: dict[tuple[str, int], GridCell] = {}
                for r in await tx.fetch(
                    "grid_instances", run_ids=run_ids, task_id=task_id, n=INSTANCES_SHOWN
                ):
                    got[(r["run_id"], r["map_index"])] = GridCell(
                        r["run_id"], task_id, r["state"], r["started_at"], r["ended_at"],
                        r["attempt"], r["max_attempts"], r["map_index"],
                    )  # fmt: skip
                instances[task_id] = got
                map_indexes[task_id] = sorted({i for _, i in got})
        shape = None if found is None else found["shape"]
        tasks = task_order(shape, sorted(first_seen, key=first_seen.__getitem__))
        return Grid(
            dag_id, dag, shape, runs, tasks, cells, instances, map_indexes, older, newer,
            at_newest, now, None if found is None else found["max_active_runs"],
            None if found is None else found["file_mtime"],
            frozenset(mapped_tasks),
        )  # fmt: skip

    async def _calendar(self, tx: Tx, dag_id: str, timezone: str | None) -> Calendar:
        try:
            zone = ZoneInfo(timezone or "UTC")
        except (ZoneInfoNotFoundError, ValueError):
            zone = ZoneInfo("UTC")
        today = datetime.fromtimestamp(self.clock(), zone).date()
        start = today - timedelta(days=today.weekday(), weeks=CALENDAR_WEEKS - 1)
        cal = Calendar(dag_id, start, today)
        states: dict[str, dict[str, int]] = defaultdict(dict)
        for r in await tx.fetch(
            "grid_calendar", dag_id=dag_id, since=start.isoformat(), until=today.isoformat()
        ):
            day = str(r["day"])[:10]
            states[day][r["state"]] = states[day].get(r["state"], 0) + r["n"]
        cal.days = {day: CalendarDay(day, s) for day, s in states.items()}
        return cal


def task_order(shape: str | None, seen: Sequence[str]) -> list[str]:
    """The grid's rows: the catalogued shape's tasks in topological order (parents before
    children, otherwise as declared), then any task the runs have that the shape does not
    (a task since removed), in the order they first appear; without a shape, ``seen``."""
    if not shape:
        return list(seen)
    try:
        tasks, _, _ = shape_parts(shape)
    except (ValueError, TypeError, KeyError):
        return list(seen)
    index = {t.task_id: i for i, t in enumerate(tasks)}
    children: dict[int, list[int]] = defaultdict(list)
    waiting = [0] * len(tasks)
    for i, t in enumerate(tasks):
        for p in set(t.parents):
            if p in index:
                children[index[p]].append(i)
                waiting[i] += 1
    # Kahn's order, the first ready task as declared each time: parents before children,
    # and a DAG declared in order keeps its order.
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    ordered: list[str] = []
    while ready:
        i = heapq.heappop(ready)
        ordered.append(tasks[i].task_id)
        for c in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, c)
    # A stored shape has no cycle; if one had, its tasks would still get rows, as declared.
    placed = set(ordered)
    ordered += [t.task_id for t in tasks if t.task_id not in placed]
    return ordered + [t for t in seen if t not in index]
