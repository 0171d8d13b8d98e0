"""What a running task sees: ``ctx``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, NoReturn

from triggers.limits import MAX_SERIALIZED_BYTES, storable_text

from .assets import check_uri, extra_json
from .durations import Duration, seconds

if TYPE_CHECKING:
    from triggers.base import BaseTrigger


class TaskDeferred(Exception):
    """Raised by :meth:`TaskContext.defer`; the worker turns it into a DEFERRED row."""

    def __init__(
        self, trigger: BaseTrigger, method: str, kwargs: dict[str, Any], timeout: float | None
    ) -> None:
        super().__init__(f"deferred on {trigger.describe()}")
        self.trigger = trigger
        self.method = method
        self.kwargs = kwargs
        self.timeout = timeout

    def __reduce__(self) -> Any:  # crosses the pipe from a process-isolated slot
        return (TaskDeferred, (self.trigger, self.method, self.kwargs, self.timeout))


# The most a named value (ctx.push) may hold, in bytes of its compact JSON: the bound of a
# trigger's kwargs and an event's payload (triggers/limits.py), for the same reason: every
# task that pulls it reads it back whole. Pass a reference (a path, a key) to more.
MAX_VALUE_BYTES = MAX_SERIALIZED_BYTES
MAX_KEY_CHARS = 200  # a key is a name, not data (and UTF-8 text without NUL)


class NamedValueError(ValueError):
    """A value ``ctx.push`` refuses, or a ``ctx.pull`` that cannot be served: one line
    that fails the attempt (its message names the key or the task)."""


@dataclass(frozen=True, slots=True)
class Published:
    """What an ended task left for its downstream: its output and its named values. A
    mapped task's are lists in map-index order (None where an instance left nothing)."""

    output: Any = None
    values: dict[str, Any] = field(default_factory=dict)


# Reads what an upstream task published (executor/pulling.py builds it per attempt): raises
# NamedValueError for a task that is not upstream.
Reader = Callable[[str], Published]


