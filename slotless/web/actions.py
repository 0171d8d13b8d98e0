"""The page's writes: one small handler per action, served as ``POST /actions/<name>``.

:func:`app.act` does everything they share before a handler runs (writes enabled, a
signed-in session, the form's CSRF token for ``/actions/<name>``, the session's role at
least the one :data:`slotless.roles.NEEDS` gives the action; any failure is a 403 and one
log line) and after it (the audit row, :func:`audit`; a 303 back to the form's ``back``
path, with the handler's message flashed there). A handler only reads its form fields,
calls the store, and returns the message to show, or raises :class:`Refused` with one that
says what was wrong (shown as an error; nothing may have changed).

To add one, e.g. a run's "clear" button::

    @action("clear")
    async def clear(a: Act) -> str:
        n = await a.store.clear_run(a.field("run_id"))  # whatever the store offers
        return f"cleared {n} tasks"

give it its line in :data:`slotless.roles.NEEDS` (without one it needs ``admin``), and draw
its form on a page with ``pages.action_form(w, "clear", {"run_id": ...}, "clear")`` (drawn
only for a session whose role may use it: ``Writes.can``).

What a handler does is recorded under the session's token name (``who=a.who`` to the
store: the task and run log says ``cleared by alice``) and in the audit list, by
:func:`audit`, right after the handler returns (the store's operations open their own
transactions).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy

from executor.loader import DagImportError
from executor.params import BadConf, parse_conf
from executor.store import Store
from executor.store.catalogue import UnknownDag
from executor.store.control import ControlError, Done

from ..roles import Role
from ..trigger import DagPaused, trigger_run
from .keys import STORE

log = logging.getLogger("slotless.web")


class Refused(ValueError):
    """The action was refused (a bad conf, a paused DAG, an unknown id): its message is
    shown on the page as an error, and the form's fields are kept for the next attempt."""


@dataclass(frozen=True)
class Act:
    """One POST to an action: its form, the store, and the page's settings."""

    request: web.Request
    store: Store
    form: MultiDictProxy[Any]
    parse_timeout: float
    who: str = "operator"  # the signed-in session's token name
    role: Role = Role.OPERATOR  # and its role

    @property
    def name(self) -> str:
        """The action's name, from its path (``/actions/<name>``)."""
        return self.request.match_info.get("name", "")

    def field(self, name: str, default: str | None = None) -> str:
        value = self.form.get(name, default)
        if not isinstance(value, str):
            raise Refused(f"the form has no {name!r}")
        return value


ActionHandler = Callable[[Act], Awaitable[str]]
ACTIONS: dict[str, ActionHandler] = {}


def action(name: str) -> Callable[[ActionHandler], ActionHandler]:
    """Register ``POST /actions/<name>``."""

    def register(handler: ActionHandler) -> ActionHandler:
        assert name not in ACTIONS, f"action {name!r} registered twice"
        ACTIONS[name] = handler
        return handler

    return register


# -- the DAGs page -----------------------------------------------------------------------


async def _set_paused(a: Act, paused: bool) -> str:
    dag_id = a.field("dag_id")
    try:
        await a.store.catalogue.set_paused(dag_id, paused)
    except UnknownDag as exc:
        raise Refused(str(exc)) from None
    return f"{dag_id} {'paused' if paused else 'unpaused'}"


@action("pause")
async def pause(a: Act) -> str:
    return await _set_paused(a, True)


@action("unpause")
async def unpause(a: Act) -> str:
    return await _set_paused(a, False)


@action("trigger")
async def trigger(a: Act) -> str:
    """A run of a catalogued DAG, its conf checked as ``slotless trigger`` checks it."""
    dag_id = a.field("dag_id")
    text = a.field("conf", "").strip()
    try:
        started = await trigger_run(
            a.store, dag_id, parse_conf(text or None), parse_timeout=a.parse_timeout
        )
    except DagPaused:
        raise Refused(f"{dag_id} is paused: unpause it first; no run was created") from None
    except (BadConf, DagImportError, UnknownDag) as exc:
        raise Refused(f"{exc}; no run was created") from None
    if started.state == "QUEUED":
        return f"{started.run_id} created, QUEUED: {dag_id} has max_active_runs runs going"
    return f"{started.run_id} created"


# -- the run and task pages: run control (executor/store/control.py) --------------------


def _who(a: Act) -> str:
    """Who the task and run log says did it: the token's name (the audit list says it
    came through the page)."""
    return a.who


async def _control(a: Act, operation: Awaitable[Done]) -> str:
    try:
        done = await operation
    except ControlError as exc:
        raise Refused(str(exc)) from None
    tasks = ", ".join(done.tasks) if done.tasks else "no task"
    return f"{a.name}: {tasks}; the run is {done.run_state}"


