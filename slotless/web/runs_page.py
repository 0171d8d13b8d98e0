"""The runs list and a run's Gantt chart, as pages.

GET /runs                  runs filtered by DAG, state, type, logical date, text; keyset pages
GET /runs/{run_id}/gantt   a run's tasks on one time axis, a segment per state and attempt

Both are :class:`~.render.View`\\ s (templates runs.html, gantt.html with _gantt.html): the
live poll (``/api/live`` + the same URL) renders their ``live_*`` blocks again. The filter
is the URL's query (:mod:`.runs_query`): a filtered list is a link to share. A bad value is
a 400 page naming the field, with the form to fix it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from executor.runnames import RUN_TYPES
from executor.store.runlist import RUN_STATES, BadFilter

from .gantt import layout
from .keys import LIVE, STORE
from .render import View
from .respond import respond
from .runs_query import read_query

RUNS = "/runs"


def add_routes(app: web.Application) -> None:
    for path, handler in ((RUNS, runs), ("/runs/{run_id}/gantt", gantt)):
        app.router.add_get(path, handler)
        app.router.add_get(LIVE + path, handler)


def _form(request: web.Request, values: dict[str, Any]) -> dict[str, Any]:
    """The filter form's choices and current values."""
    return {"form": values, "all_states": RUN_STATES, "all_types": RUN_TYPES, "path": RUNS}


async def runs(request: web.Request) -> web.Response:
    try:
        asked = read_query(request.query)
        page = await request.app[STORE].runlist.runs_page(
            asked.which, limit=asked.limit, before=asked.before, after=asked.after, dag_ids=True
        )
    except BadFilter as exc:
        # What was typed stays in the form, to be corrected.
        q = request.query
        typed: dict[str, Any] = {
            k: q.getall(k) if k in ("dag", "state", "type") else q.get(k) for k in q
        }
        ctx = {**_form(request, typed), "error": str(exc), "field": exc.field, "page": None,
               "asked": None, "dag_ids": []}  # fmt: skip
        return respond(request, View("runs.html", "runs", ctx), status=400)
    ctx = {**_form(request, asked.values()), "error": None, "field": None, "page": page,
           "asked": asked, "dag_ids": page.dag_ids}  # fmt: skip
    return respond(request, View("runs.html", "runs", ctx, live=page.live))


async def gantt(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    g = await request.app[STORE].runlist.gantt(run_id)
    if g is None:
        what = f"There is no run {run_id[:200]!r}."
        return respond(request, View("not_found.html", "not found", {"what": what}), status=404)
    ctx = {"chart": layout(g)}
    return respond(request, View("gantt.html", f"{run_id} Gantt", ctx, live=g.live))
