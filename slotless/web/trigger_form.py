"""Triggering a DAG from a form drawn from its params, and a run's conf shown.

* ``GET /dags/{dag_id}/trigger``: one field per param the DAG declares (executor/params.py:
  a dict of defaults, or a pydantic model whose JSON schema gives each field's type,
  default, description and choices), and the free JSON box beside it;
* ``POST /dags/{dag_id}/trigger``: checked as every write of the page is (signed in, the
  form's CSRF token: app._checked, the same function the actions use), the fields read into
  a conf, and the run started by :func:`slotless.trigger.trigger_run`, the call behind
  ``slotless trigger``, the API and the DAGs page's trigger action. It checks the conf
  with :func:`executor.params.resolve` (nothing else here judges a value): a conf refused is
  shown beside the fields it names, the form redrawn with what was typed, status 400 and
  nothing started; a good one answers 303 to the new run's page.

What this module itself refuses is only what a field's text cannot say: an integer field
that is not a whole number, a number that is not finite, a JSON field that is not JSON.
An empty field is left out of the conf, so the param's default applies (a required one is
then refused by the params' check, "Field required").
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from executor.dag import DAG
from executor.loader import DagImportError
from executor.params import BadConf, parse_conf
from executor.store.catalogue import UnknownDag
from triggers.limits import JsonLimitError, check_json_value, storable_text

from ..trigger import DagPaused, import_dag, trigger_run
from .auth import Session
from .keys import SETTINGS, STORE
from .render import View, dag_href, run_href
from .respond import respond

Checked = Callable[[web.Request], Awaitable[Session | web.Response]]
PREFIX = "p:"  # a param's form field is named p:NAME (never clashes with csrf, mode, conf)
MAX_FIELDS = 200  # params drawn as fields; a DAG with more takes its conf as JSON


@dataclass(frozen=True)
class ParamField:
    """One param as the form draws it."""

    name: str
    kind: str  # integer, number, boolean, enum, string, json (an array, an object, any)
    type_label: str  # what the form says its type is
    default: Any = None  # a JSON value
    has_default: bool = False
    required: bool = False
    description: str = ""
    options: list[tuple[str, str]] = field(default_factory=list)  # enum: (JSON text, label)

    @property
    def default_json(self) -> str:
        """The default as JSON, as a person reads it (escaped by the template, not here)."""
        return json.dumps(self.default, ensure_ascii=False)

    def text(self, value: Any) -> str:
        """``value`` as the field's text."""
        if value is None and self.kind != "json":
            return ""
        if self.kind in ("json", "enum"):
            return json.dumps(value)
        if self.kind == "boolean":
            return "1" if value else ""
        return str(value)


def add_routes(app: web.Application) -> None:
    # Imported now, when app.py (which imports this module) is loaded: the one check of
    # every write of the page (session, CSRF token for this path).
    from .app import _checked

    async def post(request: web.Request) -> web.Response:
        return await trigger_post(request, _checked)

    app.router.add_get("/dags/{dag_id}/trigger", trigger_page)
    app.router.add_post("/dags/{dag_id}/trigger", post)


def conf_text(conf: str | Mapping[str, Any] | None) -> str | None:
    """A run's conf (as dag_run.conf stores it, JSON text; or a dict) as the page shows it:
    indented JSON, keys in their order; None when the run has none. Escaped by the template."""
    if conf is None:
        return None
    value = json.loads(conf) if isinstance(conf, str) else dict(conf)
    return json.dumps(value, indent=2, ensure_ascii=False)


# -- params -> fields ----------------------------------------------------------------------


def param_fields(params: object) -> list[ParamField] | None:
    """The form's fields for a DAG's declared params (none: no fields, the JSON box only);
    None when a params model has no JSON schema to draw them from."""
    if isinstance(params, type) and issubclass(params, BaseModel):
        return _model_fields(params)
    if isinstance(params, Mapping):
        return [_default_field(str(k), v) for k, v in params.items()]
    return []


def _default_field(name: str, value: Any) -> ParamField:
    # A dict of defaults says a type by its value only.
    if isinstance(value, bool):
        kind = "boolean"
    elif isinstance(value, int):
        kind = "integer"
    elif isinstance(value, float):
        kind = "number"
    elif isinstance(value, str):
        kind = "string"
    else:
        kind = "json"
    return ParamField(name, kind, kind if kind != "json" else "JSON", value, has_default=True)


