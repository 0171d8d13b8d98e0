"""The web page's routes: GETs over the store, HTML rendered on the server; writes only as
POSTs from a signed-in operator (:mod:`.auth`), each one an action (:mod:`.actions`).

GET  /                                       runs, waiting tasks, triggerers
GET  /dags                                   the catalogued DAGs, their newest runs, broken files
GET  /runs/{run_id}                          the run's tasks as a graph and a table
GET  /runs/{run_id}/tasks/{task_id}          a task: attempts, wait, log (mapped: instances)
GET  /runs/{run_id}/tasks/{task_id}/{index}  one instance of a mapped task
GET  /api/live/<any page above>              that page's live blocks, as JSON (the live poll)
GET  /needs-you                              requests waiting for a person's answer (people.py)
GET  /api/status                             what `slotless status --json` prints
GET  /login, POST /login, POST /logout       signing in with the operator's token, and out
POST /actions/{name}                         a write: pause, unpause, trigger, ... (actions.py)
*    /api/v1/...                                 the JSON API, bearer tokens (api.py)

GET never writes. Every POST is refused (403, one log line, nothing changed) unless the page
has a token, the request's session is signed in and its form's CSRF token is good.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from executor.store import Store

from ..roles import needs, refusal
from ..status import collect
from ..views import task_name
from . import graph, logs_page, pages
from . import people as people_page
from .actions import ACTIONS, PENDING, Act, Refused, audit, page_action
from .api import MAX_BODY, add_api
from .auth import Auth, Session, clear_cookie, csrf_ok, set_cookie
from .keys import AUTH, LIVE, NEEDS, SETTINGS, STORE
from .numbers import whole_number
from .render import View, environment
from .respond import polled, respond
from .sections import SECTIONS

log = logging.getLogger("slotless.web")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(
    store: Store,
    *,
    db_label: str = "",
    refresh: float = 2.0,
    token: str | None = None,
    parse_timeout: float = 30.0,
) -> web.Application:
    """The page over ``store``; with ``token``, an operator who signs in with it may write."""
    # The JSON API's batches of events are larger than aiohttp's default 1 MiB body.
    app = web.Application(middlewares=[_errors, _needs_count], client_max_size=MAX_BODY)
    app[STORE] = store
    app[AUTH] = Auth(token)
    app[SETTINGS] = {
        "db": db_label or store.url,
        "refresh": refresh,
        "runs": 50,
        "parse_timeout": parse_timeout,
    }
    for path, handler in (
        ("/", index),
        ("/dags", dags),
        ("/runs/{run_id}", run),
        ("/runs/{run_id}/tasks/{task_id}", task),
        (r"/runs/{run_id}/tasks/{task_id}/{index:\d+}", task),
    ):
        app.router.add_get(path, handler)
        app.router.add_get(LIVE + path, handler)  # the page's live blocks, as JSON
    app.router.add_get("/needs-you", needs_you)  # not live: a person types into its forms
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_post("/actions/{name}", act)
    add_api(app, store, app[AUTH], parse_timeout)  # /api/v1: api.py
    for add_routes in SECTIONS:  # the pages built on render.py, each adding its routes
        add_routes(app)
    environment()  # every template compiled now, before serving: never on the loop
    return app


# A filter given to the run list (the DAG page's calendar links /?dag=X&from=D&to=D) is
# the runs page's: the URL keeps its query there, so a shared link still filters.
RUN_FILTERS = ("dag", "state", "type", "from", "to", "q")


async def index(request: web.Request) -> web.Response:
    if not polled(request) and any(k in request.query for k in RUN_FILTERS):
        raise web.HTTPSeeOther(f"/runs?{request.query_string}")
    try:
        limit = max(1, min(1000, int(request.query.get("limit", request.app[SETTINGS]["runs"]))))
    except ValueError:
        raise web.HTTPBadRequest(text="limit must be a number") from None
    return respond(request, pages.index_view(await collect(request.app[STORE], limit)))


async def dags(request: web.Request) -> web.Response:
    w = request.app[AUTH].writes(request)
    kept = dict(w.session.form) if w.session is not None else {}  # read before it is cleared
    data = await request.app[STORE].views.dags_page()
    view = pages.dags_view(data, w.session is not None, kept, request.query.get("trigger", ""))
    return respond(request, view)


async def run(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    try:
        fold = graph.parse_fold(request.query.getall("fold", []))
    except ValueError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    g = await request.app[STORE].views.run_graph(run_id)
    if g is None:
        return _not_found(request, f"There is no run {run_id!r}.")
    return respond(request, pages.run_view(g, fold))


async def task(request: web.Request) -> web.Response:
    store = request.app[STORE]
    run_id = request.match_info["run_id"]
    task_id = request.match_info["task_id"]
    index = whole_number(request.match_info.get("index", "-1"), low=-1)
    if index is None:
        return _not_found(request, f"There is no task instance {request.match_info['index']!r}.")
    d = await store.views.task_detail(run_id, task_id, index)
    if d is None:
        if await store.views.run_info(run_id) is None:
            return _not_found(request, f"There is no run {run_id!r}.")
        name = task_name(task_id, index)
        return _not_found(request, f"Run {run_id!r} has no task {name!r}.")
    view = pages.task_view(d)
    if not polled(request):  # outside the live block: the log viewer is drawn once, then fed
        view.ctx["log"] = await logs_page.read_log_stream(store, run_id, task_id, index)
        times = await store.grids.task_durations(run_id, task_id, index)
        view.ctx["durations"] = pages.durations(times, task_id, index, store.clock())
    return respond(request, view)


async def needs_you(request: web.Request) -> web.Response:
    """Requests waiting for a person's answer (people.py), each with its form."""
    store = request.app[STORE]
    count, requests = await store.answers.needs_you()
    request[NEEDS] = count  # the header's count from the same read as the list
    w = request.app[AUTH].writes(request)
    kept = dict(w.session.form) if w.session is not None else {}
    return respond(request, people_page.needs_you_view(count, requests, w, store.clock(), kept))


