"""AirflowTrigger: a trigger class written for Apache Airflow (3.x), run unmodified.

The adapter stores what Airflow's own ``serialize()`` gives, ``(classpath, kwargs)``, as its
two fields; the triggerer rebuilds the Airflow trigger from them, iterates its ``run()``
(held open for the whole wait, as Airflow does: see ``held``), turns its first
``TriggerEvent`` into a slotless event (payload kept), and calls its ``cleanup()`` when the
wait ends or moves to another triggerer. Equal (classpath, kwargs) are one wait, held once.

>>> AirflowTrigger(
...     "airflow.providers.standard.triggers.file.FileTrigger",
...     filepath="/in/x.csv",
...     poke_interval=5,
... )  # doctest: +SKIP

Airflow is an optional extra (``pip install 'slotless[airflow]'``); without it, building an
AirflowTrigger says so. The Airflow class must be allow-listed like any trigger class
(``AIRFLOW_BUILTINS``, the ``slotless.triggers`` entry points, ``SLOTLESS_ALLOWED_TRIGGERS``):
no row can make the triggerer import an arbitrary module. See docs/airflow-triggers.md.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from datetime import date, datetime, timedelta
from typing import Any, ClassVar, Self

from pydantic import Field, field_validator, model_validator

from .base import BaseTrigger, Fill, TriggerEvent, fill_strings
from .context import TriggerContext
from .loopmeter import timed
from .registry import in_import_thread

EXTRA_HINT = "pip install 'slotless[airflow]'"

# The providers' triggers that need no connection: allowed without configuration.
AIRFLOW_BUILTINS = (
    "airflow.providers.standard.triggers.file.FileTrigger",
    "airflow.providers.standard.triggers.temporal.DateTimeTrigger",
    "airflow.providers.standard.triggers.temporal.TimeDeltaTrigger",
)

# How a kwarg JSON cannot hold natively is tagged in the stored kwargs.
_TAG = "__airflow_type__"


class AirflowNotInstalled(ValueError):
    """Apache Airflow is not importable in this process."""


def require_airflow() -> None:
    """Raise :class:`AirflowNotInstalled`, naming the extra, when Airflow is missing.

    ``find_spec`` does not import Airflow (that takes over a second)."""
    if importlib.util.find_spec("airflow") is None:
        raise AirflowNotInstalled(
            "AirflowTrigger needs Apache Airflow (apache-airflow-core 3.x) in this "
            f"environment: {EXTRA_HINT}"
        )


def airflow_allowed(classpath: str) -> bool:
    from .registry import is_allowed

    return classpath in AIRFLOW_BUILTINS or is_allowed(classpath)


class AirflowTrigger(BaseTrigger):
    """Hosts an Airflow ``BaseTrigger`` subclass: ``AirflowTrigger(classpath, **kwargs)``.

    Built positionally, the Airflow class is instantiated once here and its own
    ``serialize()`` is stored (so ``TimeDeltaTrigger(delta=...)`` is stored as the moment it
    computed, and bad kwargs fail where the DAG is written). :func:`from_airflow` does the
    same from an instance.
    """

    trigger_classpath: str
    trigger_kwargs: dict[str, Any] = Field(default_factory=dict)
    # The Airflow trigger paces itself inside run(); this is only the base of the backoff
    # before run() is started again after a passing failure (OSError, TimeoutError).
    poke_interval: float = Field(default=5.0, gt=0)

    # run() is held open for the whole wait (one coroutine per distinct wait), not
    # re-entered at each check: Airflow triggers loop and sleep inside run().
    held: ClassVar[bool] = True

    def __init__(self, trigger_classpath: str | None = None, /, **data: Any) -> None:
        if trigger_classpath is None:
            super().__init__(**data)
            return
        require_airflow()
        _check_allowed(trigger_classpath)
        instance = airflow_class(trigger_classpath)(**data)
        classpath, kwargs = instance.serialize()
        fields: dict[str, Any] = {
            "trigger_classpath": classpath,
            "trigger_kwargs": encode_kwargs(kwargs),
        }
        super().__init__(**fields)

    @model_validator(mode="before")
    @classmethod
    def _airflow_present(cls, data: Any) -> Any:
        require_airflow()
        return data

    @field_validator("trigger_classpath")
    @classmethod
    def _allowed(cls, value: str) -> str:
        _check_allowed(value)
        return value

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.trigger_kwargs.items()))
        return f"airflow {self.trigger_classpath.rsplit('.', 1)[-1]}({args})"

    def blame(self) -> str:
        return self.trigger_classpath

    def render(self, fill: Fill) -> Self:
        """Template strings anywhere in the Airflow kwargs are filled too (a copy, not
        validated again: validating would need Airflow's class, imported off the loop)."""
        kwargs = fill_strings(self.trigger_kwargs, fill, "trigger_kwargs")
        if kwargs is self.trigger_kwargs:
            return self
        return self.model_copy(update={"trigger_kwargs": kwargs})

    def airflow_trigger(self) -> Any:
        """A new instance of the hosted Airflow trigger, from the stored kwargs."""
        return airflow_class(self.trigger_classpath)(**decode_kwargs(self.trigger_kwargs))

    async def run(self, ctx: TriggerContext) -> AsyncIterator[TriggerEvent]:
        export_connections()
        # Its module is imported in the import thread the first time (a provider's import
        # takes seconds: on the loop, a triggerer would miss its lease renewals).
        cls = await airflow_class_off_loop(self.trigger_classpath)
        trigger = cls(**decode_kwargs(self.trigger_kwargs))
        try:
            # aclosing: when this wait ends, cleanup() runs now, not when the GC gets to it.
            async with contextlib.aclosing(airflow_events(trigger, self.trigger_classpath)) as ev:
                async for event in ev:
                    yield slotless_event(event)
        except Exception as exc:
            clearer = _clearer(exc)
            if clearer is exc:
                raise
            raise clearer from exc


async def airflow_events(trigger: Any, blame: str) -> AsyncGenerator[Any, None]:
    """The events an Airflow trigger instance's ``run()`` yields, as Airflow's own objects.

    Each step of its ``run()`` is timed under ``blame`` (a ``run()`` that retries at once
    keeps the loop busy without blocking it, and the watchdog names it). As in Airflow,
    ``cleanup()`` runs whenever the trigger leaves this process, and an exception in it is
    not the task's failure."""
    events = trigger.run()
    try:
        while True:
            try:
                event = await timed(anext(events), blame)
            except StopAsyncIteration:
                return
            yield event
    finally:
        with contextlib.suppress(Exception):
            await trigger.cleanup()


def from_airflow(trigger: Any) -> AirflowTrigger:
    """An :class:`AirflowTrigger` from an Airflow trigger instance, by its ``serialize()``.

    >>> from airflow.providers.standard.triggers.file import FileTrigger  # doctest: +SKIP
    >>> from_airflow(FileTrigger(filepath="/in/x.csv", poke_interval=5))  # doctest: +SKIP
    """
    require_airflow()
    base = importlib.import_module("airflow.triggers.base").BaseTrigger
    if not isinstance(trigger, base):
        raise TypeError(f"{type(trigger).__name__} is not an Airflow BaseTrigger")
    classpath, kwargs = trigger.serialize()
    return AirflowTrigger(trigger_classpath=classpath, trigger_kwargs=encode_kwargs(kwargs))


def _check_allowed(classpath: str) -> None:
    if not airflow_allowed(classpath):
        raise ValueError(
            f"Airflow trigger class {classpath} is not allow-listed (register it under the "
            "'slotless.triggers' entry point or in SLOTLESS_ALLOWED_TRIGGERS)"
        )


# classpath -> its Airflow class, once imported by airflow_class_off_loop.
_imported: dict[str, type] = {}


async def airflow_class_off_loop(classpath: str) -> type:
    """:func:`airflow_class`, its module imported in the import thread the first time
    (``triggers.registry.in_import_thread``: a slow import is logged with its name)."""
    _check_allowed(classpath)  # every time: the allow-list may shrink
    cls = _imported.get(classpath)
    if cls is None:
        module_name = classpath.rpartition(".")[0]
        cls = await in_import_thread(module_name, functools.partial(airflow_class, classpath))
        _imported[classpath] = cls
    return cls


def airflow_class(classpath: str) -> type:
    """Import an allow-listed Airflow trigger class, checking that it is one."""
    require_airflow()
    _check_allowed(classpath)
    return airflow_trigger_class(classpath)


def airflow_trigger_class(classpath: str) -> type:
    """Import an Airflow trigger class by classpath, checking that it subclasses Airflow's
    ``BaseTrigger``. No allow-list: ``slotless airflow-triggerer`` serves an Airflow
    deployment, whose own triggerer imports whatever class its DAGs deferred to."""
    module_name, _, name = classpath.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot import Airflow trigger class {classpath}: {exc}") from exc
    base = importlib.import_module("airflow.triggers.base").BaseTrigger
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{classpath} is not an Airflow BaseTrigger subclass")
    return cls


# -- kwargs and payloads ---------------------------------------------------------------


def encode_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Airflow's kwargs as JSON: datetimes and timedeltas tagged, anything else refused."""
    out = json.loads(json.dumps(dict(kwargs), default=_tagged))
    assert isinstance(out, dict)
    return out


def _tagged(value: Any) -> Any:
    if isinstance(value, datetime):
        return {_TAG: "datetime", "value": value.isoformat()}
    if isinstance(value, timedelta):
        return {_TAG: "timedelta", "seconds": value.total_seconds()}
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(
        f"an Airflow trigger kwarg of type {type(value).__name__} cannot be stored "
        "(JSON, datetime and timedelta can)"
    )


def decode_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _untagged(v) for k, v in kwargs.items()}