@dataclass
class TaskContext:
    """Passed to every task callable.

    ``inputs`` maps each parent's task id to its output; a mapped parent gives the list of
    its instances' outputs in index order. A mapped instance also sees ``item``, ``index``
    and ``total``. ``params`` is the run's params: the DAG's defaults updated with the
    run's conf (a dict), or the conf validated into the DAG's params model (an instance).
    ``templates`` is the task's ``templates=`` rendered for this run (docs/templates.md).
    """

    run_id: str
    dag_id: str
    task_id: str
    logical_date: date
    attempt: int
    max_attempts: int
    inputs: dict[str, Any] = field(default_factory=dict)
    map_index: int = -1
    item: Any = None
    total: int | None = None
    event: Any = None  # payload of the trigger event that resumed this task, if any
    params: Any = field(default_factory=dict)  # the DAG's params with the run's conf
    # A scheduled run's data interval [start, end), aware, UTC (None for a run by hand).
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    start_event: Any = None  # the payload of the start condition that started the run
    # The task's templates= rendered for this run, by key (Airflow's templates_dict).
    templates: dict[str, Any] = field(default_factory=dict)
    _logs: list[tuple[float, str]] = field(default_factory=list, repr=False)
    # ctx.push's values as JSON, key -> text: recorded with the attempt's SUCCESS only.
    _pushed: dict[str, str] = field(default_factory=dict, repr=False)
    _reader: Reader | None = field(default=None, repr=False)
    _pulled: dict[str, Published] = field(default_factory=dict, repr=False)
    # Extras for the asset events of this attempt's outlets: URI -> JSON (ctx.asset_event).
    _asset_extras: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def ds(self) -> str:
        """The logical date as ``YYYY-MM-DD``, as in Airflow templates."""
        return self.logical_date.isoformat()

    @property
    def index(self) -> int | None:
        return self.map_index if self.map_index >= 0 else None

    @property
    def lines(self) -> list[tuple[float, str]]:
        """This attempt's log lines so far, as ``(epoch seconds, text)``."""
        return self._logs

    def log(self, message: object) -> None:
        """Add a line to this task's log (its worker writes it within about half a
        second while the attempt runs, or with the attempt's outcome)."""
        self._logs.append((time.time(), str(message)))

    def defer(
        self,
        trigger: BaseTrigger,
        *,
        method: str = "__call__",
        kwargs: dict[str, Any] | None = None,
        timeout: Duration | None = None,
    ) -> NoReturn:
        """Give the slot back until ``trigger`` fires, then resume at ``method``.

        ``method`` names a function registered with ``@task.method`` (called as
        ``fn(ctx, **kwargs)``) or ``"__call__"`` to run the task again; either way
        ``ctx.event`` holds the event's payload. ``timeout`` bounds the wait.
        """
        raise TaskDeferred(trigger, method, dict(kwargs or {}), seconds(timeout))

    def push(self, key: str, value: Any) -> None:
        """Publish ``value`` under ``key`` beside the return value, for downstream tasks
        to ``pull``. Stored as JSON (at most :data:`MAX_VALUE_BYTES`) in the transaction
        that records this attempt's SUCCESS: a failed or deferred attempt's pushes are
        dropped; a clear forgets them. Pushing a key again replaces it."""
        # A key is stored as text, not JSON: one PostgreSQL cannot hold (a NUL) would fail
        # the transaction recording the success, again at every retry of it.
        if (
            not isinstance(key, str)
            or not key
            or len(key) > MAX_KEY_CHARS
            or not storable_text(key)
        ):
            raise NamedValueError(f"ctx.push: the key must be a name of 1 to {MAX_KEY_CHARS} "
                              f"characters, not {key!r:.60}")  # fmt: skip
        try:
            text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise NamedValueError(f"ctx.push({key!r}): the value is not JSON: {exc}") from None
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_VALUE_BYTES:
            raise NamedValueError(
                f"ctx.push({key!r}): the value is {size} bytes of JSON, over the limit of "
                f"{MAX_VALUE_BYTES} bytes (64 KiB): pass a reference (a path, a key)"
            )
        self._pushed[key] = text

    def pull(self, task_id: str, key: str | None = None, default: Any = None) -> Any:
        """The value ``task_id`` pushed under ``key``, or its return value without a key
        (``default`` if it left none: it was skipped, failed, or did not push that key).
        A mapped task's give a list in map-index order. ``task_id`` must be upstream of
        this task (a parent, or a parent's ancestor): only those have ended for sure."""
        if task_id in self.inputs and key is None:
            value = self.inputs[task_id]
        else:
            found = self._pulled.get(task_id)
            if found is None:
                if self._reader is None:
                    raise NamedValueError(f"ctx.pull({task_id!r}): nothing to read outside a "
                                      "task's attempt")  # fmt: skip
                found = self._pulled[task_id] = self._reader(task_id)
            value = found.output if key is None else found.values.get(key)
        return default if value is None else value

    def asset_event(self, asset: Any, *, extra: dict[str, Any]) -> None:
        """Attach ``extra`` (a JSON object, at most 64 KiB) to the event this task's
        SUCCESS records for ``asset``, one of its ``outlets``; called again, the last wins.
        Consumers read it in ``ctx.triggering_asset_events``."""
        uri = check_uri(getattr(asset, "uri", asset))
        self._asset_extras[uri] = extra_json(extra) or "{}"

    @property
    def triggering_asset_events(self) -> dict[str, list[dict[str, Any]]]:
        """The asset events that started this run (an asset-scheduled DAG's run): URI ->
        its events, oldest first, each ``{"id", "uri", "ts", "source", "extra", ...}``;
        empty for any other run."""
        ev = self.start_event
        if isinstance(ev, dict) and isinstance(ev.get(ASSET_EVENTS), dict):
            return ev[ASSET_EVENTS]
        return {}


# The key of an asset-triggered run's start event under which its events are kept.
ASSET_EVENTS = "triggering_asset_events"
