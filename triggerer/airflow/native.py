"""The native checks: what a natively recognised Airflow trigger waits for, checked without
running its class's ``run()``. Each yields the event Airflow's own class would have
yielded (the same payload), so the task's ``execute_complete`` sees no difference.

- A file (a glob): the provider's FileTrigger semantics exactly (the glob, ``recursive``; a match
  that is a file, or a directory holding a file somewhere below it), but one check per
  distinct (filepath, recursive) for every row waiting on it, made in a thread (Airflow's
  FileTrigger globs on its event loop), at the shortest ``poke_interval`` among them.
- A moment: :mod:`.native_time` (one timer for every instant held).

A literal path is waited for by name in its directory (:mod:`.native_files`); the glob
check here serves the paths with glob characters.
"""

from __future__ import annotations

import asyncio
import glob
import os
from collections.abc import AsyncGenerator, Callable
from typing import Any

from triggers.context import to_thread


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