def _untagged(value: Any) -> Any:
    if isinstance(value, dict):
        tag = value.get(_TAG)
        if tag == "datetime":
            return datetime.fromisoformat(value["value"])
        if tag == "timedelta":
            return timedelta(seconds=value["seconds"])
        return {k: _untagged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    return value


# The providers' convention: a payload dict whose "status" is one of these reports a
# failure, and its operator's execute_complete() raises with the payload's "message"
# (S3KeyTrigger's {"status": "error", "message": ...}, a job trigger's "failed", a wait's
# "timeout"). Any other status ("success", "running", none) is an event like any other.
FAILED_STATUSES = frozenset({"error", "failed", "timeout"})


def slotless_event(event: Any) -> TriggerEvent:
    """Airflow's TriggerEvent as a slotless event. The payload is kept, made JSON (dates as
    ISO strings); Airflow 3's task-ending events become a payload (success) or an error,
    and so does a payload whose ``status`` says the trigger failed (:data:`FAILED_STATUSES`:
    the task fails with its ``message``)."""
    state = getattr(event, "task_instance_state", None)
    if state is not None:
        state = str(getattr(state, "value", state))
        if state == "success":
            return TriggerEvent(payload={"state": state, "xcoms": _plain(event.xcoms)})
        return TriggerEvent(error=f"the Airflow trigger ended the task {state}")
    payload = _plain(event.payload)
    failure = failed_status(payload)
    if failure is not None:
        return TriggerEvent(payload=payload, error=failure)
    return TriggerEvent(payload=payload)


def failed_status(payload: Any) -> str | None:
    """What a provider trigger's failure payload says (``status`` of ``error``, ``failed``
    or ``timeout``, with its ``message``), or None for any other payload."""
    if not isinstance(payload, dict):
        return None
    status = payload.get("status")
    if not isinstance(status, str) or status.lower() not in FAILED_STATUSES:
        return None
    message = payload.get("message")
    if message is None or message == "":
        return f"the Airflow trigger reported status {status!r} (no message)"
    return f"the Airflow trigger reported status {status!r}: {message}"


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=_plain_one))


def _plain_one(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"the event payload holds a {type(value).__name__}, which is not JSON")


# -- connections -----------------------------------------------------------------------


def export_connections(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Make slotless connections visible to Airflow's ``BaseHook.get_connection``.

    Both are URIs in the environment: ``SLOTLESS_CONN_X`` is exported as
    ``AIRFLOW_CONN_X`` unless that is set already, so Airflow's own environment-variable
    secrets backend resolves it. Nothing reaches an Airflow metadata database.
    """
    prefix = "SLOTLESS_CONN_"
    for key, value in list(environ.items()):
        if key.startswith(prefix):
            environ.setdefault("AIRFLOW_CONN_" + key[len(prefix) :], value)


def _clearer(exc: Exception) -> Exception:
    """An Airflow connection lookup that failed, said in slotless's terms."""
    if type(exc).__name__ == "AirflowNotFoundException" and "conn_id" in str(exc):
        return LookupError(
            f"{exc}: an Airflow trigger's connections are slotless connections; set "
            "SLOTLESS_CONN_<ID> (or AIRFLOW_CONN_<ID>) to its URI in the triggerer's "
            "environment (there is no Airflow metadata database)"
        )
    return exc