def _model_fields(model: type[BaseModel]) -> list[ParamField] | None:
    try:
        schema = model.model_json_schema()
    except Exception:  # a field type with no JSON schema: the JSON box still takes a conf
        return None
    defs = schema.get("$defs", {})
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema.get("properties", {}).items():
        resolved, nullable = _resolve(prop, defs)
        kind, label, options = _kind(resolved)
        if nullable:
            label += " or null"
        out.append(
            ParamField(
                name,
                kind,
                label,
                prop.get("default"),
                has_default="default" in prop,
                required=name in required,
                description=str(prop.get("description") or resolved.get("description") or ""),
                options=options,
            )
        )
    return out


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A property's schema with its $ref followed, and whether null is allowed too
    (``X | None``: anyOf [X, null])."""
    nullable = False
    if "anyOf" in prop:
        kept = [p for p in prop["anyOf"] if p.get("type") != "null"]
        nullable = len(kept) < len(prop["anyOf"])
        prop = kept[0] if len(kept) == 1 else {"anyOf": kept}
    if "allOf" in prop and len(prop["allOf"]) == 1:
        prop = prop["allOf"][0]
    if "$ref" in prop:
        prop = defs.get(prop["$ref"].rsplit("/", 1)[-1], {})
    return prop, nullable


def _kind(prop: dict[str, Any]) -> tuple[str, str, list[tuple[str, str]]]:
    if "enum" in prop or "const" in prop:
        values = prop.get("enum", [prop.get("const")])
        return "enum", "one of", [(json.dumps(v), str(v)) for v in values]
    t = prop.get("type")
    if t in ("integer", "number", "boolean", "string"):
        return t, t, []
    if t == "array":
        return "json", "JSON array", []
    if t == "object":
        return "json", "JSON object", []
    return "json", "JSON", []


# -- the page --------------------------------------------------------------------------------


@dataclass
class _Form:
    dag_id: str
    fields: list[ParamField] | None  # None: the DAG could not be read (problem says why)
    values: dict[str, str]  # field name (or "conf") -> the text shown
    errors: dict[str, str] = field(default_factory=dict)  # field name (or "conf") -> why
    error: str = ""  # what was refused, in one line
    problem: str = ""  # why the DAG cannot be triggered now
    mode: str = "fields"  # which form was sent: fields or json
    json_only: bool = False  # the params cannot be drawn as fields: the JSON box only


def _view(request: web.Request, form: _Form) -> View:
    action = dag_href(form.dag_id) + "/trigger"
    ctx = {
        "dag_id": form.dag_id,
        "action": action,
        "fields": form.fields,
        "json_only": form.json_only,
        "max_fields": MAX_FIELDS,
        "values": form.values,
        "errors": form.errors,
        "error": form.error,
        "problem": form.problem,
        "mode": "json" if form.json_only else form.mode,
        "prefix": PREFIX,
    }
    return View("trigger.html", f"trigger {form.dag_id}", ctx)


async def _read_dag(request: web.Request, dag_id: str) -> tuple[DAG | None, str, int]:
    """The catalogued DAG, or why it cannot be triggered and the status to say it with."""
    store = request.app[STORE]
    if not storable_text(dag_id):
        return None, f"There is no DAG {dag_id[:200]!r} in the catalogue.", 404
    try:
        entry = await store.catalogue.catalogue_dag(dag_id)
    except UnknownDag as exc:
        return None, str(exc), 404
    if entry["parse_error"]:
        return None, f"its file is broken: {entry['parse_error']}", 409
    try:
        dag = await import_dag(entry["file"], dag_id, request.app[SETTINGS]["parse_timeout"])
    except DagImportError as exc:
        return None, str(exc), 409
    return dag, "", 200


async def trigger_page(request: web.Request) -> web.Response:
    dag_id = request.match_info["dag_id"]
    dag, problem, status = await _read_dag(request, dag_id)
    if dag is None:
        form = _Form(dag_id, None, {}, problem=problem)
        return respond(request, _view(request, form), status=status)
    fields, json_only = _drawable(dag)
    values = {f.name: f.text(f.default) for f in fields if f.has_default}
    form = _Form(dag_id, fields, values, json_only=json_only)
    return respond(request, _view(request, form))


def _drawable(dag: DAG) -> tuple[list[ParamField], bool]:
    """The fields to draw, and whether the conf can only be given as JSON (a params model
    with no JSON schema, or more than MAX_FIELDS params)."""
    fields = param_fields(dag.params)
    if fields is None or len(fields) > MAX_FIELDS:
        return [], True
    return fields, False


def _read_fields(
    fields: list[ParamField], form: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The conf the fields say, the text of each (kept for a redraw), and what could not be
    read from its text (field -> why)."""
    conf: dict[str, Any] = {}
    texts: dict[str, str] = {}
    errors: dict[str, str] = {}
    for f in fields:
        raw = form.get(PREFIX + f.name)
        text = raw if isinstance(raw, str) else ""
        texts[f.name] = text
        if f.kind == "boolean":
            conf[f.name] = text == "1"
            continue
        if text.strip() == "":
            continue  # left out: its default applies, or the check says it is required
        try:
            conf[f.name] = _value(f, text)
        except ValueError as exc:
            errors[f.name] = str(exc)
    return conf, texts, errors


