"""A catalogue row's schedule as people read it: its text, in words, and its next run.

Shared by `slotless dags list` and the web page's DAGs list, so that both say the same
thing about when a DAG runs next.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from executor.assets import describe
from executor.schedules import Schedule
from executor.store.viewrows import DagRow


@dataclass(frozen=True, slots=True)
class ScheduleShown:
    schedule: str | None  # as written: a cron, a preset, an ISO 8601 duration; None: none
    schedule_words: str | None  # None: no schedule (started by hand, or by its condition)
    next_run: str | None  # "2026-05-01 06:00 (due 2026-05-02 06:00)"; None: none due


def schedule_shown(d: DagRow) -> ScheduleShown:
    """A catalogue row's schedule as written, in words, and its next run: the logical date
    and when it is due, on the DAG's wall clock. The next run is the one the triggerer
    holds a wait for; before any is armed (a listing that only parsed), the one the
    schedule would start as of the file's last parse; a paused DAG has none."""
    if d.schedule is None and d.asset_schedule is not None:
        # Started by its assets' events, not by a clock: no next run to tell in advance.
        condition = describe(json.loads(d.asset_schedule))
        return ScheduleShown(None, f"when its assets are updated: {condition}", None)
    if d.schedule is None:
        return ScheduleShown(None, None, None)
    schedule = Schedule.from_json(d.schedule)
    text, words = schedule.text, schedule.words
    zone = ZoneInfo(d.timezone)
    if d.armed_due is not None and d.armed_logical_date is not None:
        logical = datetime.fromisoformat(d.armed_logical_date)
        due = datetime.fromisoformat(d.armed_due)
        shown = (
            f"{logical.astimezone(zone):%Y-%m-%d %H:%M} (due {due.astimezone(zone):%Y-%m-%d %H:%M})"
        )
        return ScheduleShown(text, words, shown)
    if d.next_logical_date is None or d.paused:
        return ScheduleShown(text, words, None)
    logical = datetime.fromisoformat(d.next_logical_date)
    interval = schedule.interval_starting(logical)
    shown = f"{logical.astimezone(zone):%Y-%m-%d %H:%M}"
    if interval is not None:
        shown += f" (due {interval.end.astimezone(zone):%Y-%m-%d %H:%M})"
    return ScheduleShown(text, words, shown)
