"""Jinja2 templates: a sensor's trigger fields, a task's ``templates=`` and a start
condition, with Airflow's variables and macros (docs/templates.md).

One sandboxed environment renders them all (:data:`ENV`: Jinja2's
``ImmutableSandboxedEnvironment``, ``StrictUndefined``, no autoescape: these are paths, keys
and names, not HTML). A template is compiled once per process (:func:`compiled`, an LRU by
source) and rendered for a run from a :class:`Scope` (:func:`variables` says what each name
holds, as Airflow's template context does).

**When.** What can be known from the text alone is checked when the DAG file is parsed
(:func:`check_fields`: syntax, unknown filters, names outside the supported set, unknown
``macros.`` and ``dag_run.`` attributes), so ``slotless dags list`` names the task and the
field. What depends on the run (a macro raising on its arguments, a missing param) fails
the attempt with the template and the error on one line (:class:`TemplateFailed`).

**Where.** Rendering is Python a DAG's author wrote: the worker renders in a thread
(``asyncio.to_thread``), and so does a start condition's arm and fire, never on a loop
(executor/attempt.py, executor/store/starts.py). The triggerer renders nothing per wait:
a deferred trigger is stored rendered.
"""

from __future__ import annotations

import functools
import operator
import random
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from types import SimpleNamespace
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import jinja2
from jinja2 import StrictUndefined, TemplateSyntaxError, meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from triggers.base import BaseTrigger, fill_strings, is_template

from .errors import DagError

T = TypeVar("T", bound=BaseTrigger)

# Distinct templates kept compiled per process; one more is compiled again on its next use.
MAX_COMPILED = 1024
# The longest template (characters): a field's template is a path, a key, a name. Bounds
# what a compile costs where one happens in a transaction (a start condition's fire: about
# 0.3 ms for a path's template, once per process; docs/templates.md).
MAX_TEMPLATE = 4096
# The longest string or list one ``*`` may make, and the largest result of ``**``: the
# sandbox bounds ``range()`` (100,000 items) but not these, and a template must not be able
# to ask a worker for gigabytes. A trigger's rendered kwargs are bounded again (64 KiB,
# executor/sensing.py); a task's ``ctx.templates`` by this per operation.
MAX_REPEAT = 64 * 1024
MAX_POWER_BITS = 4096

# Names a sensor's trigger and a task's templates may use (:func:`variables`).
TASK_NAMES = frozenset(
    {
        "ds",
        "ds_nodash",
        "ts",
        "ts_nodash",
        "ts_nodash_with_tz",
        "logical_date",
        "data_interval_start",
        "data_interval_end",
        "params",
        "run_id",
        "dag_id",
        "task_id",
        "dag_run",
        "macros",
    }
)
# A start condition is rendered for a date before any run exists: no run, task or params.
START_NAMES = frozenset(
    {"ds", "ds_nodash", "ts", "ts_nodash", "ts_nodash_with_tz", "logical_date", "dag_id", "macros"}
)
DAG_RUN_FIELDS = frozenset(
    {"run_id", "dag_id", "logical_date", "conf", "run_type", "data_interval_start",
     "data_interval_end"}
)  # fmt: skip
# Airflow 2 names that Airflow 3 removed: refused with what to write instead.
_REMOVED = {
    "prev_ds": "macros.ds_add(ds, -1), or data_interval_start | ds",
    "next_ds": "macros.ds_add(ds, 1), or data_interval_end | ds",
    "prev_ds_nodash": "macros.ds_format(macros.ds_add(ds, -1), '%Y-%m-%d', '%Y%m%d')",
    "next_ds_nodash": "macros.ds_format(macros.ds_add(ds, 1), '%Y-%m-%d', '%Y%m%d')",
    "yesterday_ds": "macros.ds_add(ds, -1)",
    "tomorrow_ds": "macros.ds_add(ds, 1)",
    "execution_date": "logical_date",
}


