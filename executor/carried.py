"""What a transition writes besides the state: one variant per kind of transition.

:func:`executor.statemachine.transition` takes at most one of these (``carry=``) and
writes it in the same statement as the state. :func:`params` is the one place that turns
a variant into the ``cas`` statement's parameters (schema/common/queries.sql). A variant
for many rows is one JSON object of row id -> its value, or -> {column: value} when it
carries several columns (a deferral): SQLite reads the object again for every row, so
the smaller it is the better.

A move to RETRYING forgets the resume point, the event and the wait whatever it is given
(an output it still writes): a retry starts the task over, and a sensor's timeout is per
attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .outcomes import Deferral
from .states import State


@dataclass(frozen=True, slots=True)
class Output:
    """The same output (JSON) for every row moved: a sensor's event, a person's answer."""

    output: str


@dataclass(frozen=True, slots=True)
class Outputs:
    """Each row's own output (row id -> JSON, or None): finished attempts, fired sensors."""

    by_row: Mapping[int, str | None]


@dataclass(frozen=True, slots=True)
class Resume:
    """The payload (JSON) of the event that resumes every deferred row moved."""

    event: str


@dataclass(frozen=True, slots=True)
class Resumes:
    """Each deferred row's own event (row id -> JSON): waits fired together."""

    by_row: Mapping[int, str]


@dataclass(frozen=True, slots=True)
class Wait:
    """A sensor's wait goes on (rescheduled): when it started (kept if it already had)
    and when it gives up (None: never)."""

    started_at: float
    timeout_at: float | None


@dataclass(frozen=True, slots=True)
class Defer:
    """One row's deferral: the trigger row it waits on, where it resumes (no method: a
    sensor, which ends with the event), and its wait. Clears an earlier event."""

    trigger_id: int
    next_method: str | None
    next_kwargs: str | None  # JSON
    soft_fail: bool
    wait: Wait

    @classmethod
    def of(cls, d: Deferral, trigger_id: int) -> Defer:
        """A worker's reported deferral, waiting on the trigger row written for it."""
        return cls(
            trigger_id=trigger_id,
            next_method=d.method,
            next_kwargs=d.method_kwargs_json,
            soft_fail=d.soft_fail,
            wait=Wait(d.wait_started_at, d.timeout_at),
        )


@dataclass(frozen=True, slots=True)
class Defers:
    """Each row's deferral (row id -> :class:`Defer`), so that a batch is one statement."""

    by_row: Mapping[int, Defer]


Carried = Output | Outputs | Resume | Resumes | Wait | Defers

# Nothing carried: every column but the state's bookkeeping is kept.
_KEEP: dict[str, Any] = {
    "output_mode": "keep",
    "output": None,
    "resume_mode": "keep",
    "event": None,
    "wait_mode": "keep",
    "wait_started_at": None,
    "wait_timeout_at": None,
    "per_row": None,
}
_RESTART = {**_KEEP, "resume_mode": "restart", "wait_mode": "clear"}


def params(carried: Carried | None, new: State) -> dict[str, Any]:
    """The ``cas`` parameters that write ``carried`` in a move to ``new``."""
    base = _RESTART if new is State.RETRYING else _KEEP
    match carried:
        case None:
            return base
        case Output(output):
            return {**base, "output_mode": "one", "output": output}
        case Outputs(by_row):
            return {**base, "output_mode": "each", "per_row": json.dumps(by_row)}
        case _ if new is State.RETRYING:
            return base
        case Resume(event):
            return {**base, "resume_mode": "one", "event": event}
        case Resumes(by_row):
            return {**base, "resume_mode": "each", "per_row": json.dumps(by_row)}
        case Wait(started_at, timeout_at):
            return {
                **base,
                "wait_mode": "one",
                "wait_started_at": started_at,
                "wait_timeout_at": timeout_at,
            }
        case Defers(by_row):
            rows = json.dumps({i: _deferral(d) for i, d in by_row.items()})
            return {**base, "resume_mode": "defer", "wait_mode": "each", "per_row": rows}
    raise TypeError(f"not a carried payload: {carried!r}")


def _deferral(d: Defer) -> dict[str, Any]:
    return {
        "trigger_id": d.trigger_id,
        "next_method": d.next_method,
        "next_kwargs": d.next_kwargs,
        "soft_fail": int(d.soft_fail),
        "wait_started_at": d.wait.started_at,
        "wait_timeout_at": d.wait.timeout_at,
    }
