"""How a run is named for people (executor/runnames.py): the display rule of its logical
time, and the run id of a schedule's run, on UTC and on a zone with DST."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import get_args
from zoneinfo import ZoneInfo

from executor.notifications import CallbackContext
from executor.runnames import RUN_TYPES, logical_shown, logical_time_text, shown_at
from executor.schedules import Schedule
from executor.store.runs import interval_run_id
from slotless.web.api import RunTypeName

PARIS = ZoneInfo("Europe/Paris")


def row(start: datetime, end: datetime | None, zone: str = "UTC") -> dict[str, str | None]:
    return {
        "logical_date": start.astimezone(ZoneInfo(zone)).date().isoformat(),
        "logical_time": logical_time_text(start),
        "timezone": zone,
        "data_interval_start": None if end is None else start.isoformat(),
        "data_interval_end": None if end is None else end.isoformat(),
    }


def test_an_hourly_run_shows_its_time_and_a_daily_one_its_date() -> None:
    six = datetime(2026, 11, 26, 6, tzinfo=UTC)
    assert logical_shown(row(six, six + timedelta(hours=1))) == "2026-11-26 06:00"
    # The hourly run of 00:00 shows its time too: the runs of one day read alike.
    zero = datetime(2026, 11, 26, tzinfo=UTC)
    assert logical_shown(row(zero, zero + timedelta(hours=1))) == "2026-11-26 00:00"
    assert logical_shown(row(zero, zero + timedelta(days=1))) == "2026-11-26"
    assert logical_shown(row(zero, zero + timedelta(days=7))) == "2026-11-26"  # weekly
    assert logical_shown(row(zero, None)) == "2026-11-26"  # by hand: its date
    # A daily schedule at 06:00 is not at midnight: its time is part of what it is for.
    assert logical_shown(row(six, six + timedelta(days=1))) == "2026-11-26 06:00"
    # Seconds only when there are some (a timedelta schedule may have them).
    odd = datetime(2026, 11, 26, 6, 0, 30, tzinfo=UTC)
    assert logical_shown(row(odd, odd + timedelta(minutes=90))) == "2026-11-26 06:00:30"


def test_it_is_read_on_the_dags_clock() -> None:
    # Midnight in Paris is 23:00 UTC the day before: shown as the Paris date, its ds.
    start = datetime(2026, 11, 25, 23, tzinfo=UTC)
    paris = row(start, start + timedelta(days=1), "Europe/Paris")
    assert paris["logical_date"] == "2026-11-26"
    assert logical_shown(paris) == "2026-11-26"
    hour = row(start + timedelta(hours=7), start + timedelta(hours=8), "Europe/Paris")
    assert logical_shown(hour) == "2026-11-26 07:00"
    # A manual run at midnight of its date on the DAG's clock.
    assert logical_shown(row(start, None, "Europe/Paris")) == "2026-11-26"


def test_a_row_of_the_previous_release_or_an_object_reads_too() -> None:
    assert logical_shown({"logical_date": "2026-11-26", "logical_time": None}) == "2026-11-26"

    @dataclass
    class Run:
        logical_date: str
        logical_time: str | None
        timezone: str | None
        data_interval_end: str | None

    hourly = Run("2026-11-26", "2026-11-26T06:00:00+00:00", None, "2026-11-26T07:00:00+00:00")
    assert logical_shown(hourly) == "2026-11-26 06:00"  # no zone: UTC
    gone = Run("2026-11-26", "2026-11-26T06:00:00+00:00", "Mars/Olympus", None)
    assert logical_shown(gone) == "2026-11-26 06:00"  # a zone unknown here: UTC


def test_the_hour_repeated_when_dst_ends_has_two_ids_and_shows_two_offsets() -> None:
    hourly = Schedule.parse("@hourly", timezone="Europe/Paris")
    # 2026-10-25: Paris goes from +02:00 back to +01:00 at 03:00, passing 02:00 twice.
    ivs = list(
        hourly.intervals(
            datetime(2026, 10, 24, 23, tzinfo=UTC), datetime(2026, 10, 25, 2, tzinfo=UTC)
        )
    )
    ids = [interval_run_id("m", iv) for iv in ivs]
    assert ids == [
        "m:2026-10-25T01:00+02:00",
        "m:2026-10-25T02:00+02:00",
        "m:2026-10-25T02:00+01:00",
    ]
    shown = [shown_at(iv.start, PARIS, iv.end) for iv in ivs]
    assert shown == ["2026-10-25 01:00", "2026-10-25 02:00+02:00", "2026-10-25 02:00+01:00"]
    # On UTC, an id has no offset.
    [iv] = Schedule.parse("@hourly").intervals(
        datetime(2026, 11, 26, 6, tzinfo=UTC), datetime(2026, 11, 26, 7, tzinfo=UTC)
    )
    assert interval_run_id("hourly_metrics", iv) == "hourly_metrics:2026-11-26T06:00"
    assert (
        interval_run_id("hourly_metrics", iv, "~rerun-1")
        == "hourly_metrics:2026-11-26T06:00~rerun-1"
    )


def test_a_notification_names_the_run_by_its_logical_time() -> None:
    ctx = CallbackContext(
        event="on_failure", dag_id="hourly_metrics", run_id="hourly_metrics:2026-11-26T06:00",
        logical_date=date(2026, 11, 26), task_id="load", attempt=1, error="boom",
        log_tail=[], context={}, logical_shown="2026-11-26 06:00",
    )  # fmt: skip
    assert ctx.body().splitlines()[0] == "run hourly_metrics:2026-11-26T06:00 (2026-11-26 06:00)"
    older = CallbackContext(
        event="on_failure", dag_id="d", run_id="d:2026-11-26:3fa9c1",
        logical_date=date(2026, 11, 26), task_id="t", attempt=1, error=None, log_tail=[],
        context={},
    )  # fmt: skip
    assert older.body().splitlines()[0] == "run d:2026-11-26:3fa9c1 (2026-11-26)"


def test_the_apis_run_types_are_the_stores() -> None:
    assert get_args(RunTypeName) == RUN_TYPES


def test_one_instant_on_two_clocks_has_two_ids() -> None:
    """Intervals compare equal whatever their zone: the id of one is never the other's."""
    at = datetime(2026, 11, 26, 5, tzinfo=UTC)
    utc = Schedule.parse("@hourly").interval_starting(at)
    paris = Schedule.parse("@hourly", timezone="Europe/Paris").interval_starting(at)
    assert utc is not None and paris is not None and utc == paris
    assert interval_run_id("a", utc) == "a:2026-11-26T05:00"
    assert interval_run_id("a", paris) == "a:2026-11-26T06:00+01:00"
    assert interval_run_id("a", utc) == "a:2026-11-26T05:00"  # asked again, after Paris


def test_a_drivers_row_reads_by_name() -> None:
    """sqlite3.Row is no Mapping: read by its column names (the bug a notification had)."""
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    got = conn.execute(
        "SELECT '2026-11-26' AS logical_date, '2026-11-26T06:00:00+00:00' AS logical_time,"
        " 'UTC' AS timezone, '2026-11-26T07:00:00+00:00' AS data_interval_end"
    ).fetchone()
    assert logical_shown(got) == "2026-11-26 06:00"
    older = conn.execute("SELECT '2026-11-26' AS logical_date").fetchone()
    assert logical_shown(older) == "2026-11-26"
