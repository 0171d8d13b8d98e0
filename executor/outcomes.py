"""What a worker reports back after running a task in a slot."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    SUCCESS = "success"
    ERROR = "error"


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
    extra: dict[str, Any] = field(default_factory=dict)
