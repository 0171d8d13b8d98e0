"""The JSON API under ``/api/v1``: events, starting runs, reading a run, answering a
person's wait; its OpenAPI document.

Hand-written aiohttp routes with pydantic models, not a framework: the page is already an
aiohttp application (one process, one port, one token setting), a route is a few lines,
and the models that validate each body are the ones the OpenAPI document is generated
from (:func:`openapi`), so the document cannot drift from what is enforced. A framework
(FastAPI, aiohttp-pydantic) would bring a second server stack or a thin, little-used layer
for the same five routes.

Writes need ``Authorization: Bearer TOKEN``, one of the tokens ``slotless ui --token``
(or $SLOTLESS_UI_TOKEN) was given, as ``NAME:ROLE:SECRET`` entries (:mod:`.auth`); every
token is compared in constant time, its role must be at least the one its route's action
needs (:data:`slotless.roles.NEEDS`; 403 otherwise, naming both), and the token's name is
who the write is recorded as, in the task and run log and in the audit list (one row per
write, refused ones too, written right after it: :mod:`executor.store.audit`). Reads are
open, but the audit list's, which needs a viewer's token. Without a token configured the
API is read-only. A bearer token is never sent by a browser on its own, so the API needs
no CSRF token (the page's forms, which use a cookie, do).

Every error is JSON: ``{"error": "...", "field": "payload", "errors": [...]}``, ``field``
naming what was wrong (a body field as ``events[3].payload``, a path or query parameter
by name, ``Authorization``, ``body``). Statuses: 400 bad input, 401 no or a wrong token,
403 read-only or not a respondent, 404 unknown, 409 a conflict (a paused DAG), 413 too
large, 415 a body not sent as ``application/json``. Bodies are checked by the store, the
same check every way in meets (:func:`triggers.limits.check_json_value`): nested at most
64 deep, valid Unicode, finite numbers.

**Adding a route** (as the answer to a person's wait, ``respond`` below, was added)::

    class ResponseIn(BaseModel):
        approve: bool
        comment: str = ""

    @route("POST", "/runs/{run_id}/tasks/{task_id}/response", body=ResponseIn,
           response=ResponseOut, write=True, action="respond", status=201,
           summary="Answer a person's wait")       # action: its line in roles.NEEDS
    async def respond(call: Call) -> ResponseOut:
        answer = call.body(ResponseIn)           # validated; a bad field is a 400 naming it
        ...                                       # call.who: the token's name
        raise ApiError(409, "already answered by alice at ...", "task_id")

It appears in ``/api/v1/openapi.json`` at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator
from pydantic.json_schema import models_json_schema

from executor.loader import DagImportError
from executor.params import BadConf
from executor.rows import TaskRow
from executor.runnames import logical_shown
from executor.store import Store
from executor.store.audit import MAX_LIST as AUDIT_MAX
from executor.store.catalogue import UnknownDag
from executor.store.events import MAX_BATCH, StoredEvent, UnknownEvent
from executor.store.people import RespondError
from executor.store.viewrows import RunRow
from triggers.events import NAME_RULE, EventError, check_name
from triggers.limits import (
    MAX_DEPTH,
    MAX_SERIALIZED_BYTES,
    JsonLimitError,
    check_json_value,
    short_path,
    storable_text,
)
from triggers.people import MAX_COMMENT, AnswerError

from ..roles import Role, Token, needs, refusal
from ..trigger import DagPaused, trigger_run
from .auth import Auth
from .keys import PARSE_TIMEOUT
from .numbers import BIGGEST, whole_number

log = logging.getLogger("slotless.api")

PREFIX = "/api/v1"
# A batch of MAX_BATCH events at the payload limit, with room for names and brackets.
MAX_BODY = MAX_BATCH * (MAX_SERIALIZED_BYTES + 512)
VERSION = "1"


# ------------------------------------------------------------------------------- models


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


_M = TypeVar("_M", bound=BaseModel)


class EventIn(_Model):
    """One event: its name and its JSON payload (at most 64 KiB as compact JSON)."""

    name: str = Field(pattern=NAME_RULE, examples=["export.ready"])
    # Any, not JsonValue: the payload is checked once, by the store (its depth, its text,
    # its size), the same check the CLI and the Python API meet; the document still says
    # what it takes.
    payload: Any = Field(
        default=None,
        examples=[{"partner": "acme", "date": "2026-11-24"}],
        json_schema_extra={"description": "any JSON value, nested at most "
                           f"{MAX_DEPTH} deep, at most 64 KiB as compact JSON"},
    )  # fmt: skip

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return check_name(value)  # its message says the rule in words


class EventBatchIn(_Model):
    """Several events, stored in one transaction in order (at most 1,000)."""

    events: list[EventIn] = Field(min_length=1, max_length=MAX_BATCH)


class WakeOut(_Model):
    """A wait an event woke: the task, and its state now."""

    run_id: str
    task_id: str
    map_index: int
    state: str
    woke_at: float


class EventOut(_Model):
    id: int
    name: str
    payload: JsonValue
    sent_at: float
    source: str
    woke: list[WakeOut]


class SentEventOut(_Model):
    id: int
    name: str
    sent_at: float
    woke: list[WakeOut]


class SentOut(_Model):
    """What a POST of events stored, in order, and the waits each woke."""

    events: list[SentEventOut]


class EventsOut(_Model):
    events: list[EventOut]


class RunIn(_Model):
    """A run to start: its conf (checked against the DAG's params), and optionally its
    logical date and run key (a run is created once per key)."""

    conf: dict[str, JsonValue] | None = None
    logical_date: date | None = None
    run_key: str | None = Field(default=None, min_length=1, max_length=2048)


RunTypeName = Literal["scheduled", "manual", "backfill", "event", "asset"]  # runnames.RunType
_LOGICAL_TIME = Field(
    description="the run's logical instant, ISO 8601 in UTC: a schedule's run, its "
    "interval's start; else midnight of its logical date on the DAG's clock (null: a run "
    "created by a release before logical times)",
    examples=["2026-11-26T06:00:00+00:00"],
)
_LOGICAL_SHOWN = Field(
    description="the logical time as people read it, on the DAG's clock: "
    "'2026-11-26 06:00', or '2026-11-26' alone for a day's run",
    examples=["2026-11-26 06:00"],
)
_RUN_TYPE = Field(
    description="how the run started: scheduled, manual (slotless trigger, the page, this "
    "API, Python), backfill, event (a start condition); null: created by a release "
    "before run types",
    examples=["manual"],
)


class RunOut(_Model):
    dag_id: str
    run_id: str
    run_key: str
    created: bool
    state: str
    logical_date: str
    logical_time: str | None = _LOGICAL_TIME
    logical_shown: str = _LOGICAL_SHOWN
    run_type: RunTypeName | None = _RUN_TYPE


class TaskOut(_Model):
    task_id: str
    map_index: int
    state: str


class RunStatusOut(_Model):
    run_id: str
    dag_id: str
    state: str
    logical_date: str
    logical_time: str | None = _LOGICAL_TIME
    logical_shown: str = _LOGICAL_SHOWN
    run_type: RunTypeName | None = _RUN_TYPE
    tasks: list[TaskOut]


class FieldError(_Model):
    field: str | None
    message: str


class ErrorOut(_Model):
    """Every error: what was wrong, and the field it was in."""

    error: str
    field: str | None = None
    errors: list[FieldError] = Field(default_factory=list)


# ------------------------------------------------------------------------------- routes


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.errors: list[FieldError] = []


@dataclass(frozen=True)
class Call:
    """One request to a route: the store, the raw request, who made it (the token's name,
    on a route with an action), the token's role."""

    request: web.Request
    store: Store
    who: str | None
    raw: Any = None  # the parsed JSON body
    role: Role | None = None

    def param(self, name: str) -> str:
        return self.request.match_info[name]

    def body(self, model: type[_M]) -> _M:
        """The body validated by ``model``; a 400 naming the first bad field otherwise."""
        try:
            return model.model_validate(self.raw)
        except ValidationError as exc:
            raise _invalid(exc) from None


Handler = Callable[[Call], Awaitable[tuple[int, BaseModel]]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # under PREFIX
    handler: Handler
    summary: str
    response: type[BaseModel]
    body: type[BaseModel] | tuple[type[BaseModel], ...] | None = None
    write: bool = False
    status: int = 200
    query: dict[str, str] = field(default_factory=dict)  # name -> description
    errors: tuple[int, ...] = ()
    # The action's name in slotless.roles.NEEDS: the route needs a token whose role is at
    # least the table's. Every write has one (its handler's name unless given); a read
    # with one needs a token too (the audit list).
    action: str | None = None

    @property
    def needs(self) -> Role | None:
        """The role the route needs, or None: a read open to anyone."""
        return needs(self.action) if self.action is not None else None


ROUTES: list[Route] = []
# A write's action is its handler's name, but where the page's name for the same write
# differs: both are one line of slotless.roles.NEEDS and one name in the audit list.
_SAME_AS_THE_PAGE = {"start_run": "trigger"}


def route(
    method: str,
    path: str,
    *,
    summary: str,
    response: type[BaseModel],
    body: type[BaseModel] | tuple[type[BaseModel], ...] | None = None,
    write: bool = False,
    status: int = 200,
    query: dict[str, str] | None = None,
    errors: tuple[int, ...] = (),
    action: str | None = None,
) -> Callable[[Handler], Handler]:
    """Register ``method PREFIX+path``; its models go into the OpenAPI document. A write's
    ``action`` (default: the handler's name) is its line in :data:`slotless.roles.NEEDS`."""

    def register(handler: Handler) -> Handler:
        default = _SAME_AS_THE_PAGE.get(handler.__name__, handler.__name__)
        named = action or (default if write else None)
        ROUTES.append(
            Route(
                method, path, handler, summary, response, body, write, status, query or {},
                errors, named,
            )
        )  # fmt: skip
        return handler

    return register


# ------------------------------------------------------------------------------- events


def _event_out(e: StoredEvent) -> EventOut:
    return EventOut(
        id=e.id, name=e.name, payload=e.payload, sent_at=e.sent_at, source=e.source,
        woke=[WakeOut(run_id=w.run_id, task_id=w.task_id, map_index=w.map_index,
                      state=w.state, woke_at=w.woke_at) for w in e.woke],
    )  # fmt: skip


@route(
    "POST", "/events", summary="Send one event or a batch; each wakes the waits it matches",
    body=(EventIn, EventBatchIn), response=SentOut, write=True, status=201,
    errors=(400, 401, 403, 413, 415),
)  # fmt: skip
async def send_events(call: Call) -> tuple[int, BaseModel]:
    batch = isinstance(call.raw, dict) and "events" in call.raw
    events = call.body(EventBatchIn).events if batch else [call.body(EventIn)]
    try:
        sent = await call.store.events.send_events(
            [(e.name, e.payload) for e in events], source=f"api:{call.who}"
        )
    except EventError as exc:
        raise ApiError(413 if exc.too_large else 400, str(exc), exc.field) from None
    stored = []
    for s in sent:
        woke = _event_out(await call.store.events.get_event(s.id)).woke if s.woke else []
        stored.append(SentEventOut(id=s.id, name=s.name, sent_at=s.sent_at, woke=woke))
    return 201, SentOut(events=stored)


@route(
    "GET", "/events", summary="The newest events, with the waits each woke",
    response=EventsOut, errors=(400, 404),
    query={"name": "only events of this name", "limit": "how many (1-1000, default 50)"},
)  # fmt: skip
async def list_events(call: Call) -> tuple[int, BaseModel]:
    name = call.request.query.get("name") or None
    limit = _int_query(call, "limit", 50, 1, 1000)
    try:
        events = await call.store.events.list_events(name, limit=limit)
    except UnknownEvent as exc:
        raise ApiError(404, str(exc), exc.field) from None
    return 200, EventsOut(events=[_event_out(e) for e in events])


@route("GET", "/events/{id}", summary="One event and the waits it woke", response=EventOut,
       errors=(400, 404))  # fmt: skip
async def get_event(call: Call) -> tuple[int, BaseModel]:
    event_id = whole_number(call.param("id"), low=1)
    if event_id is None:
        raise ApiError(400, f"id must be a whole number from 1 to {BIGGEST}", "id")
    try:
        return 200, _event_out(await call.store.events.get_event(event_id))
    except UnknownEvent as exc:
        raise ApiError(404, str(exc), "id") from None


# --------------------------------------------------------------------------------- runs


@route(
    "POST", "/dags/{dag_id}/runs", summary="Start a run of a catalogued DAG with a conf",
    body=RunIn, response=RunOut, write=True, status=201, errors=(400, 401, 403, 404, 409, 415),
)  # fmt: skip
async def start_run(call: Call) -> tuple[int, BaseModel]:
    dag_id = call.param("dag_id")
    new = call.body(RunIn)
    # The catalogue and the runs are the store's parts of other concerns; until they check
    # text themselves, what they cannot hold is refused here rather than in the driver.
    if not storable_text(dag_id):
        raise ApiError(404, f"no DAG {dag_id[:200]!r} is catalogued", "dag_id")
    if new.run_key is not None and not storable_text(new.run_key):
        raise ApiError(400, "run_key: text without NUL or lone surrogates", "run_key")
    try:
        check_json_value(new.conf, "conf")
    except JsonLimitError as exc:
        raise ApiError(400, str(exc), exc.field) from None
    try:
        started = await trigger_run(
            call.store, dag_id, new.conf, parse_timeout=call.request.app[PARSE_TIMEOUT],
            logical_date=new.logical_date, run_key=new.run_key,
        )  # fmt: skip
    except UnknownDag as exc:
        raise ApiError(404, str(exc), "dag_id") from None
    except DagPaused as exc:
        raise ApiError(409, str(exc), "dag_id") from None
    except DagImportError as exc:
        raise ApiError(409, str(exc), "dag_id") from None
    except BadConf as exc:
        raise ApiError(400, str(exc), "conf") from None
    info = await call.store.views.run_info(started.run_id)
    assert info is not None  # just created or found, and runs are never deleted
    run = RunRow.of(info)
    out = RunOut(dag_id=dag_id, run_id=started.run_id, run_key=started.run_key,
                 created=started.created, state=started.state, **_logical(run))  # fmt: skip
    return (201 if started.created else 200), out


@route("GET", "/runs/{run_id}", summary="A run's state and its tasks' states",
       response=RunStatusOut, errors=(404,))  # fmt: skip
async def get_run(call: Call) -> tuple[int, BaseModel]:
    run_id = call.param("run_id")
    info = await call.store.views.run_info(run_id) if storable_text(run_id) else None
    if info is None:
        raise ApiError(404, f"there is no run {run_id!r}", "run_id")
    run = RunRow.of(info)
    tasks = [TaskOut(task_id=t.task_id, map_index=t.map_index, state=t.state)
             for t in TaskRow.all(await call.store.views.run_tasks(run_id))]  # fmt: skip
    return 200, RunStatusOut(run_id=run_id, dag_id=run.dag_id, state=run.state,
                             tasks=tasks, **_logical(run))  # fmt: skip


def _logical(run: RunRow) -> dict[str, Any]:
    """A run's date, time, and type, as both run models say them."""
    return {
        "logical_date": str(run.logical_date),
        "logical_time": run.logical_time,
        "logical_shown": logical_shown(run),
        "run_type": run.run_type,
    }


# ------------------------------------------------------------------------------ serving


# -------------------------------------------------------------------- people in the loop


class ResponseIn(_Model):
    """A person's answer: ``approve`` (an Approval), ``choose`` (a Choice or BranchChoice:
    one option, or a list with ``multiple``), or ``form`` (a Form's fields); a comment."""

    # Strict: ``"yes"`` is not true, ``1`` is not an option. The answer is then checked by
    # the request itself (``check_answer``), as strict, whichever way it came in.
    model_config = ConfigDict(extra="forbid", strict=True)

    approve: bool | None = None
    choose: str | list[str] | None = None
    form: dict[str, Any] | None = None  # checked by the store, as an event's payload is
    comment: str = Field(default="", max_length=MAX_COMMENT)
    map_index: int = Field(default=-1, ge=-1, le=BIGGEST)


class ResponseOut(_Model):
    """The answer as recorded: the task's state now and its output (the answer, by, at)."""

    run_id: str
    task_id: str
    state: str
    output: dict[str, JsonValue]
    skipped: list[str]


class RequestOut(_Model):
    run_id: str
    task_id: str
    map_index: int
    dag_id: str
    logical_date: str
    waiting_since: float | None
    gives_up_at: float | None
    request: dict[str, JsonValue]


class NeedsYouOut(_Model):
    count: int
    requests: list[RequestOut]


@route(
    "POST", "/runs/{run_id}/tasks/{task_id}/response",
    summary="Answer a person's wait (approve, choose, fill a form); the first answer wins",
    body=ResponseIn, response=ResponseOut, write=True, status=201,
    errors=(400, 401, 403, 404, 409, 415),
)  # fmt: skip
async def respond(call: Call) -> tuple[int, BaseModel]:
    given = call.body(ResponseIn)
    answer = given.model_dump(exclude_none=True, exclude={"map_index"})
    if not answer.get("comment"):
        answer.pop("comment", None)
    assert call.who is not None  # a write route: authorized
    try:
        done = await call.store.answers.respond(
            call.param("run_id"), call.param("task_id"), answer, who=call.who,
            map_index=given.map_index,
        )  # fmt: skip
    except RespondError as exc:
        raise ApiError(exc.status, str(exc), exc.field) from None
    except AnswerError as exc:
        err = ApiError(400, str(exc), exc.field)
        err.errors = [FieldError(field=f, message=m) for f, m in exc.errors]
        raise err from None
    return 201, ResponseOut(
        run_id=done.run_id, task_id=done.task_id, state=done.state, output=done.output,
        skipped=done.skipped,
    )  # fmt: skip


@route("GET", "/needs-you", summary="The requests waiting for a person's answer",
       response=NeedsYouOut)  # fmt: skip
async def needs_you(call: Call) -> tuple[int, BaseModel]:
    count, requests = await call.store.answers.needs_you()
    return 200, NeedsYouOut(
        count=count,
        requests=[
            RequestOut(
                run_id=r.run_id, task_id=r.task_id, map_index=r.map_index, dag_id=r.dag_id,
                logical_date=r.logical_date, waiting_since=r.waiting_since,
                gives_up_at=r.gives_up_at, request=r.wait.request(),
            )
            for r in requests
        ],
    )  # fmt: skip


# ------------------------------------------------------------------------- the audit list


class AuditOut(_Model):
    """One write through the page (``via: web``) or the API (``api``), under its token's
    name and role then; ``outcome`` ``refused``: nothing was changed."""

    id: int
    ts: float
    who: str
    role: str
    via: str
    action: str
    target: str
    detail: JsonValue
    outcome: str


class AuditListOut(_Model):
    entries: list[AuditOut]


@route(
    "GET", "/audit", summary="Who did what: the audit list, newest first",
    response=AuditListOut, action="audit", errors=(400, 401, 403),
    query={"since": "only rows at or after this time (epoch seconds, default 0)",
           "limit": f"how many (1-{AUDIT_MAX}, default 100)"},
)  # fmt: skip
async def list_audit(call: Call) -> tuple[int, BaseModel]:
    text = call.request.query.get("since", "0")
    try:
        since = float(text)
    except ValueError:
        since = float("nan")
    if since != since or since in (float("inf"), float("-inf")):  # NaN or infinite
        raise ApiError(400, "since must be a time in epoch seconds", "since")
    limit = _int_query(call, "limit", 100, 1, AUDIT_MAX)
    rows = await call.store.audit.since(since, limit)
    return 200, AuditListOut(entries=[AuditOut(**asdict(r)) for r in rows])


def add_api(app: web.Application, store: Store, auth: Auth, parse_timeout: float) -> None:
    """Mount ``/api/v1`` (every route in :data:`ROUTES` and the OpenAPI document) on ``app``."""
    api = web.Application(middlewares=[_json_errors])
    api[PARSE_TIMEOUT] = parse_timeout
    for r in ROUTES:
        api.router.add_route(r.method, r.path, _serve(r, store, auth))
    api.router.add_get("/openapi.json", _openapi)
    app.add_subapp(PREFIX, api)


def _serve(r: Route, store: Store, auth: Auth) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        token = await _authorize(request, auth, r, store) if r.action is not None else None
        call = Call(request, store, token.name if token else None,
                    role=token.role if token else None)  # fmt: skip
        if token is None or not r.write:
            return await _run(r, call)
        try:
            response = await _run(r, call)
        except ApiError as exc:  # refused: nothing was changed
            await _audit(call, token, r, "refused", {"status": exc.status, "error": str(exc)})
            raise
        except Exception as exc:  # a 500; the store's transaction rolled back
            await _audit(call, token, r, "refused", {"error": f"{type(exc).__name__}: {exc}"})
            raise
        await _audit(call, token, r, "ok", {"status": response.status, **_outline(response)})
        return response

    return handle


async def _run(r: Route, call: Call) -> web.Response:
    raw = None
    if r.body is not None:
        request = call.request
        if request.content_type != "application/json":
            raise ApiError(
                415,
                f"the body must be JSON sent as Content-Type: application/json, not "
                f"{request.content_type[:60]!r}",
                "Content-Type",
            )
        raw = await _read_json(request)
    call = Call(call.request, call.store, call.who, raw, call.role)
    status, out = await r.handler(call)
    return _respond(status, out.model_dump(mode="json"))


async def _authorize(request: web.Request, auth: Auth, r: Route, store: Store) -> Token:
    """The request's token, if its role may use route ``r``; otherwise the ApiError to
    answer (401 no or a wrong token, 403 read-only or a role below the route's), one log
    line, and for a known token's refusal its audit row."""
    if not auth.enabled:
        raise ApiError(
            403,
            "the API is read-only: start `slotless ui` with --token NAME:ROLE:SECRET to allow "
            "writes and the audit list",
            "Authorization",
        )
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if not header:
        raise ApiError(401, "missing Authorization: Bearer TOKEN", "Authorization")
    token = auth.token(given.strip()) if scheme.lower() == "bearer" else None
    if token is None:
        log.warning("API: refused %s %s from %s: wrong token", request.method, request.path,
                    request.remote)  # fmt: skip
        raise ApiError(401, "wrong token (expected Authorization: Bearer TOKEN)", "Authorization")
    assert r.action is not None and r.needs is not None
    if token.role < r.needs:
        why = refusal(r.action, token.name, token.role)
        log.warning("API: refused %s %s from %s: %s", request.method, request.path,
                    request.remote, why)  # fmt: skip
        if r.write:
            await _audit(Call(request, store, token.name), token, r, "refused",
                         {"status": 403, "error": why})  # fmt: skip
        raise ApiError(403, why, "Authorization")
    return token


def _target(request: web.Request) -> str:
    """What a route is done to, as the audit list names it (as the page's forms do)."""
    m = request.match_info
    if "run_id" in m and "task_id" in m:
        return f"task:{m['run_id']}/{m['task_id']}"
    for key, kind in (("run_id", "run"), ("dag_id", "dag")):
        if key in m:
            return f"{kind}:{m[key]}"
    return ""


def _outline(response: web.Response) -> dict[str, Any]:
    """What an audit row keeps of a write's answer: the ids it names, not its payloads."""
    try:
        data = json.loads(response.text or "null")
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    kept: dict[str, Any] = {
        k: data[k] for k in ("run_id", "run_key", "state", "created") if k in data
    }
    if isinstance(data.get("events"), list):
        kept["events"] = [{"id": e.get("id"), "name": e.get("name")}
                          for e in data["events"][:50] if isinstance(e, dict)]  # fmt: skip
    return kept


async def _audit(
    call: Call, token: Token, r: Route, outcome: Literal["ok", "refused"], detail: dict[str, Any]
) -> None:
    """One audit row; a row that cannot be written is one log line (the write it records
    has happened, or was refused, already)."""
    assert r.action is not None
    try:
        await call.store.audit.record(
            who=token.name, role=str(token.role), via="api", action=r.action,
            target=_target(call.request), detail=detail, outcome=outcome,
        )  # fmt: skip
    except Exception:
        log.exception("could not record %s by %s in the audit list", r.action, token.name)


async def _read_json(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ApiError(413, f"the body is over {MAX_BODY} bytes", "body")
    try:
        data = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the body is over {MAX_BODY} bytes", "body") from None
    try:
        return json.loads(data)
    except RecursionError:
        raise ApiError(
            400, f"the body nests too deep: at most {MAX_DEPTH} levels are taken", "body"
        ) from None
    except ValueError as exc:  # a lone surrogate is valid JSON: the store refuses it
        raise ApiError(400, f"the body is not JSON: {str(exc)[:200]}", "body") from None


def _respond(status: int, data: Any) -> web.Response:
    return web.json_response(data, status=status, headers={"Cache-Control": "no-store"})


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        err = ErrorOut(error=str(exc), field=exc.field, errors=exc.errors)
        return _respond(exc.status, err.model_dump(mode="json"))
    except web.HTTPException as exc:  # no such route, a wrong method, a body too large
        field_ = "body" if exc.status == 413 else None
        return _respond(exc.status, {"error": exc.reason, "field": field_, "errors": []})
    except Exception as exc:
        log.exception("API error serving %s", request.path)
        return _respond(500, {"error": f"{type(exc).__name__}: {exc}", "field": None,
                              "errors": []})  # fmt: skip


def _invalid(exc: ValidationError) -> ApiError:
    # A path 300 levels deep or a message quoting a huge input helps no one: both are cut.
    errors = [FieldError(field=_field(e["loc"]), message=e["msg"][:200])
              for e in exc.errors()[:20]]  # fmt: skip
    first = errors[0]
    err = ApiError(400, f"{first.field or 'body'}: {first.message}", first.field)
    err.errors = errors
    return err


def _field(loc: tuple[int | str, ...]) -> str | None:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return short_path(out) if out else None


def _int_query(call: Call, name: str, default: int, low: int, high: int) -> int:
    text = call.request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"{name} must be a number", name) from None
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}", name)
    return value


# ------------------------------------------------------------------------------ OpenAPI


async def _openapi(request: web.Request) -> web.Response:
    return _respond(200, openapi())


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 document of :data:`ROUTES`, from their pydantic models."""
    models: list[type[BaseModel]] = [ErrorOut]
    for r in ROUTES:
        bodies = r.body if isinstance(r.body, tuple) else (r.body,) if r.body else ()
        models += [*bodies, r.response]
    unique = list(dict.fromkeys(models))
    modes: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
        (m, "validation") for m in unique
    ]
    _, defs = models_json_schema(modes, ref_template="#/components/schemas/{model}")

    def ref(m: type[BaseModel]) -> dict[str, str]:
        return {"$ref": f"#/components/schemas/{m.__name__}"}

    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        op: dict[str, Any] = {
            "summary": r.summary,
            "operationId": r.handler.__name__,
            "responses": {str(r.status): {"description": "OK", "content": {
                "application/json": {"schema": ref(r.response)}}}},
        }  # fmt: skip
        params = [
            {"name": p.strip("{}"), "in": "path", "required": True, "schema": {"type": "string"}}
            for p in r.path.split("/") if p.startswith("{")
        ]  # fmt: skip
        params += [
            {"name": n, "in": "query", "required": False, "description": d,
             "schema": {"type": "string"}}
            for n, d in r.query.items()
        ]  # fmt: skip
        if params:
            op["parameters"] = params
        if r.body is not None:
            bodies = r.body if isinstance(r.body, tuple) else (r.body,)
            schema = ref(bodies[0]) if len(bodies) == 1 else {"oneOf": [ref(b) for b in bodies]}
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema}},
            }
        if r.needs is not None:
            op["security"] = [{"bearer": []}]
            op["description"] = f"Needs a token whose role is {r.needs} or above."
        for status in r.errors:
            op["responses"][str(status)] = {"description": _REASONS.get(status, "error"),
                "content": {"application/json": {"schema": ref(ErrorOut)}}}  # fmt: skip
        paths.setdefault(PREFIX + r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "slotless", "version": VERSION,
                 "description": "Events, runs and (later) answers from people; see docs/api.md."},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }  # fmt: skip


_REASONS = {
    400: "bad input: the error names the field",
    401: "no token, or a wrong one",
    403: "the API is read-only (no token configured), or the token's role is below the "
    "route's (the error names both)",
    404: "no such DAG, run or event",
    409: "a conflict: the DAG is paused or its file is broken",
    413: "a payload over 64 KiB, or a body over the batch limit",
    415: "a body not sent as Content-Type: application/json",
}