class TemplateFailed(ValueError):
    """A template that could not be rendered for a run: its text and the error, one line."""


class TemplateRefused(ValueError):
    """A template refused from its text alone (syntax, an unknown name), one line."""


# ------------------------------------------------------------------------- macros


def ds_add(ds: str, days: int) -> str:
    """``YYYY-MM-DD`` ``days`` later (earlier if negative), as Airflow's ``macros.ds_add``:
    ``ds_add("2015-01-01", 5) == "2015-01-06"``."""
    if not days:
        return str(ds)
    moved = datetime.strptime(str(ds), "%Y-%m-%d") + timedelta(days=days)
    return moved.strftime("%Y-%m-%d")


def ds_format(ds: str, input_format: str, output_format: str) -> str:
    """``ds`` read with ``input_format`` and written with ``output_format``, as Airflow's
    ``macros.ds_format``: ``ds_format("2015-01-01", "%Y-%m-%d", "%m-%d-%y") == "01-01-15"``."""
    return datetime.strptime(str(ds), input_format).strftime(output_format)


# Airflow's macros.time, macros.uuid and macros.random are whole modules (random's
# function). A module reaches what it imported (uuid.os.system), which a sandbox does not
# stop: these are namespaces of the harmless functions only (no sleep).
MACROS = SimpleNamespace(
    ds_add=ds_add,
    ds_format=ds_format,
    datetime=datetime,
    timedelta=timedelta,
    time=SimpleNamespace(
        time=time.time,
        gmtime=time.gmtime,
        localtime=time.localtime,
        mktime=time.mktime,
        strftime=time.strftime,
        strptime=time.strptime,
    ),
    uuid=SimpleNamespace(uuid4=uuid.uuid4, UUID=uuid.UUID),
    random=random.random,
)
MACRO_NAMES = frozenset(vars(MACROS))


# ------------------------------------------------------------------------- filters


def _ds(value: datetime | date | None) -> str | None:
    return None if value is None else value.strftime("%Y-%m-%d")


def _ds_nodash(value: datetime | date | None) -> str | None:
    return None if value is None else value.strftime("%Y%m%d")


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _ts_nodash(value: datetime | None) -> str | None:
    return None if value is None else value.strftime("%Y%m%dT%H%M%S")


def _ts_nodash_with_tz(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("-", "").replace(":", "")


class _Instant(datetime):
    """An aware datetime that a template prints as ISO 8601 with a ``T``, as Airflow's
    (pendulum's) do: ``{{ logical_date }}`` is ``2026-11-26T00:00:00+00:00``."""

    def __str__(self) -> str:
        return self.isoformat()


def _instant(at: datetime) -> _Instant:
    return _Instant(
        at.year, at.month, at.day, at.hour, at.minute, at.second, at.microsecond, at.tzinfo,
        fold=at.fold,
    )  # fmt: skip


# ------------------------------------------------------------------------- environment


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with ``*`` and ``**`` bounded (see :data:`MAX_REPEAT`)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(n, int)
                    and len(seq) * n > MAX_REPEAT
                ):
                    raise OverflowError(f"a repetition over {MAX_REPEAT} items")
            return operator.mul(left, right)
        if (
            isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and right * abs(left).bit_length() > MAX_POWER_BITS
        ):
            raise OverflowError(f"a power over {MAX_POWER_BITS} bits")
        return operator.pow(left, right)


ENV = _Environment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
ENV.filters.update(
    ds=_ds,
    ds_nodash=_ds_nodash,
    ts=_ts,
    ts_nodash=_ts_nodash,
    ts_nodash_with_tz=_ts_nodash_with_tz,
)


@functools.lru_cache(maxsize=MAX_COMPILED)
def compiled(source: str) -> jinja2.Template:
    """``source`` compiled (once per process while it stays among the last
    :data:`MAX_COMPILED` used); a syntax error or an unknown filter raises, and so does a
    template longer than :data:`MAX_TEMPLATE`."""
    if len(source) > MAX_TEMPLATE:
        raise ValueError(f"a template of {len(source)} characters, over {MAX_TEMPLATE}")
    return ENV.from_string(source)


