"""A DAG's params and a run's conf: what ``ctx.params`` holds.

A DAG declares its params as a dict of defaults or as a pydantic model class
(``DAG(..., params=...)``); a run carries a conf, the JSON object it was triggered with
(``slotless trigger DAG --conf JSON``). :func:`resolve` gives the run's params:

* no params declared: the conf as given (a dict, empty without one);
* a dict of defaults: the defaults updated with the conf; a conf key the defaults do not
  name is refused (a typo must not run silently with the default);
* a model class: the conf validated into an instance of the model; a key the model has no
  field for is refused whatever the model's ``extra`` setting, a wrong type is refused
  with pydantic's message for that field.

The same function checks a conf before a run is created and gives ``ctx.params`` when a
task runs, so what was accepted is what the tasks see.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

Params = Mapping[str, Any] | type[BaseModel] | None


class BadConf(ValueError):
    """A conf the DAG's params refuse: not a JSON object, an unknown key, a wrong type.
    ``fields`` says what was wrong with each top-level param it names (param -> message),
    so that a form can show each beside its field (the web page's trigger form)."""

    def __init__(self, message: str, fields: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.fields: dict[str, str] = dict(fields or {})


def check_declared(params: object) -> None:
    """Raise ``TypeError`` unless ``params`` is None, a JSON-able dict or a model class."""
    if params is None or (isinstance(params, type) and issubclass(params, BaseModel)):
        return
    if not isinstance(params, Mapping):
        raise TypeError(
            f"params must be a dict of defaults or a pydantic model class, not {params!r}"
        )
    try:
        json.dumps(dict(params))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"params defaults must be JSON values: {exc}") from None


def parse_conf(text: str | None) -> dict[str, Any] | None:
    """A conf given as JSON text (None: no conf); :class:`BadConf` unless a JSON object."""
    if text is None:
        return None
    try:
        conf = json.loads(text)
    except ValueError as exc:
        raise BadConf(f"--conf is not JSON: {exc}") from None
    if not isinstance(conf, dict):
        raise BadConf(f"--conf must be a JSON object, not {type(conf).__name__}: {text}")
    return conf


def resolve(params: Params, conf: Mapping[str, Any] | None, dag_id: str = "") -> Any:
    """The run's params: ``params`` (as declared) with ``conf`` applied; BadConf if refused."""
    given = dict(conf or {})
    whose = f"DAG {dag_id!r}" if dag_id else "the DAG"
    if params is None:
        return given
    if isinstance(params, type):
        fields = set()
        for name, info in params.model_fields.items():
            fields.add(name)
            if isinstance(info.alias, str):
                fields.add(info.alias)
        _refuse_unknown(given, fields, whose)
        try:
            return params.model_validate(given)
        except ValidationError as exc:
            raise BadConf(f"bad conf for {whose}: {_one_line(exc)}", _by_field(exc)) from None
    _refuse_unknown(given, set(params), whose)
    # A copy: a task that changes ctx.params must not change the DAG's defaults.
    return copy.deepcopy(dict(params)) | given


def _refuse_unknown(given: Mapping[str, Any], known: set[str], whose: str) -> None:
    unknown = sorted(set(given) - known)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        declared = ", ".join(sorted(known)) or "none"
        raise BadConf(
            f"bad conf for {whose}: unknown param {names} (declared: {declared})",
            {k: "unknown param" for k in unknown},
        )


def _one_line(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "conf"
        got = f" (got {e['input']!r})" if "input" in e and e["type"] != "missing" else ""
        parts.append(f"{where}: {e['msg']}{got}")
    return "; ".join(parts)


def _by_field(exc: ValidationError) -> dict[str, str]:
    """Each top-level param's first error, as pydantic says it (a nested one with its path)."""
    out: dict[str, str] = {}
    for e in exc.errors(include_url=False):
        if not e["loc"]:
            continue
        inner = ".".join(str(p) for p in e["loc"][1:])
        got = f" (got {e['input']!r})" if "input" in e and e["type"] != "missing" else ""
        out.setdefault(str(e["loc"][0]), f"{inner + ': ' if inner else ''}{e['msg']}{got}")
    return out
