"""How a run is named for people: its logical time as shown, its run id, its type.

A run's *logical time* is the instant it is for: a schedule's run, its interval's start
(time of day included); a run without an interval (by hand, a start condition), midnight
of its logical date. It is stored in UTC (``dag_run.logical_time``, ISO 8601) beside the
zone of the DAG's clock (``dag_run.timezone``), on which ``logical_date`` (the ``ds``) is
its date. :func:`logical_shown` is the one way it is written for people: ``slotless
status``, notifications, the JSON API and the web page all call it.

Nothing of ours is imported: every layer above may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, time
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


class RunType(StrEnum):
    """How a run started (``dag_run.run_type``)."""

    SCHEDULED = "scheduled"  # its schedule's interval ended (the triggerer)
    MANUAL = "manual"  # a person: slotless trigger | run | up, the page, the API, Python
    BACKFILL = "backfill"  # slotless backfill: a past interval, keyed as its schedule keys it
    EVENT = "event"  # a start condition (start_when) fired: an event, a file, a sensor
    ASSET = "asset"  # its asset condition held (schedule=[Asset(...)]): executor/store/assets.py


RUN_TYPES = tuple(t.value for t in RunType)


def logical_time_text(at: datetime) -> str:
    """An aware instant as ``dag_run.logical_time`` stores it: ISO 8601 in UTC, one fixed
    form (``2026-11-26T06:00:00+00:00``), so that text order is time order."""
    return at.astimezone(UTC).replace(microsecond=0).isoformat()


def midnight(day: date, zone: ZoneInfo) -> datetime:
    """The logical time of a run that has a date and no interval: 00:00 on its clock."""
    return datetime.combine(day, time(0), zone)


def wall_text(at: datetime, sep: str = " ") -> str:
    """``2026-11-26 06:00`` (seconds only when there are some): an instant on its clock."""
    return at.strftime(f"%Y-%m-%d{sep}%H:%M" + (":%S" if at.second else ""))


def logical_shown(run: Any) -> str:
    """A run's logical time for people: ``2026-11-26 06:00`` on the DAG's clock, or
    ``2026-11-26`` alone when the run is a day's: its logical time is midnight and its
    interval, if it has one, ends at a midnight too (daily, weekly, monthly schedules). A
    run of a sub-daily schedule always shows its time, 00:00 included, so that the runs
    of one day read alike.

    ``run`` is a run row: a driver's row (``Views.run_info``), a mapping, or an object
    with the attributes (``RunRow``), read for ``logical_time``, ``timezone``, ``data_interval_end``
    and ``logical_date``. Without a logical time (a row written by the previous release)
    the logical date alone is shown.
    """
    get = _getter(run)
    text = get("logical_time")
    if not text:
        return str(get("logical_date"))
    end = get("data_interval_end")
    return shown_at(
        datetime.fromisoformat(text),
        _zone(get("timezone")),
        None if not end else datetime.fromisoformat(end),
    )


def shown_at(at: datetime, zone: ZoneInfo, interval_end: datetime | None = None) -> str:
    """:func:`logical_shown` of a logical instant ``at`` read on ``zone``, for a run whose
    data interval ends at ``interval_end`` (None: it has none): what is shown of a run
    before it exists (``slotless backfill`` names the intervals it is about to create)."""
    local = at.astimezone(zone)
    if local.time() == time(0) and (
        interval_end is None or interval_end.astimezone(zone).time() == time(0)
    ):
        return local.date().isoformat()
    text = wall_text(local)
    # A wall time the clock passes twice (the hour repeated when DST ends) names two
    # instants: both passes show their offset, "2026-10-25 02:00+02:00" then "+01:00".
    if local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset():
        text += offset_text(local)
    return text


def offset_text(at: datetime) -> str:
    """``+01:00``: an aware datetime's UTC offset, as ISO 8601 writes it."""
    raw = at.strftime("%z")
    return f"{raw[:3]}:{raw[3:]}"


def _getter(run: Any) -> Callable[[str], Any]:
    if isinstance(run, Mapping):
        return run.get
    if hasattr(run, "keys"):  # a driver's row (sqlite3.Row): by name, not a Mapping
        names = set(run.keys())
        return lambda k: run[k] if k in names else None
    return lambda k: getattr(run, k, None)


def _zone(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):  # a zone this machine's tzdata lacks
        return ZoneInfo("UTC")
