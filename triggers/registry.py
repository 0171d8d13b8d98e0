"""The allow-list of loadable trigger classes.

Only classes listed here can be rebuilt from a row: the built-ins, classes registered
under the ``slotless.triggers`` entry-point group, classes named in
``SLOTLESS_ALLOWED_TRIGGERS`` (comma-separated classpaths, for deployments without
packaging), and classes registered in-process with :func:`register`.
"""

from __future__ import annotations

import functools
import importlib
import os
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from .base import BaseTrigger

BUILTINS = (
    "triggers.files.FileTrigger",
    "triggers.temporal.DateTimeTrigger",
    "triggers.temporal.TimeDeltaTrigger",
    "triggers.s3.S3KeyTrigger",
    "triggers.sftp.SFTPFileTrigger",
    "triggers.external.ExternalDagRunTrigger",
    "triggers.http.HttpTrigger",
    "triggers.events.EventTrigger",
    "triggers.people.Approval",
    "triggers.people.Choice",
    "triggers.people.BranchChoice",
    "triggers.people.Form",
    # Hosts Airflow trigger classes; those are allow-listed apart (triggers/airflow.py).
    "triggers.airflow.AirflowTrigger",
)

_registered: dict[str, type[BaseTrigger]] = {}


class TriggerLoadError(ValueError):
    """A trigger row that cannot become a trigger: refused classpath or invalid kwargs."""


def register(cls: type[BaseTrigger]) -> type[BaseTrigger]:
    """Allow ``cls`` in this process (usable as a class decorator)."""
    _registered[cls.classpath()] = cls
    return cls


@functools.cache
def _entry_point_classpaths(scan: Any) -> frozenset[str]:
    """The installed ``slotless.triggers`` entry points, read once per process (keyed by
    the scanning function, so that a test can swap it): a scan costs ~30 ms, and a
    worker deferring on a plugin trigger class asked twice per deferral."""
    return frozenset(ep.value.replace(":", ".") for ep in scan(group="slotless.triggers"))


def allowed_classpaths() -> set[str]:
    paths = set(BUILTINS) | set(_registered)
    paths |= _entry_point_classpaths(entry_points)
    env = os.environ.get("SLOTLESS_ALLOWED_TRIGGERS", "")
    paths |= {p.strip() for p in env.split(",") if p.strip()}
    return paths


def is_allowed(classpath: str) -> bool:
    # Built-ins first: scanning the installed entry points costs milliseconds a call.
    return classpath in _registered or classpath in BUILTINS or classpath in allowed_classpaths()


def trigger_class(classpath: str) -> type[BaseTrigger]:
    if classpath in _registered:
        return _registered[classpath]
    if classpath not in BUILTINS and classpath not in allowed_classpaths():
        raise TriggerLoadError(
            f"trigger class {classpath} is not allow-listed (register it under the "
            "'slotless.triggers' entry point or in SLOTLESS_ALLOWED_TRIGGERS)"
        )
    module_name, _, name = classpath.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise TriggerLoadError(f"cannot import trigger class {classpath}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseTrigger)):
        hint = ""
        if module_name.startswith("airflow."):
            hint = " (an Airflow trigger: wrap it in triggers.airflow.AirflowTrigger)"
        raise TriggerLoadError(f"{classpath} is not a BaseTrigger subclass{hint}")
    return cls


def load_trigger(classpath: str, kwargs: dict[str, Any] | str) -> BaseTrigger:
    """Rebuild a trigger from its row, or raise :class:`TriggerLoadError` saying why."""
    import json

    cls = trigger_class(classpath)
    try:
        data = json.loads(kwargs) if isinstance(kwargs, str) else kwargs
        return cls.model_validate(data)
    except (ValidationError, ValueError, TypeError) as exc:
        raise TriggerLoadError(f"invalid kwargs for {classpath}: {_one_line(exc)}") from exc


def _one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'kwargs'}: {e['msg']}" for e in exc.errors()
        )
    return str(exc)
