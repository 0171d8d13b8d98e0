"""What a running task sees: ``ctx``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, NoReturn

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


@dataclass
class TaskContext:
    """Passed to every task callable.

    ``inputs`` maps each parent's task id to its output; a mapped parent gives the list of
    its instances' outputs in index order. A mapped instance also sees ``item``, ``index``
    and ``total``. ``params`` is the run's params: the DAG's defaults updated with the
    run's conf (a dict), or the conf validated into the DAG's params model (an instance).
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
    _logs: list[tuple[float, str]] = field(default_factory=list, repr=False)
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
