"""The native checks: what a natively recognised Airflow trigger waits for, checked without
running its class's ``run()``. Each yields the event Airflow's own class would have
yielded (the same payload), so the task's ``execute_complete`` sees no difference.

- A file: the provider's FileTrigger semantics exactly (the glob, ``recursive``; a match
  that is a file, or a directory holding a file somewhere below it), but one check per
  distinct (filepath, recursive) for every row waiting on it, made in a thread (Airflow's
  FileTrigger globs on its event loop), at the shortest ``poke_interval`` among them.
- A moment: a timer (one sleeping task per distinct moment, no polling; Airflow's
  DateTimeTrigger wakes every second for its last 20 s), re-reading the wall clock when
  it wakes, so a clock stepped back is not fired early.
"""

from __future__ import annotations

import asyncio
import glob
import os
import time
from collections.abc import AsyncGenerator, Callable
from datetime import datetime
from typing import Any

from triggers.airflow import airflow_trigger_class
from triggers.context import to_thread

from .plans import DATETIME


async def file_events(
    path: str, recursive: bool, interval: Callable[[], float], on_check: Callable[[], None]
) -> AsyncGenerator[Any, None]:
    """Yields ``TriggerEvent(True)`` once ``path`` matches, as Airflow's FileTrigger does."""
    from airflow.triggers.base import TriggerEvent

    while True:
        found = await to_thread(file_found, path, recursive)
        on_check()
        if found:
            yield TriggerEvent(True)
            return
        await asyncio.sleep(interval())


def file_found(path: str, recursive: bool) -> bool:
    """The provider's FileTrigger check: a glob match that is a file, or a directory with
    a file in it (at any depth)."""
    for match in glob.glob(path, recursive=recursive):
        if os.path.isfile(match):
            return True
        for _, _, files in os.walk(match):
            if files:
                return True
    return False


async def time_events(moment: datetime, end_from_trigger: bool) -> AsyncGenerator[Any, None]:
    """At ``moment``: the DateTimeTrigger's own event (its payload, the moment in UTC), or
    ``TaskSuccessEvent`` when it ends the task from the trigger."""
    from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

    # Built, not run: its ``moment`` is the payload Airflow's run() yields (pendulum, UTC).
    trigger = airflow_trigger_class(DATETIME)(moment=moment, end_from_trigger=end_from_trigger)
    due = moment.timestamp()
    while (left := due - time.time()) > 0:
        # Capped: a long sleep would not notice the wall clock moving under it.
        await asyncio.sleep(min(left, 60.0))
    yield TaskSuccessEvent() if end_from_trigger else TriggerEvent(trigger.moment)