@action("clear")
async def clear(a: Act) -> str:
    """Clear a task (``downstream=1``: and every task after it)."""
    run_id, task_id = a.field("run_id"), a.field("task_id")
    downstream = a.field("downstream", "") == "1"
    return await _control(
        a, a.store.runs.clear(run_id, [task_id], downstream=downstream, who=_who(a))
    )


@action("mark")
async def mark(a: Act) -> str:
    """Mark a task success / failed / skipped."""
    outcome = a.field("outcome")
    if outcome not in ("success", "failed", "skipped"):
        raise Refused(f"unknown outcome {outcome!r}")
    operation = a.store.runs.mark(a.field("run_id"), a.field("task_id"), outcome, who=_who(a))  # type: ignore[arg-type]
    return await _control(a, operation)


@action("retry")
async def retry(a: Act) -> str:
    return await _control(a, a.store.runs.retry(a.field("run_id"), who=_who(a)))


@action("cancel")
async def cancel(a: Act) -> str:
    return await _control(a, a.store.runs.cancel(a.field("run_id"), who=_who(a)))


@action("resume")
async def resume(a: Act) -> str:
    """A run PAUSED by its failure policy goes on, its failed tasks run again."""
    return await _control(a, a.store.runs.resume(a.field("run_id"), who=_who(a)))


# -- the audit list ----------------------------------------------------------------------

_NOT_RECORDED = ("csrf", "back")  # the form's plumbing, not what was asked
MAX_FIELD = 500  # characters of one form field the audit row keeps


# Page writes that are not ``POST /actions/<name>``, by route: their name in
# slotless.roles.NEEDS (a route missing here is named by its path, and so needs admin).
ROUTE_ACTIONS = {"/logout": "logout", "/dags/{dag_id}/trigger": "trigger"}
# Request key: (session, action) of a write let through and not recorded yet.
PENDING = web.RequestKey("audit_pending", tuple)


def page_action(request: web.Request) -> str:
    """The action a page POST is, as :data:`slotless.roles.NEEDS` names it."""
    name = request.match_info.get("name")
    if name and request.path.startswith("/actions/"):
        return name
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path
    return ROUTE_ACTIONS.get(route, route)


def target(form: Mapping[str, Any], match: Mapping[str, str] | None = None) -> str:
    """What a form's action is done to, as the audit list names it: ``task:RUN/TASK``,
    ``run:RUN``, ``dag:DAG``, ``pool:NAME``, ``queue:NAME`` (or ""); from its fields, or
    its path's (``/dags/{dag_id}/trigger``)."""
    get = {k: v for k, v in {**(match or {}), **form}.items() if isinstance(v, str)}
    if get.get("run_id") and get.get("task_id"):
        index = get.get("map_index", "-1")
        shown = f"[{index}]" if index not in ("", "-1") else ""
        return f"task:{get['run_id']}/{get['task_id']}{shown}"
    for key, kind in (("run_id", "run"), ("dag_id", "dag"), ("pool", "pool"), ("queue", "queue")):
        if get.get(key):
            return f"{kind}:{get[key]}"
    return ""


async def audit(
    store: Store,
    who: str,
    role: Role,
    action: str,
    form: Mapping[str, Any],
    outcome: str,
    said: str,
    match: Mapping[str, str] | None = None,
) -> None:
    """The audit row of one page write: its form's fields (cut to :data:`MAX_FIELD`),
    and the message shown (``result`` when done, ``error`` when refused). A row that
    cannot be written is one log line: the write it records has happened already."""
    fields = {
        k: v[:MAX_FIELD] for k, v in form.items() if isinstance(v, str) and k not in _NOT_RECORDED
    }
    detail = {**fields, ("result" if outcome == "ok" else "error"): said[:MAX_FIELD]}
    try:
        await store.audit.record(
            who=who, role=str(role), via="web", action=action, target=target(form, match),
            detail=detail, outcome="ok" if outcome == "ok" else "refused",
        )  # fmt: skip
    except Exception:
        log.exception("could not record %s by %s in the audit list", action, who)


async def record_pending(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the audit row of a page write :func:`app._checked` let
    through and its handler did not record (the trigger form's), once its answer is known:
    ``ok`` for a 2xx or 3xx (with the message flashed, if any), ``refused`` otherwise."""
    pending = request.get(PENDING)
    if pending is None:
        return
    request.pop(PENDING, None)
    session, action = pending
    ok = response.status < 400
    said = session.flash[1] if ok and session.flash else f"status {response.status}"
    form = await request.post()
    await audit(request.app[STORE], session.who, session.role, action, form,
                "ok" if ok else "refused", said, request.match_info)  # fmt: skip
