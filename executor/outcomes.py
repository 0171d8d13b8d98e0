"""What a worker reports back after running a task in a slot: one class per way it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from triggers.events import EventWait


class Kind(StrEnum):
    """The label of each outcome class (the ``slotless_attempts_total`` metric's ``kind``)."""

    SUCCESS = "success"
    ERROR = "error"
    DEFER = "defer"
    RESCHEDULE = "reschedule"
    SENSOR_TIMEOUT = "sensor_timeout"


@dataclass(slots=True)
class Deferral:
    """A trigger row to write, and where to resume when it fires."""

    classpath: str
    kwargs_json: str
    poke_hash: str
    shard: int
    description: str
    method: str | None  # None: a sensor, finished by the triggerer itself
    method_kwargs_json: str
    wait_started_at: float
    timeout_at: float | None
    soft_fail: bool = False
    event: EventWait | None = None  # an event wait: settled by events, never loaded
    person: bool = False  # a person's wait: settled by the answer, never loaded


@dataclass(slots=True)
class SlotInterval:
    worker_id: str
    slot: int
    kind: str  # execute, poke, resume
    started_at: float
    ended_at: float


@dataclass(slots=True, kw_only=True)
class Outcome:
    """What every finished attempt reports; the subclasses say how it ended."""

    kind: ClassVar[Kind]

    row_id: int
    owner: str  # the claim token: only the attempt's owner may record it
    attempt: int
    max_attempts: int
    run_id: str = ""
    logs: list[tuple[float, str]] = field(default_factory=list)  # ctx.log lines
    traceback: str | None = None
    slot: SlotInterval | None = None
    slot_kind: str | None = None  # execute, poke, resume (default: from the row)


@dataclass(slots=True, kw_only=True)
class Succeeded(Outcome):
    kind = Kind.SUCCESS

    output_json: str | None = None  # already serialized by the worker
    skip_children: list[str] = field(default_factory=list)  # a branch's children not chosen
    values: dict[str, str] = field(default_factory=dict)  # ctx.push's: key -> JSON
    # Its outlets' events, recorded with the SUCCESS: (task_id, uri, extra JSON or None).
    asset_events: list[tuple[str, str, str | None]] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class Failed(Outcome):
    """The attempt raised (or cannot run): retried after ``retry_delay`` while
    ``attempt < max_attempts``, else FAILED."""

    kind = Kind.ERROR

    message: str
    retry_delay: float = 0.0


@dataclass(slots=True, kw_only=True)
class Deferred(Outcome):
    kind = Kind.DEFER

    deferral: Deferral


@dataclass(slots=True, kw_only=True)
class Rescheduled(Outcome):
    """A reschedule-mode sensor checked and will check again at ``ready_at``."""

    kind = Kind.RESCHEDULE

    message: str
    ready_at: float
    wait_started_at: float
    timeout_at: float


@dataclass(slots=True, kw_only=True)
class SensorTimedOut(Outcome):
    kind = Kind.SENSOR_TIMEOUT

    message: str
    soft_fail: bool = False  # SKIPPED instead of FAILED
