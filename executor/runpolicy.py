"""What a DAG says about its runs as a whole: when they must have ended, how long they may
take, and what the first failed task does to them.

* ``deadline="06:00"``: a time of day on the DAG's clock (``HH:MM`` or ``HH:MM:SS``). A run
  not finished by then is announced once (it goes on running). The moment is the first
  time the clock reads it at or after the run's *anchor*: the end of its data interval
  for a scheduled run (when it became due: a daily run of 2026-04-24, due at midnight,
  must end by 06:00 on the 25th), else the start of its logical date (a run started by
  hand or by a start condition for 2026-04-25 must end by 06:00 that day).
* ``dagrun_timeout="3h"``: a duration from when the run starts RUNNING (a queued run's
  clock starts when it starts); past it the run is cancelled with that reason.
* a sensor's ``expected_by="05:30"``: a time of day like ``deadline``, from the same
  anchor; if the sensor's condition has not held by then, a "late" notice goes out once
  and the sensor keeps waiting until its own timeout.
* ``on_task_failure``: ``continue`` (the default: the failure flows to the children by
  their trigger rules), ``fail_fast`` (the first FAILED task ends the run FAILED: nothing
  new starts, waits end, running attempts are stopped as a cancel stops them) or
  ``pause`` (the run goes PAUSED, nothing new starts, a notice goes out; ``slotless
  resume`` or ``slotless clear`` goes on).

All three times are time triggers held by the triggerer (executor/runwaits.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo

from .durations import Duration, seconds


class OnTaskFailure(StrEnum):
    CONTINUE = "continue"
    FAIL_FAST = "fail_fast"
    PAUSE = "pause"


_TIME = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")


def time_of_day(field: str, text: object) -> str:
    """``text`` checked as a time of day (``HH:MM`` or ``HH:MM:SS``), returned as stored
    (``HH:MM:SS``); a :class:`ValueError` names ``field`` otherwise."""
    if isinstance(text, time):
        return text.replace(microsecond=0).isoformat()
    m = _TIME.match(text.strip()) if isinstance(text, str) else None
    if m is None or int(m.group(1)) > 23 or int(m.group(2)) > 59 or int(m.group(3) or 0) > 59:
        raise ValueError(
            f"{field} {text!r} is not a time of day on the DAG's clock (HH:MM or HH:MM:SS)"
        )
    return f"{int(m.group(1)):02d}:{m.group(2)}:{m.group(3) or '00'}"


def failure_policy(text: object) -> OnTaskFailure:
    try:
        return OnTaskFailure(str(text))
    except ValueError:
        known = ", ".join(p.value for p in OnTaskFailure)
        raise ValueError(f"unknown on_task_failure {text!r} (known: {known})") from None


def timeout_seconds(value: Duration | None) -> float | None:
    if value is None:
        return None
    try:
        out = seconds(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"dagrun_timeout: {exc}") from None
    if not out:
        raise ValueError(f"dagrun_timeout must be longer than 0 s, not {value!r}")
    return out


@dataclass(frozen=True, slots=True)
class RunPolicy:
    """A DAG's run-wide options as stored with its shape (no code, JSON-able)."""

    on_task_failure: OnTaskFailure = OnTaskFailure.CONTINUE
    deadline: str | None = None  # HH:MM:SS on the DAG's clock
    dagrun_timeout: float | None = None  # seconds
    timezone: str = "UTC"

    @property
    def is_default(self) -> bool:
        return self == RunPolicy(timezone=self.timezone)

    def to_json(self) -> dict[str, Any]:
        return {
            "on_task_failure": self.on_task_failure.value,
            "deadline": self.deadline,
            "dagrun_timeout": self.dagrun_timeout,
            "timezone": self.timezone,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RunPolicy:
        if not data:
            return cls()
        return cls(
            OnTaskFailure(data.get("on_task_failure") or "continue"),
            data.get("deadline"),
            data.get("dagrun_timeout"),
            data.get("timezone") or "UTC",
        )


def anchor(logical_date: date, interval_end: datetime | None, zone: ZoneInfo) -> datetime:
    """Where a run's times of day count from (see the module)."""
    if interval_end is not None:
        return interval_end.astimezone(zone)
    return datetime.combine(logical_date, time(0), zone)


def moment(text: str, start: datetime) -> float:
    """The first time ``start``'s clock reads ``text`` (``HH:MM:SS``) at or after ``start``,
    in epoch seconds. A wall time that a DST change skips is taken an hour later, one it
    repeats the first time (zoneinfo's fold=0)."""
    zone = start.tzinfo
    h, m, s = (int(x) for x in text.split(":"))
    day = start.date()
    for _ in range(3):
        at = datetime.combine(day, time(h, m, s), zone)
        # Round-trip through UTC: a skipped wall time comes back shifted, as documented.
        at = at.astimezone(UTC).astimezone(zone)
        if at >= start:
            return at.timestamp()
        day += timedelta(days=1)
    raise AssertionError("unreachable: a time of day recurs within two days")


def late_json(times: dict[str, float]) -> str | None:
    return json.dumps(times, sort_keys=True) if times else None
