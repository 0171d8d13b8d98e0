"""The web page's routes: read-only GETs over the store, HTML rendered on the server.

/                                       runs, waiting tasks, triggerers
/dags                                   the catalogued DAGs, their newest runs, broken files
/runs/{run_id}                          the run's tasks as a graph and a table
/runs/{run_id}/tasks/{task_id}          a task: attempts, wait, log (a mapped task: instances)
/runs/{run_id}/tasks/{task_id}/{index}  one instance of a mapped task
/api/status                             what `slotless status --json` prints
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from html import escape

from aiohttp import web

from executor.store import Store

from ..status import collect
from . import pages

log = logging.getLogger("slotless.web")

STORE = web.AppKey("store", Store)
SETTINGS = web.AppKey("settings", dict)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(store: Store, *, db_label: str = "", refresh: float = 2.0) -> web.Application:
    app = web.Application(middlewares=[_errors])
    app[STORE] = store
    app[SETTINGS] = {"db": db_label or store.url, "refresh": refresh, "runs": 50}
    app.router.add_get("/", index)
    app.router.add_get("/dags", dags)
    app.router.add_get("/runs/{run_id}", run)
    app.router.add_get("/runs/{run_id}/tasks/{task_id}", task)
    app.router.add_get(r"/runs/{run_id}/tasks/{task_id}/{index:\d+}", task)
    app.router.add_get("/api/status", api_status)
    return app


def _html(
    request: web.Request, title: str, main: str, live: bool, status: int = 200
) -> web.Response:
    s = request.app[SETTINGS]
    body = pages.page(title, main, live=live, db=s["db"], refresh=s["refresh"])
    return web.Response(
        text=body, status=status, content_type="text/html", headers={"Cache-Control": "no-store"}
    )


async def index(request: web.Request) -> web.Response:
    store = request.app[STORE]
    try:
        limit = max(1, min(1000, int(request.query.get("limit", request.app[SETTINGS]["runs"]))))
    except ValueError:
        raise web.HTTPBadRequest(text="limit must be a number") from None
    data = await collect(store, limit)
    main, live = pages.index(data)
    return _html(request, "runs", main, live)


async def dags(request: web.Request) -> web.Response:
    main, live = pages.dags_page(await request.app[STORE].dags_page())
    return _html(request, "DAGs", main, live)


async def run(request: web.Request) -> web.Response:
    store = request.app[STORE]
    run_id = request.match_info["run_id"]
    g = await store.run_graph(run_id)
    if g is None:
        return _not_found(request, f"There is no run {run_id!r}.")
    main, live = pages.run_page(g, store.clock())
    return _html(request, run_id, main, live)


async def task(request: web.Request) -> web.Response:
    store = request.app[STORE]
    run_id = request.match_info["run_id"]
    task_id = request.match_info["task_id"]
    index = int(request.match_info.get("index", -1))
    d = await store.task_detail(run_id, task_id, index)
    if d is None:
        if await store.run_info(run_id) is None:
            return _not_found(request, f"There is no run {run_id!r}.")
        name = pages.task_name(task_id, index)
        return _not_found(request, f"Run {run_id!r} has no task {name!r}.")
    main, live = pages.task_page(d, store.clock())
    return _html(request, f"{pages.task_name(task_id, index)} - {run_id}", main, live)


async def api_status(request: web.Request) -> web.Response:
    return web.json_response(await collect(request.app[STORE], 50))


def _not_found(request: web.Request, what: str) -> web.Response:
    return _html(request, "not found", pages.not_found(what), False, status=404)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _not_found(request, f"There is no page {request.path!r}.")
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("error serving %s", request.path)
        main = f'<h1>Error</h1><p class="warn">{escape(type(exc).__name__)}: {escape(str(exc))}</p>'
        return _html(request, "error", main, False, status=500)