def _value(f: ParamField, text: str) -> Any:
    if f.kind == "integer":
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError(f"not a whole number: {text[:80]!r}") from None
    if f.kind == "number":
        try:
            number = float(text.strip())
        except ValueError:
            raise ValueError(f"not a number: {text[:80]!r}") from None
        if not math.isfinite(number):
            raise ValueError("not a finite number")
        return number
    if f.kind in ("json", "enum"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}") from None
    return text


async def trigger_post(request: web.Request, checked: Checked) -> web.Response:
    session = await checked(request)
    if isinstance(session, web.Response):
        return session
    dag_id = request.match_info["dag_id"]
    posted = await request.post()
    dag, problem, status = await _read_dag(request, dag_id)
    if dag is None:
        form = _Form(dag_id, None, {}, problem=problem)
        return respond(request, _view(request, form), status=status)
    fields, json_only = _drawable(dag)
    mode = "json" if posted.get("mode") == "json" or json_only else "fields"
    conf: dict[str, Any] | None
    if mode == "json":
        raw = posted.get("conf")
        text = raw.strip() if isinstance(raw, str) else ""
        form = _Form(dag_id, fields, {"conf": text}, mode="json", json_only=json_only)
        try:
            conf = parse_conf(text or None)
        except BadConf as exc:
            form.errors["conf"] = str(exc).replace("--conf", "the conf")
            return _refused(request, form, "the conf is not a JSON object: no run was created")
    else:
        conf, texts, errors = _read_fields(fields, posted)
        form = _Form(dag_id, fields, texts, errors)
        if errors:
            return _refused(request, form, "some fields cannot be read: no run was created")
    try:
        check_json_value(conf, "conf")  # nesting, Unicode, size: as the API checks a conf
        started = await trigger_run(
            request.app[STORE], dag_id, conf, parse_timeout=request.app[SETTINGS]["parse_timeout"]
        )
    except JsonLimitError as exc:
        if mode == "json":
            form.errors["conf"] = str(exc)
        return _refused(request, form, f"{exc}: no run was created")
    except BadConf as exc:
        if mode == "json" or not exc.fields:
            form.errors["conf"] = str(exc)
        else:
            form.errors.update(exc.fields)
        return _refused(request, form, f"{exc}; no run was created")
    except DagPaused:
        form.problem = f"{dag_id} is paused: unpause it first; no run was created"
        return respond(request, _view(request, form), status=409)
    except (DagImportError, UnknownDag) as exc:
        form.problem = f"{exc}; no run was created"
        return respond(request, _view(request, form), status=409)
    said = f"{started.run_id} created"
    if started.state == "QUEUED":
        said += f", QUEUED: {dag_id} has max_active_runs runs going"
    session.flash, session.form = ("ok", said), {}
    raise web.HTTPSeeOther(run_href(started.run_id))


def _refused(request: web.Request, form: _Form, error: str) -> web.Response:
    form.error = error
    return respond(request, _view(request, form), status=400)
