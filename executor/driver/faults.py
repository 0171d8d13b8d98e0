"""Database faults: which errors pass (retry the same batch), and finding a poison row.

A batched write (a worker's :meth:`Exchange.exchange`, a triggerer's flush) can fail for two
kinds of reasons:

* **transient**: the server restarted or is unreachable, a connection broke, a deadlock or
  serialization failure rolled the transaction back, SQLite's lock outlived the busy
  timeout, the database went read-only (a file or mount made read-only, a failover that
  left us on a standby): an operator's fix away, not a bad row. The same batch will go
  through later: keep it, back off, retry (:class:`Backoff`), never fail a task for it;
* **anything else** is deterministic: the same batch fails the same way for ever. So the
  batch is split in halves until the rows that fail alone are found (:func:`split_apart`);
  those rows' tasks fail with the error, every other row goes through.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from .opening import is_read_only

T = TypeVar("T")

# Seconds between two WARNING lines of one loop while the database stays away (the first
# failure is logged at once); the environment variable overrides it (tests shrink it).
REMIND_EVERY = 60.0
REMIND_ENV = "SLOTLESS_DB_WARN_EVERY"

# PostgreSQL SQLSTATE classes that say "try again": 08 connection exception, 40 transaction
# rollback (serialization failure, deadlock detected), 53 insufficient resources (too many
# connections), 57 operator intervention (admin shutdown, cannot connect now), 55P03 lock
# not available.
_TRANSIENT_SQLSTATE = ("08", "40", "53", "57", "55P03")


def is_transient(exc: BaseException) -> bool:
    """True if retrying the same work later may succeed (see the module's docstring)."""
    if isinstance(exc, OSError | TimeoutError | ConnectionError | asyncio.TimeoutError):
        return True
    if is_read_only(exc):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return "locked" in text or "busy" in text or "disk i/o" in text
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate.startswith(_TRANSIENT_SQLSTATE):
        return True
    try:  # asyncpg's own: a connection closed under us, a pool that was closed
        import asyncpg
    except ImportError:  # pragma: no cover - the postgres extra is not installed
        return False
    # InternalClientError ("cannot switch to state N; another operation is in progress") is
    # what asyncpg raises on a connection the server terminated mid-operation.
    broken = asyncpg.InterfaceError | asyncpg.PostgresConnectionError | asyncpg.InternalClientError
    return isinstance(exc, broken)


async def split_apart(
    items: Sequence[T], write: Callable[[Sequence[T]], Awaitable[None]]
) -> list[tuple[T, Exception]]:
    """Write ``items``; on a non-transient error, write each half, down to single items.

    Returns the items that fail on their own, each with its error; every other item has been
    written. A transient error is raised as is (what was written so far stays written: every
    write the callers make is idempotent, a compare-and-set). Costs about 2 log2(n) writes
    per bad item.
    """
    try:
        await write(items)
        return []
    except Exception as exc:
        if is_transient(exc):
            raise
        if len(items) == 1:
            return [(items[0], exc)]
    mid = len(items) // 2
    return [*await split_apart(items[:mid], write), *await split_apart(items[mid:], write)]


class Backoff:
    """Retry delays for a lost database: 0.5 s doubling to ``cap`` with jitter, logged once
    a minute.

    The cap is short (5 s) on purpose: a server back after an outage is used within seconds.

    The first failure is logged at WARNING with what failed; later ones at DEBUG but for a
    WARNING reminder every ``REMIND_EVERY`` seconds (60; $SLOTLESS_DB_WARN_EVERY) while it
    lasts, and the recovery at WARNING with how long it lasted: an outage of seconds is two
    lines, a database left read-only for an hour one line a minute, never a traceback.
    """

    def __init__(
        self, what: str, logger: logging.Logger, *, first: float = 0.5, cap: float = 5.0
    ) -> None:
        self._what = what
        self._log = logger
        self._first = first
        self._cap = cap
        self.failures = 0
        self._since = 0.0
        self._warned = 0.0  # monotonic time of the last WARNING of this outage
        self._remind_every = float(os.environ.get(REMIND_ENV) or REMIND_EVERY)

    def failed(self, exc: BaseException) -> float:
        """Record a failure; returns how long to wait before the next try.

        A transient error is logged once per outage; any other is a bug or a bad row, and is
        logged every time with its traceback."""
        now = time.monotonic()
        if self.failures == 0:
            self._since = now
        why = "read-only" if is_read_only(exc) else "unavailable"
        if not is_transient(exc):
            self._log.error("%s failed; retrying", self._what, exc_info=exc)
        elif self.failures == 0:
            self._warned = now
            self._log.warning(
                "%s: database %s (%s: %s); retrying with backoff",
                self._what,
                why,
                type(exc).__name__,
                exc,
            )
        elif now - self._warned >= self._remind_every:
            self._warned = now
            self._log.warning(
                "%s: database still %s after %.0f s (%d failed tries; %s: %s)",
                self._what,
                why,
                now - self._since,
                self.failures,
                type(exc).__name__,
                exc,
            )
        else:
            self._log.debug("%s: still failing (%s)", self._what, exc)
        self.failures += 1
        delay = min(self._cap, self._first * 2 ** (self.failures - 1))
        return delay * (0.5 + random.random() / 2)

    def succeeded(self) -> None:
        if self.failures:
            self._log.warning(
                "%s: database back after %.1f s (%d failed tries)",
                self._what,
                time.monotonic() - self._since,
                self.failures,
            )
        self.failures = 0
