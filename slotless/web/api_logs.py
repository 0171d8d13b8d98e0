"""``GET /api/v1/runs/{run_id}/tasks/{task_id}/log``: a task's log after a cursor.

A reader keeps the ``next`` it was given and passes it back as ``since``; it gets the
entries after it, oldest first, at most ``limit``, and a new ``next``. The cursor is an
entry's id, never a time: lines written in the same millisecond are each returned once
(see executor/store/loglines.py for why none is skipped on PostgreSQL either). ``more``
says a page was cut at ``limit``: ask again at once. ``finished`` says the task has ended;
one more read after it returns whatever was written with its end.

The web page's log viewer polls this (templates/_logstream_js.html); it is read-only.
"""

from __future__ import annotations

from pydantic import BaseModel

from executor.store.loglines import MAX_PAGE, LogPage
from triggers.limits import storable_text

from .api import ApiError, Call, route

DEFAULT_LIMIT = 1000


class LogEntryOut(BaseModel):
    id: int  # the cursor after this entry
    ts: float  # epoch seconds
    kind: str  # transition, log, check, error
    attempt: int | None
    from_state: str | None = None  # a transition's
    to_state: str | None = None
    message: str


class LogOut(BaseModel):
    run_id: str
    task_id: str
    map_index: int  # -1: not a mapped instance
    state: str  # the task's state when read
    finished: bool  # the task has ended: its log grows no more unless it runs again
    entries: list[LogEntryOut]
    next: int  # pass it back as ?since= for the entries after these
    more: bool  # the page was cut at limit: more entries are there already


_QUERY = {
    "since": "the cursor: the `next` of the previous read (0 or none: from the start)",
    "limit": f"at most this many entries (1 to {MAX_PAGE}, {DEFAULT_LIMIT} by default)",
}


@route("GET", "/runs/{run_id}/tasks/{task_id}/log", summary="A task's log after a cursor",
       response=LogOut, query=_QUERY, errors=(400, 404))  # fmt: skip
async def task_log(call: Call) -> tuple[int, LogOut]:
    return 200, await _read(call, -1)


@route("GET", "/runs/{run_id}/tasks/{task_id}/{map_index}/log",
       summary="A mapped task instance's log after a cursor",
       response=LogOut, query=_QUERY, errors=(400, 404))  # fmt: skip
async def instance_log(call: Call) -> tuple[int, LogOut]:
    text = call.param("map_index")
    if not text.isdigit() or len(text) > 9:
        raise ApiError(400, "map_index must be a whole number (an instance's index)", "map_index")
    return 200, await _read(call, int(text))


def int_query(call: Call, name: str, default: int, low: int, high: int) -> int:
    text = call.request.query.get(name)
    if text is None or text == "":
        return default
    # A cursor is an id: a whole number, at most 18 digits (a PostgreSQL bigint).
    if not (text.isdigit() and len(text) <= 18):
        raise ApiError(400, f"{name} must be a whole number", name)
    value = int(text)
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}", name)
    return value


async def _read(call: Call, map_index: int) -> LogOut:
    run_id, task_id = call.param("run_id"), call.param("task_id")
    since = int_query(call, "since", 0, 0, 10**18)
    limit = int_query(call, "limit", DEFAULT_LIMIT, 1, MAX_PAGE)
    page: LogPage | None = None
    if storable_text(run_id) and storable_text(task_id):
        page = await call.store.loglines.after(run_id, task_id, map_index, since, limit)
    if page is None:
        if not storable_text(run_id) or await call.store.views.run_info(run_id) is None:
            raise ApiError(404, f"there is no run {run_id[:200]!r}", "run_id")
        name = task_id if map_index < 0 else f"{task_id}[{map_index}]"
        raise ApiError(404, f"run {run_id!r} has no task {name[:200]!r}", "task_id")
    return log_out(run_id, task_id, map_index, page)


def log_out(run_id: str, task_id: str, map_index: int, page: LogPage) -> LogOut:
    entries = [
        LogEntryOut(id=e.id, ts=e.ts, kind=e.kind, attempt=e.attempt,
                    from_state=e.from_state, to_state=e.to_state, message=e.message)
        for e in page.entries
    ]  # fmt: skip
    return LogOut(run_id=run_id, task_id=task_id, map_index=map_index, state=page.state,
                  finished=page.finished, entries=entries, next=page.cursor,
                  more=page.more)  # fmt: skip
