"""A task's log read after a cursor, and its lines written while the attempt runs.

The :class:`LogLines` part of the store. A task's log is its ``task_event`` rows
(transitions, ``ctx.log`` lines, checks, tracebacks), ordered by id. A reader keeps the id
of the last entry it has (the cursor) and asks for the entries after it: an id, not a
time, because two lines written in the same millisecond have the same ``ts`` but never the
same id. On SQLite one writer at a time commits, so ids are committed in order; on
PostgreSQL an id is taken at INSERT, so :data:`log_after` holds back the rows of
transactions that are newer than the oldest one still running (see schema/common/logs.sql):
a cursor never moves past a row that could still appear below it.

The worker writes a running attempt's new lines every :data:`LOG_FLUSH_EVERY` seconds
(:meth:`LogLines.append`), the rest with the attempt's outcome, so a log grows while its
task runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from executor.states import TERMINAL

from .part import Part
from .viewrows import EventRow

# How often a worker writes its running attempts' new log lines (seconds).
LOG_FLUSH_EVERY = 0.5
# A whole log's read (a download) waits at most this long (seconds) for an entry held back
# by a transaction still open elsewhere on the PostgreSQL server, HELD_POLL between looks.
HELD_WAIT = 5.0
HELD_POLL = 0.05
# At most this many entries in one read (a page of the API, a chunk of a download).
MAX_PAGE = 5000


@dataclass(frozen=True, slots=True)
class LogPage:
    """Entries of one task's log after a cursor, and where the next read starts."""

    entries: list[EventRow]
    cursor: int  # the last entry's id, or the cursor given when there is none
    state: str  # the task's state when read
    more: bool  # at least one more entry was there past this page
    held: bool = False  # an entry after these is held back until it is settled (PostgreSQL)

    @property
    def finished(self) -> bool:
        """The task has ended and every entry of its log was read: it grows no more
        (unless the task is cleared and runs again)."""
        return self.state in TERMINAL and not self.more and not self.held


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line a running attempt wrote, to be stored now."""

    task_row: int
    attempt: int
    ts: float
    message: str


class LogLines(Part):
    async def after(
        self, run_id: str, task_id: str, map_index: int, since: int, limit: int
    ) -> LogPage | None:
        """At most ``limit`` entries of a task's log after the id ``since`` (0: from the
        start), in one read transaction; None if the run has no such task."""
        n = max(1, min(limit, MAX_PAGE))
        async with self.db.read() as tx:
            task = await tx.fetchone(
                "log_task", run_id=run_id, task_id=task_id, map_index=map_index
            )
            if task is None:
                return None
            rows = await tx.fetch("log_after", task_row=task["id"], since=since, n=n + 1)
        settled = 0
        while settled < min(n, len(rows)) and rows[settled]["settled"]:
            settled += 1
        held = settled < len(rows) and not rows[settled]["settled"]
        entries = [EventRow.of(r) for r in rows[:settled]]
        cursor = entries[-1].id if entries else since
        return LogPage(entries, cursor, task["state"], more=len(rows) > n, held=held)

    async def pages(
        self, run_id: str, task_id: str, map_index: int, size: int = MAX_PAGE
    ) -> AsyncIterator[list[EventRow]]:
        """The whole log, ``size`` entries a read (each its own short transaction): a big
        log is sent as it is read, never held whole in memory nor one transaction open."""
        since, held_since = 0, None
        while True:
            page = await self.after(run_id, task_id, map_index, since, size)
            if page is None:
                return
            if page.entries:
                yield page.entries
                since, held_since = page.cursor, None
            if page.more:
                continue
            if not page.held:
                return
            # A transaction newer than one still running wrote the next entry (PostgreSQL):
            # settled within milliseconds, unless a transaction stays open that long.
            held_since = held_since if held_since is not None else time.monotonic()
            if time.monotonic() - held_since > HELD_WAIT:
                return
            await asyncio.sleep(HELD_POLL)

    async def append(self, lines: Sequence[LogLine]) -> None:
        """Store lines of running attempts, in one transaction (in the order given)."""
        if not lines:
            return
        async with self.db.write() as tx:
            await tx.executemany(
                "append_log_line",
                [
                    {"task_row": x.task_row, "attempt": x.attempt, "ts": x.ts, "message": x.message}
                    for x in lines
                ],
            )
