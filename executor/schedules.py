"""Schedules: which data intervals a DAG's runs cover, and when each run is due.

A :class:`Schedule` is built once from what a DAG declares: a cron string (``"0 6 * * *"``),
a preset (``"@daily"``), a :class:`~datetime.timedelta`, plus a time zone, optional
``start_date`` / ``end_date`` and ``catchup``. The catalogue stores it as JSON
(:meth:`Schedule.to_json`) and every reader gets the same value back
(:meth:`Schedule.from_json`): the triggerer arming and firing it, backfill, the listings.
They all ask it when a run is due (:meth:`Schedule.next_run`, :meth:`Schedule.intervals`).

Its *ticks* are the instants the cron matches on the wall clock of its zone (or
``start_date + k * every`` for a timedelta). Two consecutive ticks make an
:class:`Interval`, with Airflow's meaning: the run for ``[start, end)`` has the logical
date ``start`` and is due at ``end``. A daily 06:00 schedule's run for
``[Mon 06:00, Tue 06:00)`` has logical date Mon 06:00 and runs on Tue 06:00.

Every datetime that goes in must be aware; every one that comes out is aware and in UTC.

Cron expressions are evaluated by cronsim, which follows Debian cron across DST changes: a
wall time the clock skips runs at the first minute after the jump (02:30 on a
spring-forward day runs at 03:00), a wall time the clock passes twice runs once (the first
time), and schedules with ``*`` in the minute or hour field (``@hourly``) follow real time,
so they tick 23 and 25 times on those days. docs/scheduling.md says more, and why cronsim.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
# Presets other tools know that are not intervals; each refused with what to use instead.
REFUSED = {
    "@once": "a DAG that runs once has schedule=None and is started by hand",
    "@continuous": "continuous runs are not supported",
    "@reboot": "slotless has no reboot to run at",
}
FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("", "January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")  # fmt: skip
# The longest a valid cron can go without a tick: "0 0 29 2 1" (29 February, a Monday).
_MAX_GAP = timedelta(days=366 * 30)
_ISO_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?")


@dataclass(frozen=True, slots=True)
class Interval:
    """A data interval ``[start, end)`` in UTC; its run's logical date is ``start``."""

    start: datetime
    end: datetime
    zone: ZoneInfo = field(default=ZoneInfo("UTC"), compare=False)  # for ds; not compared

    @property
    def logical_date(self) -> datetime:
        return self.start

    @property
    def ds(self) -> str:
        """``{{ ds }}``: the date of ``start`` on the schedule's wall clock, ``YYYY-MM-DD``."""
        return self.start.astimezone(self.zone).date().isoformat()


