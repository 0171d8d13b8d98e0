"""executor/schedules.py on real dates: intervals and logical dates, the DST days of
Europe/Paris in 2026 (spring forward 29 March, fall back 25 October), timedelta
schedules, start and end dates, and bad declarations refused naming their field."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from executor.dag import DAG, DagError
from executor.schedules import Interval, Schedule

PARIS = ZoneInfo("Europe/Paris")


def paris(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=PARIS)


def local(intervals: list[Interval]) -> list[tuple[str, str]]:
    return [
        (f"{i.start.astimezone(PARIS):%m-%d %H:%M%z}", f"{i.end.astimezone(PARIS):%m-%d %H:%M%z}")
        for i in intervals
    ]


def test_a_runs_logical_date_is_the_start_of_its_interval_and_it_runs_at_the_end() -> None:
    sched = Schedule.parse("0 6 * * *", timezone="Europe/Paris")
    # Tuesday 2026-05-05 at 08:00 in Paris: Monday's interval ended at 06:00 today.
    now = paris(2026, 5, 5, 8, 0)
    done = sched.latest_complete(now)
    assert done == Interval(paris(2026, 5, 4, 6), paris(2026, 5, 5, 6))
    assert done.logical_date == paris(2026, 5, 4, 6) and done.ds == "2026-05-04"
    assert done.start.tzinfo is UTC and done.end.tzinfo is UTC
    upcoming = sched.next_interval(now)
    assert upcoming == Interval(paris(2026, 5, 5, 6), paris(2026, 5, 6, 6))
    # The interval after one starts where it ends; an instant on a tick starts one.
    assert sched.next_interval(done.end) == upcoming
    assert sched.next_interval(paris(2026, 5, 5, 6)) == upcoming
    assert sched.describe() == "every day at 06:00 Europe/Paris"


def test_ds_is_the_date_on_the_schedules_wall_clock() -> None:
    # 00:30 in Paris is 22:30 UTC the day before: ds is the Paris date.
    sched = Schedule.parse("30 0 * * *", timezone="Europe/Paris")
    interval = sched.latest_complete(paris(2026, 5, 5, 12))
    assert interval is not None
    assert interval.start == datetime(2026, 5, 3, 22, 30, tzinfo=UTC)
    assert interval.ds == "2026-05-04"


def test_daily_0230_runs_once_on_the_spring_forward_day_at_0300() -> None:
    sched = Schedule.parse("30 2 * * *", timezone="Europe/Paris")
    got = list(sched.intervals(paris(2026, 3, 28), paris(2026, 3, 31)))
    assert local(got) == [
        ("03-28 02:30+0100", "03-29 03:00+0200"),
        ("03-29 03:00+0200", "03-30 02:30+0200"),
        ("03-30 02:30+0200", "03-31 02:30+0200"),
    ]
    assert [i.ds for i in got] == ["2026-03-28", "2026-03-29", "2026-03-30"]


def test_daily_0230_runs_once_on_the_fall_back_day_the_first_time() -> None:
    sched = Schedule.parse("30 2 * * *", timezone="Europe/Paris")
    got = list(sched.intervals(paris(2026, 10, 24), paris(2026, 10, 27)))
    assert local(got) == [
        ("10-24 02:30+0200", "10-25 02:30+0200"),
        ("10-25 02:30+0200", "10-26 02:30+0100"),
        ("10-26 02:30+0100", "10-27 02:30+0100"),
    ]
    # Asked from inside the repeated hour (the second 02:10), the next run is tomorrow's.
    second_pass = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)  # 02:10+01:00
    nxt = sched.next_interval(second_pass)
    assert nxt is not None and nxt.end == paris(2026, 10, 26, 2, 30)
    assert nxt.end > second_pass


def test_hourly_has_23_intervals_on_the_spring_forward_day_and_25_on_the_fall_back_day() -> None:
    sched = Schedule.parse("@hourly", timezone="Europe/Paris")
    spring = list(sched.intervals(paris(2026, 3, 29), paris(2026, 3, 30)))
    fall = list(sched.intervals(paris(2026, 10, 25), paris(2026, 10, 26)))
    assert (len(spring), len(fall)) == (23, 25)
    for day in (spring, fall):
        assert all(i.end - i.start == timedelta(hours=1) for i in day)
        assert all(a.end == b.start for a, b in itertools.pairwise(day))
    # 02:00 twice on the fall-back day, as two different instants.
    twos = [i.start for i in fall if i.start.astimezone(PARIS).hour == 2]
    assert len(twos) == 2 and twos[1] - twos[0] == timedelta(hours=1)


def test_latest_complete_and_next_interval_agree_across_the_dst_days() -> None:
    for spec in ("30 2 * * *", "@hourly", "*/20 * * * *", "15 1,2,3 * * *"):
        sched = Schedule.parse(spec, timezone="Europe/Paris")
        for start, end in ((paris(2026, 3, 28), paris(2026, 3, 31)),
                           (paris(2026, 10, 24), paris(2026, 10, 27))):  # fmt: skip
            chain = list(sched.intervals(start, end))
            for a, b in itertools.pairwise(chain):
                assert sched.next_interval(a.end) == b
                assert sched.latest_complete(b.end) == b
                assert sched.latest_complete(b.end - timedelta(seconds=1)) == a
                assert sched.next_interval(a.start + (a.end - a.start) / 2) == a


def test_a_timedelta_schedule_counts_real_time_from_its_start_date() -> None:
    sched = Schedule.parse(
        timedelta(hours=1, minutes=30), timezone="Europe/Paris", start_date=datetime(2026, 1, 1)
    )
    assert sched.text == "PT1H30M" and sched.describe() == "every 1 hour 30 minutes"
    start = paris(2026, 1, 1)
    assert sched.next_interval(start - timedelta(days=3)) == Interval(
        start, start + timedelta(minutes=90)
    )
    now = start + timedelta(hours=4)  # ticks at 0:00, 1:30, 3:00, 4:30
    assert sched.latest_complete(now) == Interval(
        start + timedelta(minutes=90), start + timedelta(hours=3)
    )
    assert len(list(sched.intervals(start, start + timedelta(days=1)))) == 16
    # Its stored text reads back as the same schedule.
    again = Schedule.parse(sched.text, timezone="Europe/Paris", start_date=datetime(2026, 1, 1))
    assert again == sched


def test_start_and_end_dates_bound_the_intervals() -> None:
    sched = Schedule.parse(
        "@daily", timezone="UTC", start_date=date(2026, 1, 10), end_date=datetime(2026, 1, 12, 12)
    )
    far = datetime(2020, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC)
    assert [i.ds for i in sched.intervals(*far)] == ["2026-01-10", "2026-01-11", "2026-01-12"]
    # The last interval starts on end_date's day; after it, nothing more is due.
    assert sched.next_interval(datetime(2026, 1, 20, tzinfo=UTC)) is None
    latest = sched.latest_complete(datetime(2026, 6, 1, tzinfo=UTC))
    assert latest is not None and latest.ds == "2026-01-12"
    # Before start_date nothing is complete; the first run is start_date's interval.
    before = datetime(2026, 1, 5, tzinfo=UTC)
    assert sched.latest_complete(before) is None
    first = sched.next_interval(before)
    assert first is not None and first.ds == "2026-01-10"
    assert sched.describe() == "every day at 00:00 UTC, until 2026-01-12 12:00"


def test_the_first_run_respects_catchup() -> None:
    sched = Schedule.parse("0 * * * *", start_date=datetime(2026, 1, 1, tzinfo=UTC))
    catching_up = dataclasses.replace(sched, catchup=True)
    now = datetime(2026, 1, 4, 0, 30, tzinfo=UTC)
    assert catching_up.first_interval(now) == sched.next_interval(datetime(2026, 1, 1, tzinfo=UTC))
    latest = sched.first_interval(now)
    assert latest is not None and latest.start == datetime(2026, 1, 3, 23, tzinfo=UTC)
    # 72 hourly intervals completed in the three days catchup would fill.
    assert len(list(sched.intervals(datetime(2026, 1, 1, tzinfo=UTC), latest.end))) == 72
    # A start_date in the future: the first interval from it, either way.
    future = Schedule.parse("@daily", start_date=datetime(2027, 1, 1, tzinfo=UTC))
    first = future.first_interval(now)
    assert first is not None and first.ds == "2027-01-01"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"spec": "61 * * * *"}, "bad cron '61 * * * *': minute 61 out of range 0-59"),
        ({"spec": "0 24 * * *"}, "bad cron '0 24 * * *': hour 24 out of range 0-23"),
        ({"spec": "0 6 * *"}, "bad cron '0 6 * *': 5 fields"),
        ({"spec": "0 0 30 2 *"}, "day-of-month '30' never occurs in month '2'"),
        ({"spec": "*/0 * * * *"}, "minute '*/0' is not valid"),
        ({"spec": "@once"}, "@once is not supported"),
        ({"spec": "@fortnightly"}, "unknown preset '@fortnightly'"),
        ({"spec": 42}, "schedule: a cron string, a preset or a timedelta"),
        ({"spec": timedelta(0), "start_date": date(2026, 1, 1)}, "must be positive"),
        ({"spec": timedelta(hours=1)}, "start_date: a timedelta schedule counts"),
        ({"spec": "@daily", "timezone": "Europe/Pariss"}, "timezone: unknown time zone"),
        (
            {"spec": "@daily", "start_date": date(2026, 2, 1), "end_date": date(2026, 1, 1)},
            "start_date 2026-02-01 is after end_date 2026-01-01",
        ),
        ({"spec": "@daily", "start_date": "2026-01-01"}, "start_date: a datetime or a date"),
        ({"spec": "P1X"}, "schedule: bad duration 'P1X'"),
    ],
)
def test_bad_declarations_name_the_field(kwargs: dict, message: str) -> None:
    spec = kwargs.pop("spec")
    with pytest.raises(ValueError) as caught:
        Schedule.parse(spec, **kwargs)
    assert message in str(caught.value)


def test_naive_instants_are_refused_by_the_methods() -> None:
    sched = Schedule.parse("@daily")
    with pytest.raises(ValueError, match="now: a timezone-aware datetime"):
        sched.latest_complete(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("* * * * *", "every minute"),
        ("*/15 * * * *", "every 15 minutes"),
        ("5 * * * *", "every hour at :05"),
        ("0 6,18 * * *", "every day at 06:00 and 18:00 Europe/Paris"),
        ("30 7 * * 1-5", "every Monday to Friday at 07:30 Europe/Paris"),
        ("@weekly", "every Sunday at 00:00 Europe/Paris"),
        ("@monthly", "on day 1 of every month at 00:00 Europe/Paris"),
        ("@yearly", "every 1 January at 00:00 Europe/Paris"),
        ("0 6 1-7 * 1", "cron '0 6 1-7 * 1' Europe/Paris"),
        ("P1D", "every 1 day"),
    ],
)
def test_stored_schedules_in_words(spec: str, words: str) -> None:
    sched = Schedule.parse(spec, timezone="Europe/Paris", start_date=date(2026, 1, 1))
    assert Schedule.from_json(sched.to_json()).words == words


def test_a_stored_next_logical_date_gives_when_that_run_is_due() -> None:
    daily = Schedule.parse("30 2 * * *", timezone="Europe/Paris")
    due = daily.interval_starting(paris(2026, 3, 28, 2, 30))
    assert due is not None and due.end == paris(2026, 3, 29, 3, 0)
    hourly = Schedule.parse("PT1H", start_date=datetime(2026, 1, 1, tzinfo=UTC))
    due = hourly.interval_starting(datetime(2026, 1, 1, 5, tzinfo=UTC))
    assert due is not None and due.end == datetime(2026, 1, 1, 6, tzinfo=UTC)
    six = Schedule.parse("0 6 * * *")
    assert six.interval_starting(datetime(2026, 1, 1, 5, tzinfo=UTC)) is None


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [
        ("30 2 * * *", {"timezone": "Europe/Paris"}),
        ("@daily", {"start_date": date(2026, 1, 10), "end_date": date(2026, 2, 1)}),
        (timedelta(minutes=90), {"start_date": datetime(2026, 1, 1), "catchup": True}),
    ],
)
def test_a_schedule_reads_back_from_its_json_as_the_same_value(spec: object, kwargs: dict) -> None:
    sched = Schedule.parse(spec, **kwargs)  # type: ignore[arg-type]
    again = Schedule.from_json(sched.to_json())
    assert again == sched and again.catchup == sched.catchup and again.text == sched.text


def test_the_next_run_without_catchup_skips_what_was_missed() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    sched = Schedule.parse("@hourly", start_date=start)
    now = datetime(2026, 1, 2, 12, 30, tzinfo=UTC)
    # No run yet: the latest ended interval; after one long ago: the latest ended too.
    assert sched.next_run(None, now) == sched.latest_complete(now)
    assert sched.next_run(start + timedelta(hours=1), now) == sched.latest_complete(now)
    # With catchup nothing is skipped: from start_date, then the interval after the last.
    catching_up = dataclasses.replace(sched, catchup=True)
    assert catching_up.next_run(None, now) == Interval(start, start + timedelta(hours=1))
    after = start + timedelta(hours=1)
    assert catching_up.next_run(after, now) == Interval(after, after + timedelta(hours=1))
    # An interval still to come is not missed, either way.
    ahead = sched.next_interval(now)
    assert sched.skip_missed(ahead, now) == ahead


# ------------------------------------------------------------------ declared on a DAG


def test_a_dag_declares_its_schedule() -> None:
    dag = DAG(
        "nightly",
        schedule="30 2 * * *",
        timezone="Europe/Paris",
        start_date=datetime(2026, 1, 1),
        catchup=True,
        max_active_runs=4,
    )
    assert dag.schedule is not None and dag.schedule.text == "30 2 * * *"
    assert dag.schedule.start_date == paris(2026, 1, 1)
    assert (dag.timezone, dag.catchup, dag.max_active_runs) == ("Europe/Paris", True, 4)
    # catchup= is said on the DAG and kept on its schedule, which the catalogue stores.
    assert dag.schedule.catchup is True
    assert DAG("by_hand").schedule is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule": "0 6 * * 9"}, "DAG 'bad': bad cron '0 6 * * 9': day-of-week 9 out of"),
        ({"schedule": "@daily", "timezone": "Europe/Pariss"}, "DAG 'bad': timezone: unknown"),
        ({"timezone": "Nowhere/Land"}, "DAG 'bad': timezone: unknown time zone"),
        (
            {"schedule": "@daily", "start_date": date(2026, 2, 1), "end_date": date(2026, 1, 1)},
            "DAG 'bad': start_date 2026-02-01 is after end_date 2026-01-01",
        ),
        ({"schedule": "@daily", "catchup": True}, "DAG 'bad': start_date: catchup=True"),
        ({"schedule": timedelta(hours=1)}, "DAG 'bad': start_date: a timedelta schedule"),
        ({"max_active_runs": 0}, "DAG 'bad': max_active_runs must be >= 1"),
    ],
)
def test_a_bad_schedule_fails_the_dags_declaration(kwargs: dict, message: str) -> None:
    with pytest.raises(DagError) as caught:
        DAG("bad", **kwargs)
    assert message in str(caught.value)
