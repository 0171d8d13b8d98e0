"""Typed views of the store that ``slotless status``, the web page and the JSON API share.

A view is read once and then only read: frozen dataclasses, built by :func:`.status.collect`
(and the store's read-only views, :mod:`executor.store.inspecting`). The CLI prints one,
the page renders one with its template (the page and its live blocks, the same template)
and ``/api/status`` sends :meth:`StatusView.to_json`, so none of the three can read a key
the others do not have.

Why dataclasses and not pydantic models: nothing here is validated (every value comes from
our own rows), a status read builds hundreds of these per page poll, and the store's views
they are built from are dataclasses already. The JSON is :func:`dataclasses.asdict`, field
order being key order; pydantic's ``TypeAdapter`` reads these classes as they are, should
``/api/status`` ever join the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from executor.states import RUN_TERMINAL
from executor.store.viewrows import EventRow

WAITING = ("DEFERRED", "SENSING", "RETRYING")


def task_name(task_id: str, map_index: int) -> str:
    """``task`` or, for an instance of a mapped task, ``task[3]``."""
    return task_id if map_index < 0 else f"{task_id}[{map_index}]"


@dataclass(frozen=True, slots=True)
class RunShown:
    """A recent run with its task instances by state."""

    run_id: str
    dag_id: str
    logical_date: str
    state: str
    created_at: float
    ended_at: float | None
    tasks: dict[str, int]  # task instances by state (a mapped task counts as its instances)
    reason: str | None  # why it paused, failed fast or was cancelled
    logical_time: str | None = None  # ISO 8601, UTC (None: a run of a previous release)
    logical_shown: str = ""  # executor.runnames.logical_shown: "2026-11-26 06:00"
    run_type: str | None = None  # scheduled | manual | backfill | event

    @property
    def finished(self) -> bool:
        return self.state in RUN_TERMINAL

    def took(self, now: float) -> float:
        """Seconds from its creation to its end, or to ``now`` while it goes on."""
        return (self.ended_at or now) - self.created_at


@dataclass(frozen=True, slots=True)
class Attention:
    """A run a person must look at, and what to do about it."""

    run_id: str
    dag_id: str
    state: str
    why: str
    todo: str


@dataclass(frozen=True, slots=True)
class WaitingTask:
    """A task in one of the waiting states; its class says which (and what it carries)."""

    run_id: str
    task_id: str
    map_index: int
    state: str
    attempt: int
    max_attempts: int

    @property
    def name(self) -> str:
        return task_name(self.task_id, self.map_index)


@dataclass(frozen=True, slots=True)
class RetryingTask(WaitingTask):
    since: float
    waits_for: str  # "attempt 2 of 3"
    next_attempt_at: float | None
    last_error: str | None
    for_seconds: float


@dataclass(frozen=True, slots=True)
class TriggerShown:
    id: int | None
    classpath: str | None
    poke_hash: str | None
    shard: int | None
    description: str | None


@dataclass(frozen=True, slots=True)
class DeferredTask(WaitingTask):
    since: float
    timeout_at: float | None
    timeout_used: float | None  # share of its timeout gone (None: no timeout)
    waits_for: str
    trigger: TriggerShown
    checked_by: str | None  # the triggerer holding its shard's live lease
    resumes_at: str | None  # the method a worker resumes it at (None: the trigger ends it)
    for_seconds: float


@dataclass(frozen=True, slots=True)
class SensingTask(WaitingTask):
    since: float
    timeout_at: float | None
    timeout_used: float | None
    waits_for: str
    last_check: str
    next_check_at: float | None
    for_seconds: float


AnyWaiting = RetryingTask | DeferredTask | SensingTask


@dataclass(frozen=True, slots=True)
class Waiting:
    """One waiting state: how many, the longest wait, and the longest ``--limit`` tasks."""

    count: int
    oldest_seconds: float | None
    tasks: list[AnyWaiting]


@dataclass(frozen=True, slots=True)
class TriggererShown:
    id: str
    started_at: float
    heartbeat_at: float
    heartbeat_age_seconds: float
    stale: bool
    shards: list[int]  # the shards it holds a live lease on
    shard_count: int
    triggers: int
    loop_lag_ms: float | None


@dataclass(frozen=True, slots=True)
class Shards:
    total: int
    unowned: int  # no live lease: DEFERRED waits in these are not being checked


@dataclass(frozen=True, slots=True)
class PoolShown:
    name: str
    slots: int | None  # None: unlimited
    used: int
    ready: int

    @property
    def full(self) -> bool:
        return self.slots is not None and self.used >= self.slots

    @property
    def used_text(self) -> str:
        return f"{self.used}/{'unlimited' if self.slots is None else self.slots}"


@dataclass(frozen=True, slots=True)
class QueueShown:
    name: str
    declared: bool
    workers: int
    slots: int
    ready: int
    served: bool

    @property
    def stranded(self) -> bool:
        """Tasks are ready in it and no live worker serves it."""
        return bool(self.ready) and not self.served


@dataclass(frozen=True, slots=True)
class HeldBack:
    """A ready task a full or missing pool, or a queue nobody serves, holds back."""

    run_id: str
    task_id: str
    map_index: int
    state: str
    pool: str
    queue: str
    waits_for: str
    for_seconds: float

    @property
    def name(self) -> str:
        return task_name(self.task_id, self.map_index)


@dataclass(frozen=True, slots=True)
class StatusView:
    """Everything ``slotless status`` shows, the run list page renders and ``/api/status``
    sends."""

    now: float  # the store's clock when it was read
    runs_by_state: dict[str, int]
    runs: list[RunShown]  # the newest first
    attention: list[Attention]
    tasks_by_state: dict[str, int]  # task instances of unfinished runs
    waiting: dict[str, Waiting]  # by state, in WAITING's order
    triggerers: list[TriggererShown]
    shards: Shards
    pools: list[PoolShown]
    queues: list[QueueShown]
    held_back: list[HeldBack]

    @property
    def live(self) -> bool:
        """Something may still change: an unfinished run, a wait, a held-back task."""
        return (
            any(not r.finished for r in self.runs)
            or any(w.count for w in self.waiting.values())
            or bool(self.held_back)
        )

    @property
    def deferred(self) -> bool:
        return bool(self.waiting["DEFERRED"].count)

    def to_json(self) -> dict[str, Any]:
        """The JSON of ``slotless status --json`` and ``/api/status``."""
        return asdict(self)


# -- a task's attempts, from its log ----------------------------------------------------


@dataclass(slots=True)
class Stay:
    """A stretch of a task's attempt in a slot (RUNNING) or in the triggerer (DEFERRED),
    as the task page's attempts table (and a Gantt bar) shows it. Not frozen: it is open
    (``ended`` None) until :func:`turns` reads the transition out of it and closes it."""

    what: str
    state: str
    attempt: int | None
    started: float
    ended: float | None = None
    outcome: str | None = None  # the state it left for
    message: str = ""

    def took(self, now: float) -> float:
        return (self.ended or now) - self.started


def turns(events: Iterable[EventRow]) -> list[Stay]:
    """Stays in a slot (RUNNING) and in the triggerer (DEFERRED), from the transitions."""
    out: list[Stay] = []
    open_: dict[str, Stay] = {}
    for e in events:
        if e.kind != "transition":
            continue
        if e.from_state is not None and e.from_state in open_:
            stay = open_.pop(e.from_state)
            stay.ended, stay.outcome, stay.message = e.ts, e.to_state, e.message
        if e.to_state in ("RUNNING", "DEFERRED"):
            stay = Stay(
                what="in a slot" if e.to_state == "RUNNING" else "waiting (deferred)",
                state=e.to_state,
                attempt=e.attempt,
                started=e.ts,
                message=e.message if e.to_state == "DEFERRED" else "",
            )
            open_[e.to_state] = stay
            out.append(stay)
    return out