# ------------------------------------------------------------------------- what a run gives


@dataclass(frozen=True, slots=True)
class DagRunView:
    """``{{ dag_run }}``: the run's own fields, as Airflow names them (no methods of a
    row, nothing that reaches the store)."""

    run_id: str
    dag_id: str
    logical_date: datetime
    conf: dict[str, Any]
    run_type: str
    data_interval_start: datetime
    data_interval_end: datetime


@dataclass(frozen=True, slots=True)
class Scope:
    """What a template is rendered for: a run (or a start condition's date) and a task.

    ``logical_time`` is aware; ``zone`` is the DAG's clock, on which ``ds`` is its date.
    Without a data interval (a run by hand, a start condition) the interval is the
    logical time alone, as Airflow's for a DAG without a schedule."""

    dag_id: str
    logical_time: datetime
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    run_id: str | None = None
    task_id: str | None = None
    params: Any = None
    conf: Mapping[str, Any] | None = None
    run_type: str = "manual"
    data_interval: tuple[datetime, datetime] | None = None

    @classmethod
    def for_date(cls, dag_id: str, day: date, zone: ZoneInfo) -> Scope:
        """A start condition's: midnight of ``day`` on the DAG's clock, no run yet."""
        return cls(dag_id=dag_id, logical_time=datetime.combine(day, datetime.min.time(), zone),
                   zone=zone)  # fmt: skip


def variables(scope: Scope) -> dict[str, Any]:
    """The names a template sees, as Airflow's template context defines them; those of
    a run only when ``scope`` has one (a start condition has none)."""
    logical = _instant(scope.logical_time.astimezone(scope.zone))
    ds = logical.strftime("%Y-%m-%d")
    ts = logical.isoformat()
    out: dict[str, Any] = {
        "ds": ds,
        "ds_nodash": ds.replace("-", ""),
        "ts": ts,
        "ts_nodash": logical.strftime("%Y%m%dT%H%M%S"),
        "ts_nodash_with_tz": ts.replace("-", "").replace(":", ""),
        "logical_date": logical,
        "dag_id": scope.dag_id,
        "macros": MACROS,
    }
    if scope.run_id is None:
        return out
    start, end = scope.data_interval or (logical, logical)
    out["data_interval_start"] = _instant(start)
    out["data_interval_end"] = _instant(end)
    out["run_id"] = scope.run_id
    out["task_id"] = scope.task_id
    out["params"] = {} if scope.params is None else scope.params
    out["dag_run"] = DagRunView(
        run_id=scope.run_id,
        dag_id=scope.dag_id,
        logical_date=logical,
        conf=dict(scope.conf or {}),
        run_type=scope.run_type,
        data_interval_start=out["data_interval_start"],
        data_interval_end=out["data_interval_end"],
    )
    return out


# ------------------------------------------------------------------------- rendering


def render_text(source: str, values: Mapping[str, Any], where: str = "") -> str:
    """``source`` rendered with ``values``; :class:`TemplateFailed` says which template
    failed and why, on one line."""
    try:
        return compiled(source).render(values)
    except Exception as exc:  # a syntax error, an undefined name, a macro raising: all one
        field_ = f"{where}: " if where else ""
        raise TemplateFailed(f"{field_}template {source!r} failed: {_error(exc)}") from None


def render_value(value: Any, scope: Scope, where: str = "") -> Any:
    """``value`` (a string, or dicts and lists of them) with every template in it rendered."""
    values = variables(scope)
    return fill_strings(value, lambda at, text: render_text(text, values, at), where)


