"""Event waits: a task waits for a named event whose payload has given field values.

An event is pushed (``slotless events send``, ``POST /api/v1/events``, or
``Events.send_events``); it is never polled for. The event's writer settles the waits it
matches in its own transaction, and a wait that begins looks for a matching event already
stored within its lookback window in the transaction that registers it (see
``executor/store/events.py``). So an :class:`EventTrigger` is never checked by the
triggerer: only its timeout is held there, like every wait's.

>>> t = EventTrigger(name="export.ready", match={"partner": "acme", "date": "{{ ds }}"})
>>> t.templates()  # rendered per run by the sensor (executor/templating.py)
{'match.date': '{{ ds }}'}

Matching is equality, on named top-level fields of the payload, of canonical JSON values:
``{"n": 1}`` matches ``1`` and not ``"1"`` nor ``true``. Each wait is keyed by a hash of its
name and match (:func:`match_key`); an event computes the same hash for every field set
its name is waited on with (:func:`payload_key`), so finding its waits is an index lookup
whatever their number.

A custom trigger waits for events the same way by returning an :class:`EventWait` from
:meth:`BaseTrigger.event_wait` (a subclass of :class:`EventTrigger` inherits it).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import Field, field_validator

from .base import BaseTrigger, TriggerEvent, is_template
from .context import TriggerContext
from .limits import MAX_SERIALIZED_BYTES

# An event name: a letter or digit, then letters, digits and . _ - : / (at most 200).
NAME_RULE = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$"
_NAME = re.compile(NAME_RULE)
MAX_MATCH_FIELDS = 16


class EventError(ValueError):
    """An event or an event wait that cannot be: a bad name, a payload that is not JSON or
    is too large. ``field`` names what was wrong (``name``, ``payload``, ...)."""

    def __init__(self, message: str, field: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.field = field
        self.too_large = too_large


def check_name(name: object, field: str = "name") -> str:
    """``name`` if it follows :data:`NAME_RULE`, else :class:`EventError` saying why."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise EventError(
            f"bad event name {name!r}: 1 to 200 characters, letters, digits and . _ - : /, "
            "starting with a letter or digit",
            field,
        )
    return name


def canonical(value: Any) -> str:
    """The one JSON text of a value: what equality of payload fields compares."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def payload_json(payload: Any, field: str = "payload") -> str:
    """The compact JSON stored for ``payload``; :class:`EventError` if it cannot be JSON
    or is larger than :data:`~triggers.limits.MAX_SERIALIZED_BYTES`."""
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EventError(f"{field} is not JSON: {exc}", field) from None
    size = len(text.encode())
    if size > MAX_SERIALIZED_BYTES:
        raise EventError(
            f"{field} is {size} bytes of JSON; the limit is {MAX_SERIALIZED_BYTES} "
            f"({MAX_SERIALIZED_BYTES // 1024} KiB)",
            field,
            too_large=True,
        )
    return text


def fields_of(match: dict[str, Any]) -> str:
    """The field set a match names, as stored (``event_shape.fields``): sorted JSON."""
    return canonical(sorted(match))


def match_key(name: str, match: dict[str, Any]) -> str:
    """The key of a wait: a hash of its event name and the values it matches."""
    blob = canonical([name, {k: match[k] for k in sorted(match)}])
    return hashlib.sha256(blob.encode()).hexdigest()


def payload_key(name: str, fields: list[str], payload: Any) -> str | None:
    """The key a wait on ``fields`` would have for this payload (None: it lacks a field)."""
    if fields and not isinstance(payload, dict):
        return None
    if any(f not in payload for f in fields):
        return None
    return match_key(name, {f: payload[f] for f in fields})


@dataclass(frozen=True, slots=True)
class EventWait:
    """What an event wait waits for. ``lookback``: seconds before the wait began whose
    events count; None counts every event since the wait's run started."""

    name: str
    match: dict[str, Any]
    lookback: float | None = None

    @property
    def key(self) -> str:
        return match_key(self.name, self.match)

    @property
    def fields(self) -> str:
        return fields_of(self.match)

    def matches(self, payload: Any) -> bool:
        return payload_key(self.name, sorted(self.match), payload) == self.key


class EventTrigger(BaseTrigger):
    """Waits for an event named ``name`` whose payload's fields equal ``match``.

    ``lookback`` (seconds, or a timedelta): events sent up to this long before the wait
    began count too; by default every event since the task's run started counts. String
    values of ``name`` and ``match`` are templates (``{{ ds }}``, ``{{ run_id }}``, ...).
    Use it in ``mode="deferrable"`` (the default): it is settled by the event's sender.
    """

    name: str
    match: dict[str, Any] = Field(default_factory=dict)
    lookback: float | None = Field(default=None, ge=0)

    # Which events count is decided once, when the wait begins: not part of what is waited for.
    execution_fields = BaseTrigger.execution_fields | {"lookback"}

    @field_validator("lookback", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        return value.total_seconds() if isinstance(value, timedelta) else value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if is_template(value):  # checked once rendered
            return value
        return check_name(value)

    @field_validator("match")
    @classmethod
    def _match(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_MATCH_FIELDS:
            raise ValueError(f"at most {MAX_MATCH_FIELDS} fields to match, not {len(value)}")
        payload_json(value, "match")
        return value

    def event_wait(self) -> EventWait | None:
        return EventWait(self.name, dict(self.match), self.lookback)

    def describe(self) -> str:
        shown = ", ".join(f"{k}={canonical(v)}" for k, v in sorted(self.match.items()))
        return f"event {self.name}" + (f" ({shown})" if shown else "")

    def first_check_at(self, now: float) -> float:
        return float("inf")  # never checked: the event's sender settles the wait

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        raise TypeError(
            f"{self.describe()} is settled by the event's sender and never checked: "
            "use it in mode='deferrable' (or ctx.defer), not in poke or reschedule mode"
        )
