"""The JSON API of a DAG's page: ``GET /api/v1/dags/{dag_id}/grid`` (its runs and their
tasks' states, paged by keyset as the page pages them) and ``GET /api/v1/dags/{dag_id}/
calendar`` (a year of its runs by logical date). Registered with :func:`.api.route` on
import (:mod:`.sections` imports this module), so both are in the OpenAPI document.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from executor.store.grid import MAX_RUNS, RUNS_SHOWN, GridCell
from triggers.limits import storable_text

from .api import ApiError, Call, route
from .dag_page import BadQuery, parse_query


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GridRunOut(_Out):
    """A run: a column of the grid."""

    run_id: str
    logical_date: str
    state: str
    created_at: float
    ended_at: float | None


class GridCellOut(_Out):
    """A task in a run. A mapped task: its instances by state in ``instances``, its
    start and end those of its first and last instance."""

    run_id: str
    state: str
    started_at: float | None
    ended_at: float | None
    seconds: float | None  # how long it ran (so far, while it runs); None: never started
    attempt: int
    instances: dict[str, int] | None = None


class GridTaskOut(_Out):
    """A task: a row of the grid, one cell per run in ``runs``' order (null: the run has
    no such task)."""

    task_id: str
    mapped: bool
    cells: list[GridCellOut | None]


class GridOut(_Out):
    """A page of a DAG's runs, oldest first, and its tasks in topological order.
    ``older`` / ``newer``: the ``before`` value of the next page back / forward (null:
    none; ``newer`` is "" when the next page forward is the newest)."""

    dag_id: str
    catalogued: bool
    runs: list[GridRunOut]
    tasks: list[GridTaskOut]
    older: str | None
    newer: str | None
    live: bool


class CalendarDayOut(_Out):
    day: str
    runs: int
    states: dict[str, int]
    status: str  # success, failed, running, other


class CalendarOut(_Out):
    """A DAG's runs of the last year by logical date (the date on the DAG's clock):
    every day from ``start`` (a Monday) to ``end`` (today) that has runs."""

    dag_id: str
    basis: str
    start: str
    end: str
    days: list[CalendarDayOut]


def _cell(c: GridCell, now: float) -> GridCellOut:
    return GridCellOut(
        run_id=c.run_id, state=c.state, started_at=c.started_at, ended_at=c.ended_at,
        seconds=c.seconds(now), attempt=c.attempt, instances=c.counts,
    )  # fmt: skip


def _dag_id(call: Call) -> str:
    dag_id = call.param("dag_id")
    if not storable_text(dag_id):
        raise ApiError(404, f"there is no DAG {dag_id[:200]!r}", "dag_id")
    return dag_id


@route(
    "GET", "/dags/{dag_id}/grid",
    summary="A DAG's runs (a page of them, by keyset) and each task's state in each",
    response=GridOut, errors=(400, 404),
    query={
        "runs": f"how many runs (default {RUNS_SHOWN}; more than {MAX_RUNS} reads as {MAX_RUNS})",
        "before": "<created_at>,<run_id>: the runs created before that one (a page's older)",
    },
)  # fmt: skip
async def dag_grid(call: Call) -> tuple[int, BaseModel]:
    dag_id = _dag_id(call)
    try:
        q = parse_query(call.request.query)
    except BadQuery as exc:
        raise ApiError(400, str(exc), exc.field) from None
    grid = await call.store.grids.grid(dag_id, q.runs, q.before)
    if grid is None:
        raise ApiError(404, f"there is no DAG {dag_id!r}", "dag_id")
    tasks = []
    for task_id in grid.tasks:
        cells = [grid.cells.get((r.run_id, task_id)) for r in grid.runs]
        tasks.append(GridTaskOut(
            task_id=task_id, mapped=grid.mapped(task_id),
            cells=[None if c is None else _cell(c, grid.now) for c in cells],
        ))  # fmt: skip
    newer = None
    if not grid.at_newest:
        newer = "" if grid.newer is None else grid.newer.text()
    return 200, GridOut(
        dag_id=dag_id, catalogued=grid.dag is not None,
        runs=[GridRunOut(run_id=r.run_id, logical_date=r.logical_date, state=r.state,
                         created_at=r.created_at, ended_at=r.ended_at) for r in grid.runs],
        tasks=tasks, older=None if grid.older is None else grid.older.text(), newer=newer,
        live=grid.live,
    )  # fmt: skip


@route(
    "GET", "/dags/{dag_id}/calendar",
    summary="A DAG's runs of the last year, counted by logical date and state",
    response=CalendarOut, errors=(404,),
)  # fmt: skip
async def dag_calendar(call: Call) -> tuple[int, BaseModel]:
    dag_id = _dag_id(call)
    cal = await call.store.grids.calendar(dag_id)
    if cal is None:
        raise ApiError(404, f"there is no DAG {dag_id!r}", "dag_id")
    days = [
        CalendarDayOut(day=d.day, runs=d.runs, states=d.states, status=d.status)
        for d in sorted(cal.days.values(), key=lambda d: d.day)
    ]
    return 200, CalendarOut(
        dag_id=dag_id, basis="logical_date", start=cal.start.isoformat(),
        end=cal.end.isoformat(), days=days,
    )  # fmt: skip