def render_trigger(trigger: T, scope: Scope) -> T:
    """``trigger`` with its template strings rendered for ``scope`` (itself if it has
    none); :class:`TemplateFailed` for a template that fails, ``ValueError`` for a value
    its class refuses once rendered. Call it off the event loop."""
    values: dict[str, Any] | None = None

    def fill(where: str, text: str) -> str:
        nonlocal values
        if values is None:
            values = variables(scope)
        return render_text(text, values, where)

    return trigger.render(fill)


# ------------------------------------------------------------------------- checking


def check(source: str, names: Iterable[str] = TASK_NAMES) -> None:
    """Refuse ``source`` (:class:`TemplateRefused`, one line) if its text alone says it
    cannot render: a syntax error, an unknown filter, a name outside ``names``, an unknown
    ``macros.`` or ``dag_run.`` attribute. It is compiled on the way, so that a worker
    that imported the DAG finds it compiled."""
    problem = _problem(source, frozenset(names))
    if problem is not None:
        raise TemplateRefused(f"template {source!r}: {problem}")


# A DAG of 10,000 sensors on one template checks it once, not 10,000 times.
@functools.lru_cache(maxsize=MAX_COMPILED)
def _problem(source: str, known: frozenset[str]) -> str | None:
    try:
        compiled(source)
        tree = ENV.parse(source)
    except (TemplateSyntaxError, ValueError) as exc:
        return _error(exc)
    undeclared = meta.find_undeclared_variables(tree)
    for name in sorted(undeclared - known):
        hint = f" (removed in Airflow 3: use {_REMOVED[name]})" if name in _REMOVED else ""
        return f"unknown name {name!r}{hint}; known: {', '.join(sorted(known))}"
    members = {"macros": MACRO_NAMES, "dag_run": DAG_RUN_FIELDS}
    for node in tree.find_all(nodes.Getattr):
        inner = node.node
        if isinstance(inner, nodes.Name) and inner.name in members and inner.name in undeclared:
            allowed = members[inner.name]
            if node.attr not in allowed:
                shown = ", ".join(f"{inner.name}.{a}" for a in sorted(allowed))
                return f"unknown {inner.name}.{node.attr}; known: {shown}"
    return None


def check_fields(templates: Mapping[str, str], names: Iterable[str], where: str) -> None:
    """:func:`check` each of a declaration's templates (by field), as a :class:`DagError`
    naming ``where`` and the field."""
    for at, source in templates.items():
        try:
            check(source, names)
        except TemplateRefused as exc:
            raise DagError(f"{where}: field {at}: {exc}") from None


def declared_templates(templates: object, where: str) -> dict[str, Any]:
    """A task's ``templates=`` checked as it is declared: a dict with string keys whose
    template strings (at any depth) pass :func:`check`; a :class:`DagError` if not."""
    if templates is None:
        return {}
    if not isinstance(templates, Mapping) or not all(isinstance(k, str) for k in templates):
        raise DagError(f"{where}: templates must be a dict with string keys, not {templates!r}")
    found: dict[str, str] = {}

    def note(at: str, text: str) -> str:
        found[at] = text
        return text

    fill_strings(dict(templates), note, "templates")
    check_fields(found, TASK_NAMES, where)
    return dict(templates)


def has_templates(value: Any) -> bool:
    """Whether any string in ``value`` (dicts and lists, any depth) is a template."""
    if is_template(value):
        return True
    if isinstance(value, dict):
        return any(has_templates(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_templates(v) for v in value)
    return False


def _error(exc: BaseException) -> str:
    """An exception as one line: its class and message (a syntax error with its line)."""
    text = " ".join(str(exc).split()) or "no message"
    if isinstance(exc, TemplateSyntaxError) and exc.lineno and "\n" in (exc.source or ""):
        text += f" (line {exc.lineno})"
    return f"{type(exc).__name__}: {text}"


def utc(text: str) -> datetime:
    """An ISO 8601 instant from the store, aware (UTC when written without an offset)."""
    at = datetime.fromisoformat(text)
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
