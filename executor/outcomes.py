"""What a worker reports back after running a task in a slot."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    SUCCESS = "success"
    ERROR = "error"
    DEFER = "defer"  # extra: Deferral
    RESCHEDULE = "reschedule"  # extra: ready_at, wait_started_at, timeout_at
    SENSOR_TIMEOUT = "sensor_timeout"  # extra: soft_fail


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


@dataclass(slots=True)
class SlotInterval:
    worker_id: str
    slot: int
    kind: str  # execute, poke, resume
    started_at: float
    ended_at: float


@dataclass(slots=True)
class Outcome:
    row_id: int
    owner: str
    attempt: int
    max_attempts: int
    kind: Kind
    output_json: str | None = None  # already serialized by the worker
    message: str = ""
    traceback: str | None = None
    retry_delay: float = 0.0
    skip_children: list[str] = field(default_factory=list)  # a branch's children not chosen
    run_id: str = ""
    logs: list[tuple[float, str]] = field(default_factory=list)
    slot: SlotInterval | None = None
    deferral: Deferral | None = None
    slot_kind: str | None = None  # execute, poke, resume (default: from the row)
    extra: dict[str, Any] = field(default_factory=dict)
