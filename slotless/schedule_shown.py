"""A catalogue row's schedule as people read it: in words, and its next run.

Shared by `slotless dags list` and the web page's DAGs list, so that both say the same
thing about when a DAG runs next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from executor.schedules import describe_stored, stored_next_run
from executor.store.viewrows import DagRow


@dataclass(frozen=True, slots=True)
class ScheduleShown:
    schedule_words: str | None  # None: no schedule (started by hand, or by its condition)
    next_run: str | None  # "2026-05-01 06:00 (due 2026-05-02 06:00)"; None: none due


def schedule_shown(d: DagRow) -> ScheduleShown:
    """A catalogue row's schedule in words, and its next run: the logical date and when
    it is due, on the DAG's wall clock. The next run is the one the triggerer holds a
    wait for; before any is armed (a listing that only parsed), the one the schedule
    would start as of the file's last parse; a paused DAG has none."""
    if d.schedule is None:
        return ScheduleShown(None, None)
    words = describe_stored(d.schedule, d.timezone)
    zone = ZoneInfo(d.timezone)
    if d.armed_due is not None and d.armed_logical_date is not None:
        logical = datetime.fromisoformat(d.armed_logical_date)
        due = datetime.fromisoformat(d.armed_due)
        shown = (
            f"{logical.astimezone(zone):%Y-%m-%d %H:%M} (due {due.astimezone(zone):%Y-%m-%d %H:%M})"
        )
        return ScheduleShown(words, shown)
    if d.next_logical_date is None or d.paused:
        return ScheduleShown(words, None)
    logical = datetime.fromisoformat(d.next_logical_date)
    interval = stored_next_run(d.schedule, d.timezone, logical)
    shown = f"{logical.astimezone(zone):%Y-%m-%d %H:%M}"
    if interval is not None:
        shown += f" (due {interval.end.astimezone(zone):%Y-%m-%d %H:%M})"
    return ScheduleShown(words, shown)
