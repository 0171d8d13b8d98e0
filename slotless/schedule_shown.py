"""A catalogue row's schedule as people read it: its text, in words, and its next run.

Shared by `slotless dags list` and the web page's DAGs list, so that both say the same
thing about when a DAG runs next.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from executor.schedules import Schedule


def schedule_shown(d: Any) -> dict[str, str | None]:
    """A catalogue row's schedule as written (a cron, a preset, an ISO 8601 duration), in
    words, and its next run: the logical date and when it is due, on the DAG's wall clock.
    The next run is the one the triggerer holds a wait for; before any is armed (a listing
    that only parsed), the one the schedule would start as of the file's last parse; a
    paused DAG has none."""
    if d["schedule"] is None:
        return {"schedule": None, "schedule_words": None, "next_run": None}
    schedule = Schedule.from_json(d["schedule"])
    shown: dict[str, str | None] = {"schedule": schedule.text, "schedule_words": schedule.words}
    zone = ZoneInfo(d["timezone"])
    if d["armed_due"] is not None:
        logical = datetime.fromisoformat(d["armed_logical_date"])
        due = datetime.fromisoformat(d["armed_due"])
        shown["next_run"] = (
            f"{logical.astimezone(zone):%Y-%m-%d %H:%M} (due {due.astimezone(zone):%Y-%m-%d %H:%M})"
        )
        return shown
    if d["next_logical_date"] is None or d["paused"]:
        return shown | {"next_run": None}
    logical = datetime.fromisoformat(d["next_logical_date"])
    interval = schedule.interval_starting(logical)
    text = f"{logical.astimezone(zone):%Y-%m-%d %H:%M}"
    if interval is not None:
        text += f" (due {interval.end.astimezone(zone):%Y-%m-%d %H:%M})"
    return shown | {"next_run": text}
