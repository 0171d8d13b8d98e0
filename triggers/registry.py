"""The allow-list of loadable trigger classes.

Only classes listed here can be rebuilt from a row: the built-ins, classes registered
under the ``slotless.triggers`` entry-point group, classes named in
``SLOTLESS_ALLOWED_TRIGGERS`` (comma-separated classpaths, for deployments without
packaging), and classes registered in-process with :func:`register`.

Importing a trigger's module is the module's own code, and may take seconds (a provider
package importing its SDK). An event loop must not run it: :func:`resolve` imports in a
thread of its own (one for the process, so imports never contend for the import lock
among themselves), caches the classes it found, and logs an import slower than
``SLOW_IMPORT`` seconds with the module's name. :func:`trigger_class` then answers from
the cache.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points
from typing import Any, TypeVar

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

log = logging.getLogger("slotless.triggers")

# An import longer than this is logged (a WARNING naming the module), from the import
# thread: the loop went on, but the waits of that class waited for it.
SLOW_IMPORT = 0.5

# classpath -> its class, once imported (allow-listing is still asked at every call: the
# allow-list may shrink).
_resolved: dict[str, type[BaseTrigger]] = {}
# classpath -> why the import thread could not import it: raised once by the next
# trigger_class() instead of importing again (on the caller's thread, maybe a loop's).
_failed: dict[str, Exception] = {}
_importer: ThreadPoolExecutor | None = None
_importer_lock = threading.Lock()
# What the import thread imports now, and since when (the watchdog asks: importing()).
_importing: tuple[str, float] | None = None

T = TypeVar("T")


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
    """The allow-listed class of ``classpath``, imported here unless :func:`resolve` did
    (an event loop awaits :func:`resolve` first: see the module's docstring)."""
    if classpath in _registered:
        return _registered[classpath]
    if classpath not in BUILTINS and classpath not in allowed_classpaths():
        raise TriggerLoadError(
            f"trigger class {classpath} is not allow-listed (register it under the "
            "'slotless.triggers' entry point or in SLOTLESS_ALLOWED_TRIGGERS)"
        )
    cls = _resolved.get(classpath)
    if cls is not None:
        return cls
    failed = _failed.pop(classpath, None)
    if failed is not None:
        if isinstance(failed, TriggerLoadError):
            raise failed
        raise TriggerLoadError(f"{type(failed).__name__}: {failed}") from failed
    cls = _import_class(classpath)
    _resolved[classpath] = cls
    return cls


def _import_class(classpath: str) -> type[BaseTrigger]:
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


def is_resolved(classpath: str) -> bool:
    """Whether :func:`trigger_class` answers ``classpath`` without importing anything."""
    return classpath in _registered or classpath in _resolved


async def resolve(classpaths: Iterable[str]) -> None:
    """Import the modules of the allow-listed ``classpaths`` not imported yet, in the
    import thread, so that :func:`trigger_class` then answers them from the cache. A class
    that cannot be imported is remembered and raised by the next :func:`trigger_class`
    (the import is not run again on the caller's thread); a classpath not allow-listed is
    left for :func:`trigger_class` to refuse. Awaits nothing when all are resolved."""
    for classpath in classpaths:
        if is_resolved(classpath) or classpath in _failed:
            continue
        module_name = classpath.rpartition(".")[0]
        await in_import_thread(module_name, functools.partial(_resolve_one, classpath))


def _resolve_one(classpath: str) -> None:
    # The installed entry points' first scan (~30 ms; cached) here too, not on the loop at
    # the first is_allowed() of a class outside the built-ins. A classpath not allowed is
    # not imported, nor remembered as failed: trigger_class() refuses it, now and after it
    # is allowed.
    if classpath not in BUILTINS and classpath not in allowed_classpaths():
        return
    try:
        trigger_class(classpath)
    except Exception as exc:
        _failed[classpath] = exc


async def in_import_thread(module_name: str, fn: Callable[[], T]) -> T:
    """``fn()`` (an import of ``module_name``'s code) in the import thread, awaited; a
    WARNING names the module when it took longer than :data:`SLOW_IMPORT`."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_import_executor(), _timed_import, module_name, fn)


def _timed_import(module_name: str, fn: Callable[[], T]) -> T:
    global _importing
    began = time.monotonic()
    _importing = (module_name, began)
    try:
        return fn()
    finally:
        _importing = None
        took = time.monotonic() - began
        if took >= SLOW_IMPORT:
            log.warning(
                "importing module %s took %.1f s (in the import thread: the event loop "
                "went on; waits of its classes started once it was done)",
                module_name,
                took,
            )


def importing() -> tuple[str, float] | None:
    """The module the import thread is importing now, and since when (monotonic)."""
    return _importing


def _import_executor() -> ThreadPoolExecutor:
    global _importer
    with _importer_lock:
        if _importer is None:
            _importer = ThreadPoolExecutor(1, thread_name_prefix="trigger-import")
        return _importer


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