async def api_status(request: web.Request) -> web.Response:
    return web.json_response((await collect(request.app[STORE], 50)).to_json())


# -- writes ------------------------------------------------------------------------------


async def login_form(request: web.Request) -> web.Response:
    view = pages.login_view(request.app[AUTH].enabled, _back(request.query.get("back")))
    return respond(request, view)


async def login(request: web.Request) -> web.Response:
    auth = request.app[AUTH]
    form = await request.post()
    given = form.get("token")
    session = auth.login(given) if isinstance(given, str) else None
    if session is None:
        why = "writes are off (no token)" if not auth.enabled else "wrong token"
        return _refused(request, why, pages.login_view(auth.enabled, "/", wrong=auth.enabled))
    session.flash = ("ok", f"signed in as {session.who}, {session.role.article}")
    response = web.HTTPSeeOther(_back(form.get("back")))
    set_cookie(response, request, session)
    raise response  # raised, not returned: aiohttp deprecates returning an HTTPException


async def logout(request: web.Request) -> web.Response:
    session = await _checked(request)
    if isinstance(session, web.Response):
        return session
    request.app[AUTH].logout(session)
    response = web.HTTPSeeOther("/")
    clear_cookie(response)
    raise response


async def act(request: web.Request) -> web.Response:
    """``POST /actions/<name>``: checked (:func:`_checked`: signed in, the CSRF token, the
    session's role against the action's), the action's handler run, its audit row written,
    then a 303 back to the page the form was on, its message flashed there."""
    session = await _checked(request)
    if isinstance(session, web.Response):
        return session
    name = request.match_info["name"]
    handler = ACTIONS.get(name)
    if handler is None:
        raise web.HTTPNotFound()
    form = await request.post()
    store = request.app[STORE]
    request.pop(PENDING, None)  # recorded here, with the handler's message
    a = Act(request, store, form, request.app[SETTINGS]["parse_timeout"], session.who,
            session.role)  # fmt: skip
    try:
        session.flash, session.form = ("ok", await handler(a)), {}
    except Refused as exc:
        session.flash = ("error", str(exc))
        kept = {k: v for k, v in form.items() if isinstance(v, str) and k != "csrf"}
        session.form = kept | {"action": name}
        if isinstance(exc, people_page.AnswerRefused):  # drawn beside the field it is about
            session.form |= {"error_field": exc.field, "error": str(exc)}
    except Exception as exc:
        log.exception("action %s failed", name)
        session.flash = ("error", f"{name} failed: {type(exc).__name__}: {exc}")
    kind, said = session.flash
    await audit(store, session.who, session.role, name, form, kind, said)
    raise web.HTTPSeeOther(_back(form.get("back")))


async def _checked(request: web.Request) -> Session | web.Response:
    """The signed-in session of a POST whose CSRF token is good for its path and whose role
    may do its action (:func:`.actions.page_action`: every page write passes here, the
    actions and the trigger form alike); otherwise the 403 to answer (one log line, and for
    a role too low an audit row), before anything is done. A write let through is recorded
    in the audit list once its answer is known (:func:`.actions.record_pending`), unless
    its handler recorded it (``act`` does, with its message)."""
    auth = request.app[AUTH]
    if not auth.enabled:
        return _refused(request, "writes are off (no token)")
    session = auth.session(request)
    if session is None:
        return _refused(request, "not signed in")
    form = await request.post()
    given = form.get("csrf")
    if not isinstance(given, str) or not csrf_ok(session, request.path, given):
        return _refused(request, "missing or wrong CSRF token")
    action = page_action(request)
    if session.role < needs(action):
        why = refusal(action, session.who, session.role)
        await audit(request.app[STORE], session.who, session.role, action, form, "refused",
                    why, request.match_info)  # fmt: skip
        return _refused(request, why)
    if action != "logout":
        request[PENDING] = (session, action)
    return session


def _refused(request: web.Request, why: str, view: View | None = None) -> web.Response:
    log.warning("refused %s %s from %s: %s", request.method, request.path, request.remote, why)
    return respond(request, view or pages.forbidden_view(why), status=403)


def _back(path: object) -> str:
    """Where to go after a form: a path on this site, never another site's URL."""
    if (
        isinstance(path, str)
        and path.startswith("/")
        and not path.startswith(("//", "/\\"))
        and path.isprintable()
    ):
        return path
    return "/"


def _not_found(request: web.Request, what: str) -> web.Response:
    return respond(request, View("not_found.html", "not found", {"what": what}), status=404)


@web.middleware
async def _needs_count(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The header's "Needs you" count, on every HTML page (one indexed count)."""
    if request.method == "GET" and not request.path.startswith("/api/"):
        try:
            count, _ = await request.app[STORE].answers.needs_you(limit=0)
            request[NEEDS] = count
        except Exception:  # the page still shows without its count
            log.exception("counting the requests that need a person")
    return await handler(request)


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
        return respond(request, pages.error_view(exc), status=500)