@dataclass(frozen=True, slots=True)
class Schedule:
    """When runs are due. Build it with :meth:`parse`; :meth:`to_json` is its stored form."""

    text: str  # "0 6 * * *", "@daily" or an ISO 8601 duration "PT1H30M": parse() reads it back
    zone: ZoneInfo
    cron: str | None = None  # five fields, presets expanded
    every: timedelta | None = None
    start_date: datetime | None = None  # UTC
    end_date: datetime | None = None  # UTC
    # Every interval since start_date runs (True), or only the latest ended one (False).
    catchup: bool = False

    @classmethod
    def parse(
        cls,
        spec: str | timedelta,
        *,
        timezone: str | ZoneInfo = "UTC",
        start_date: datetime | date | None = None,
        end_date: datetime | date | None = None,
        catchup: bool = False,
    ) -> Schedule:
        """A schedule from a cron string, a preset, a timedelta (or its ISO 8601 text).

        A naive ``start_date``/``end_date`` (or a date: its midnight) is wall time in
        ``timezone``. Raises :class:`ValueError` naming the field that is wrong.
        """
        zone = _zone(timezone)
        start = _instant(start_date, zone, "start_date")
        end = _instant(end_date, zone, "end_date")
        if start is not None and end is not None and start > end:
            raise ValueError(f"start_date {start_date} is after end_date {end_date}")
        if catchup and start is None:
            raise ValueError("start_date: catchup=True catches up from it, and there is none")
        if isinstance(spec, timedelta) or (isinstance(spec, str) and spec.startswith("P")):
            every = spec if isinstance(spec, timedelta) else _duration(spec)
            if every <= timedelta(0):
                raise ValueError(f"schedule: a timedelta must be positive, not {every}")
            if every % timedelta(seconds=1):
                raise ValueError(f"schedule: a timedelta is whole seconds, not {every}")
            if start is None:
                raise ValueError("start_date: a timedelta schedule counts its intervals from it")
            text = _duration_text(every)
            return cls(text, zone, None, every, start, end, bool(catchup))
        if not isinstance(spec, str):
            raise ValueError(f"schedule: a cron string, a preset or a timedelta, not {spec!r}")
        text = " ".join(spec.split())
        return cls(text, zone, _cron(text), None, start, end, bool(catchup))

    def to_json(self) -> str:
        """What the catalogue stores: enough for :meth:`from_json` to give this value back."""
        return json.dumps(
            {
                "schedule": self.text,
                "timezone": self.zone.key,
                "start_date": _iso(self.start_date),
                "end_date": _iso(self.end_date),
                "catchup": self.catchup,
            },
            sort_keys=True,
        )

    @staticmethod
    def from_json(text: str) -> Schedule:
        """The schedule :meth:`to_json` stored. Parsed once per text: 10,000 DAGs on one
        cron fired together read one value."""
        return _from_json(text)

    # -------------------------------------------------------------------- intervals

    def next_interval(self, after: datetime) -> Interval | None:
        """The earliest interval whose end is strictly after ``after``: the run that falls
        due next. It contains ``after``, or is the first interval if ``after`` is before it.
        None past ``end_date``. ``next_interval(iv.end)`` is the interval following ``iv``."""
        _aware(after, "after")
        start = self._tick_at_or_before(after)
        first = self._first_start()
        if start is None or (first is not None and start < first):
            start = first if first is not None else self._tick_after(after)
        return self._interval(start)

    def intervals(self, start: datetime, end: datetime) -> Iterator[Interval]:
        """Every interval whose logical date is in ``[start, end)``, oldest first, within
        ``start_date`` and ``end_date``: catchup's and backfill's runs. Lazy."""
        _aware(start, "start")
        _aware(end, "end")
        first = self._first_start()
        if first is not None and first > start:
            start = first
        tick: datetime | None = self._tick_after(start - timedelta(microseconds=1))
        while tick is not None and tick < end:
            interval = self._interval(tick)
            if interval is None:
                return
            yield interval
            tick = interval.end

    def latest_complete(self, now: datetime) -> Interval | None:
        """The interval that ended last at or before ``now``: with ``catchup=False``, the
        one run created when a DAG starts. None if none has ended since ``start_date``."""
        _aware(now, "now")
        end = self._tick_at_or_before(now)
        start = None if end is None else self._tick_at_or_before(end - timedelta(microseconds=1))
        if self.end_date is not None and start is not None and start > self.end_date:
            start = self._tick_at_or_before(self.end_date)
        first = self._first_start()
        if start is None or (first is not None and start < first):
            return None
        return self._interval(start)

    def first_interval(self, now: datetime) -> Interval | None:
        """The first run a DAG with no runs yet would create, as of ``now``: with catchup,
        the first interval from ``start_date``; without, the latest complete interval, or
        the next one if none is complete. None when ``end_date`` has passed."""
        _aware(now, "now")
        first = self._first_start()
        if self.catchup and first is not None:
            return self._interval(first)
        return self.latest_complete(now) or self.next_interval(now)

    def next_run(self, after: datetime | None, now: datetime) -> Interval | None:
        """The run to wait for next, as of ``now``: the interval after the one ending at
        ``after`` (None: no run yet, :meth:`first_interval`), a missed one skipped as
        :meth:`skip_missed` says. None past ``end_date``."""
        if after is None:
            return self.first_interval(now)
        return self.skip_missed(self.next_interval(after), now)

    def skip_missed(self, interval: Interval | None, now: datetime) -> Interval | None:
        """``interval``, or without catchup, when it ended before ``now`` (missed: a pause,
        an outage, a late fire), the latest ended interval in its place."""
        if interval is None or self.catchup or interval.end > now:
            return interval
        latest = self.latest_complete(now)
        return latest if latest is not None and latest.start > interval.start else interval

    def interval_starting(self, logical_date: datetime) -> Interval | None:
        """The interval whose logical date is ``logical_date`` (None: not one of its ticks)."""
        interval = self.next_interval(logical_date)
        return interval if interval is not None and interval.start == logical_date else None

    # ------------------------------------------------------------------------ words

    @property
    def words(self) -> str:
        """When it ticks, in words: "every day at 06:00 Europe/Paris" (the DAG listings)."""
        return _describe(self.cron, self.every, self.zone)

    def describe(self) -> str:
        """In words, with its end: "every day at 06:00 UTC, until 2026-01-12 12:00"."""
        words = self.words
        if self.end_date is not None:
            words += f", until {self.end_date.astimezone(self.zone):%Y-%m-%d %H:%M}"
        return words

    def __str__(self) -> str:
        return self.text

    # ------------------------------------------------------------------------ ticks

    def _first_start(self) -> datetime | None:
        """The first tick at or after ``start_date`` (None: no start_date)."""
        if self.start_date is None:
            return None
        return self._tick_after(self.start_date - timedelta(microseconds=1))

    def _interval(self, start: datetime) -> Interval | None:
        if self.end_date is not None and start > self.end_date:
            return None
        return Interval(start, self._tick_after(start), self.zone)

    def _tick_after(self, after: datetime) -> datetime:
        """The first tick strictly after ``after``."""
        if self.every is not None:
            assert self.start_date is not None
            if after < self.start_date:
                return self.start_date
            return self.start_date + ((after - self.start_date) // self.every + 1) * self.every
        assert self.cron is not None
        # From inside a repeated hour, cronsim may return the first pass of that hour,
        # which is before `after`: take its next tick until one is later.
        for tick in CronSim(self.cron, after.astimezone(self.zone)):
            if tick > after:
                return tick.astimezone(UTC)
        raise AssertionError("a cron that parsed has ticks")  # pragma: no cover

    def _tick_at_or_before(self, at: datetime) -> datetime | None:
        """The last tick at or before ``at`` (None before a timedelta's start_date).

        Found going forward (cronsim's reverse iteration disagrees with its forward one
        in rare zones), through a look-back that doubles: a few steps for any cron."""
        if self.every is not None:
            assert self.start_date is not None
            if at < self.start_date:
                return None
            return self.start_date + ((at - self.start_date) // self.every) * self.every
        span = timedelta(minutes=1)
        while span <= _MAX_GAP:
            tick = self._tick_after(at - span)
            if tick <= at:
                while (later := self._tick_after(tick)) <= at:
                    tick = later
                return tick
            span *= 2
        raise AssertionError("a cron that parsed has ticks")  # pragma: no cover


# ---------------------------------------------------------------------- parsing


@functools.lru_cache(maxsize=4096)
def _from_json(text: str) -> Schedule:
    stored = json.loads(text)
    return Schedule.parse(
        stored["schedule"],
        timezone=stored["timezone"],
        start_date=_from_iso(stored["start_date"]),
        end_date=_from_iso(stored["end_date"]),
        catchup=bool(stored["catchup"]),
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _from_iso(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text).astimezone(UTC)


def _zone(timezone: str | ZoneInfo) -> ZoneInfo:
    if isinstance(timezone, ZoneInfo):
        return timezone
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"timezone: unknown time zone {timezone!r} (an IANA name)") from None


def _instant(value: datetime | date | None, zone: ZoneInfo, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, date):
        raise ValueError(f"{name}: a datetime or a date, not {value!r}")
    if not isinstance(value, datetime):
        value = datetime.combine(value, time())
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    return value.astimezone(UTC)


def _aware(value: datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name}: a timezone-aware datetime, not the naive {value}")


def _cron(text: str) -> str:
    """Five cron fields (a preset expanded), or ValueError naming the bad field."""
    if text.startswith("@"):
        if text.lower() in REFUSED:
            raise ValueError(f"schedule: {text} is not supported: {REFUSED[text.lower()]}")
        if text.lower() not in PRESETS:
            raise ValueError(f"schedule: unknown preset {text!r} (known: {', '.join(PRESETS)})")
        return PRESETS[text.lower()]
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(
            f"bad cron {text!r}: 5 fields (minute hour day-of-month month day-of-week), "
            f"not {len(parts)}"
        )
    try:
        CronSim(text, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"bad cron {text!r}: {_cron_problem(parts, str(exc))}") from None
    return text


def _cron_problem(parts: list[str], message: str) -> str:
    """cronsim says "Bad minute": name the value, when it is a number out of range."""
    for i, name in enumerate(FIELDS):
        if message.lower().endswith(name):
            low, high = RANGES[i]
            # Numbers that are values, not steps ("/15") or nth weekdays ("#2").
            for number in re.findall(r"(?<![/#\d])\d+", parts[i]):
                if not low <= int(number) <= high:
                    return f"{name} {number} out of range {low}-{high}"
            if name == "day-of-month" and "*" not in parts[i]:
                return f"day-of-month {parts[i]!r} never occurs in month {parts[3]!r}"
            return f"{name} {parts[i]!r} is not valid"
    return message


def _duration(text: str) -> timedelta:
    match = _ISO_DURATION.fullmatch(text)
    if match is None or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(f"schedule: bad duration {text!r} (ISO 8601, as P1DT2H30M)")
    days, hours, minutes, secs = (int(g or 0) for g in match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=secs)


def _duration_text(every: timedelta) -> str:
    hours, rest = divmod(every.seconds, 3600)
    minutes, secs = divmod(rest, 60)
    day = f"{every.days}D" if every.days else ""
    clock = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M"), (secs, "S")) if n)
    return f"P{day}" + (f"T{clock}" if clock else "")


# ------------------------------------------------------------------------ words


def _describe(cron: str | None, every: timedelta | None, zone: ZoneInfo) -> str:
    if every is not None:
        hours, rest = divmod(every.seconds, 3600)
        units = (
            (every.days, "day"),
            (hours, "hour"),
            (rest // 60, "minute"),
            (rest % 60, "second"),
        )
        return "every " + " ".join(f"{n} {u}{'s' if n > 1 else ''}" for n, u in units if n)
    assert cron is not None
    minute, hour, dom, month, dow = cron.split()
    if cron == "* * * * *":
        return "every minute"
    if (step := re.fullmatch(r"\*/(\d+)", minute)) and (hour, dom, month, dow) == ("*",) * 4:
        return f"every {step.group(1)} minutes"
    if minute.isdigit() and (hour, dom, month, dow) == ("*",) * 4:
        return f"every hour at :{int(minute):02d}"
    at_hours = hour.split(",")
    if not minute.isdigit() or not all(h.isdigit() for h in at_hours):
        return f"cron '{cron}' {zone.key}"
    at = " and ".join(f"{int(h):02d}:{int(minute):02d}" for h in at_hours)
    if (dom, month, dow) == ("*", "*", "*"):
        return f"every day at {at} {zone.key}"
    if (dom, month) == ("*", "*") and (days := _days(dow)):
        return f"every {days} at {at} {zone.key}"
    if dom.isdigit() and (month, dow) == ("*", "*"):
        return f"on day {int(dom)} of every month at {at} {zone.key}"
    if dom.isdigit() and month.isdigit() and dow == "*" and 1 <= int(month) <= 12:
        return f"every {int(dom)} {MONTHS[int(month)]} at {at} {zone.key}"
    return f"cron '{cron}' {zone.key}"


def _days(dow: str) -> str | None:
    """Days of week in words ("1-5": Monday to Friday; "1,3": Monday and Wednesday), or None."""
    if re.fullmatch(r"[0-7]-[0-7]", dow):
        first, last = (int(d) for d in dow.split("-"))
        return f"{DAYS[first]} to {DAYS[last]}"
    if re.fullmatch(r"[0-7](,[0-7])*", dow):
        return " and ".join(DAYS[int(d)] for d in dow.split(","))
    return None
