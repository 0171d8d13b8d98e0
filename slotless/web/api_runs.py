"""The runs list and a run's Gantt segments in the JSON API (``/api/v1``), registered with
:func:`.api.route` so that they are in the OpenAPI document.

GET /api/v1/runs                  the runs list: the page's filters and cursors (runs_query.py)
GET /api/v1/runs/{run_id}/gantt   a run's tasks and their segments (executor/store/runlist.py)

Imported by :mod:`.sections`, before the app mounts the API.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from executor.runnames import RUN_TYPES
from executor.store.runlist import DEFAULT_PAGE, MAX_PAGE, RUN_STATES, BadFilter, GanttRow

from .api import ApiError, Call, route
from .runs_query import read_query


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListedRunOut(_Out):
    run_id: str
    dag_id: str
    logical_date: str
    logical: str  # the logical time as people read it: 2026-11-26 06:00 on the DAG's clock
    run_type: str | None  # None: written by a release before run types
    run_key: str | None
    state: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    tasks: dict[str, int]  # task instances by state


class RunsOut(_Out):
    """A page of runs, newest first; ``older``/``newer``: the cursor to pass as ``before``
    / ``after`` for the page beside it (null: none)."""

    runs: list[ListedRunOut]
    older: str | None
    newer: str | None


class SegmentOut(_Out):
    kind: str  # queued, running, deferred, sensing, retrying
    start: float
    end: float  # the time it was read, when open
    attempt: int | None  # a running segment's attempt
    open: bool
    ended_as: str | None


class GanttRowOut(_Out):
    task_id: str
    map_index: int
    state: str
    attempt: int
    max_attempts: int
    segments: list[SegmentOut]


class GanttTaskOut(GanttRowOut):
    map_total: int | None
    instances: list[GanttRowOut]
    instances_hidden: int  # instances of a mapped task beyond those listed


class GanttOut(_Out):
    run_id: str
    dag_id: str
    state: str
    start: float
    end: float
    now: float
    tasks: list[GanttTaskOut]


_FILTERS = {
    "dag": "runs of this DAG (repeat for several)",
    "state": f"runs in this state (repeat): {' '.join(RUN_STATES)}",
    "type": f"runs of this type (repeat): {' '.join(RUN_TYPES)}",
    "from": "logical date on or after this day (YYYY-MM-DD)",
    "to": "logical date on or before this day (YYYY-MM-DD)",
    "q": "text in the run id or run key (case-insensitive, taken literally)",
    "limit": f"runs per page (1-{MAX_PAGE}, default {DEFAULT_PAGE})",
    "before": "the older page: a response's `older`",
    "after": "the newer page: a response's `newer`",
}


@route("GET", "/runs", summary="Runs, newest first, filtered and paged by cursor",
       response=RunsOut, errors=(400,), query=_FILTERS)  # fmt: skip
async def list_runs(call: Call) -> tuple[int, BaseModel]:
    try:
        asked = read_query(call.request.query)
        page = await call.store.runlist.runs_page(
            asked.which, limit=asked.limit, before=asked.before, after=asked.after
        )
    except BadFilter as exc:
        raise ApiError(400, str(exc), exc.field) from None
    return 200, RunsOut(
        runs=[
            ListedRunOut(
                run_id=r.run_id, dag_id=r.dag_id, logical_date=r.logical_date, logical=r.logical,
                run_type=r.run_type, run_key=r.run_key, state=r.state, created_at=r.created_at,
                started_at=r.started_at, ended_at=r.ended_at, tasks=r.counts,
            )
            for r in page.runs
        ],
        older=page.older.text() if page.older else None,
        newer=page.newer.text() if page.newer else None,
    )  # fmt: skip


def _row(r: GanttRow) -> dict[str, object]:
    return {
        "task_id": r.task_id, "map_index": r.map_index, "state": r.state, "attempt": r.attempt,
        "max_attempts": r.max_attempts,
        "segments": [SegmentOut(kind=s.kind, start=s.start, end=s.end, attempt=s.attempt,
                                open=s.open, ended_as=s.ended_as) for s in r.segments],
    }  # fmt: skip


@route("GET", "/runs/{run_id}/gantt", summary="A run's tasks as Gantt segments, per state "
       "and attempt", response=GanttOut, errors=(404,))  # fmt: skip
async def run_gantt(call: Call) -> tuple[int, BaseModel]:
    run_id = call.param("run_id")
    g = await call.store.runlist.gantt(run_id)
    if g is None:
        raise ApiError(404, f"there is no run {run_id[:200]!r}", "run_id")
    return 200, GanttOut(
        run_id=g.run_id, dag_id=g.dag_id, state=g.state, start=g.start, end=g.end, now=g.now,
        tasks=[
            GanttTaskOut(**_row(t.row), map_total=t.row.map_total,
                         instances=[GanttRowOut(**_row(i)) for i in t.instances],
                         instances_hidden=t.hidden)
            for t in g.tasks
        ],
    )  # fmt: skip
