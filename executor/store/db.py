"""The driver-level interface every backend implements.

A backend gives transactions (:class:`Tx`) that run named queries from
``schema/<backend>/queries.sql``. Everything above this line is backend-agnostic Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

Row = Mapping[str, Any]


class SchemaTooNew(RuntimeError):
    """The database was written by a newer slotless than this one."""


class Tx(Protocol):
    """One open transaction. Queries are called by name with positional parameters."""

    async def fetch(self, name: str, *args: Any) -> list[Row]: ...

    async def fetchone(self, name: str, *args: Any) -> Row | None: ...

    async def execute(self, name: str, *args: Any) -> int:
        """Run a statement; returns the number of rows it changed."""
        ...

    async def executemany(self, name: str, rows: Iterable[Sequence[Any]]) -> None: ...

    def ids(self, values: Sequence[int]) -> Any:
        """Encode a list of integer ids as one parameter (JSON on SQLite, an array on PG)."""
        ...


class Database(Protocol):
    backend: str
    url: str

    def write(self) -> AbstractAsyncContextManager[Tx]:
        """A read-write transaction that takes the write lock at once."""
        ...

    def read(self) -> AbstractAsyncContextManager[Tx]: ...

    async def wait(self, channel: str, timeout: float) -> bool:
        """Sleep until the database signals ``channel`` (True) or ``timeout`` passes (False).

        Channels: ``slotless_tasks`` (tasks became claimable) and ``slotless_triggers``
        (trigger rows were inserted). PostgreSQL wakes on LISTEN/NOTIFY; SQLite has no
        signal and simply sleeps, so callers keep polling there.
        """
        ...

    async def close(self) -> None: ...


TASKS_CHANNEL = "slotless_tasks"
TRIGGERS_CHANNEL = "slotless_triggers"
