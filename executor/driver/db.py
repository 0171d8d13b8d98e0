"""The driver-level interface every backend implements.

A backend gives transactions (:class:`Tx`) that run named queries (``schema/common`` and
``schema/<backend>``, compiled to the driver's placeholder style by :mod:`schema`) with
keyword parameters. Everything above this line is backend-agnostic Python.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from executor.rows import Row  # a driver row, defined once, where the typed rows are
from schema import Query

from .liveness import Liveness

T = TypeVar("T")


class SchemaTooNew(RuntimeError):
    """The database was written by a newer slotless than this one."""


class Tx(Protocol):
    """One open transaction. Queries are called by name with keyword parameters; a list
    goes as a list (to a ``= ANY(:name)`` parameter), whatever the backend."""

    async def fetch(self, name: str, /, **params: Any) -> list[Row]: ...

    async def fetchone(self, name: str, /, **params: Any) -> Row | None: ...

    async def execute(self, name: str, /, **params: Any) -> int:
        """Run a statement; returns the number of rows it changed."""
        ...

    async def executemany(self, name: str, rows: Iterable[Mapping[str, Any]]) -> None: ...

    async def script(self, sql: str) -> None:
        """Run a DDL script of several statements (a migration) in this transaction."""
        ...


class Database(Protocol):
    backend: str
    url: str

    def clock(self) -> float:
        """Now, in epoch seconds: the host's clock, or the server's where there is one."""
        ...

    def write(self) -> AbstractAsyncContextManager[Tx]:
        """A read-write transaction that takes the write lock at once."""
        ...

    def read(self) -> AbstractAsyncContextManager[Tx]:
        """Reads, each statement in autocommit: each sees one consistent state, but two
        statements may see two (a write may commit between them). Cheap: for hot paths."""
        ...

    def snapshot(self) -> AbstractAsyncContextManager[Tx]:
        """A read-only transaction whose statements all see the same committed state (SQLite:
        one WAL read transaction; PostgreSQL: REPEATABLE READ, READ ONLY). For what a person
        reads at once (a web page's view), so that it never mixes two moments."""
        ...

    async def transact(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """``await body(tx)`` in one read-write transaction, as ``async with write()``
        would, for a body that awaits nothing but ``tx``: SQLite runs it whole in its
        driver's thread, one call per transaction instead of one per statement."""
        ...

    async def wait(self, channel: str, timeout: float) -> bool:
        """Sleep until the database signals ``channel`` (True) or ``timeout`` passes (False).

        Channels: ``slotless_tasks`` (tasks became claimable) and ``slotless_triggers``
        (trigger rows were inserted). PostgreSQL wakes on LISTEN/NOTIFY; SQLite has no
        signal and simply sleeps, so callers keep polling there.
        """
        ...

    def liveness(self) -> Liveness:
        """This process's lock that dies with it (executor/driver/liveness.py)."""
        ...

    async def subscribe(
        self, channel: str, callback: Callable[[str | None], None]
    ) -> Callable[[], None] | None:
        """Call ``callback(payload)`` for each NOTIFY on ``channel`` (``None``: the LISTEN
        connection was lost, something may have been missed) until the returned function
        is called. None where there are no notifications (SQLite)."""
        ...

    async def check_writes(self) -> None:
        """Raise :class:`~executor.driver.opening.ReadOnly` if the database refuses writes
        (asked once at the start of a command that writes; read-only commands skip it)."""
        ...

    async def close(self) -> None: ...


TASKS_CHANNEL = "slotless_tasks"
TRIGGERS_CHANNEL = "slotless_triggers"


class BadParameters(TypeError):
    """A statement was called with parameters it does not take, or without one it needs."""


def check_params(query: Query, params: Mapping[str, Any]) -> None:
    """Name every missing or unknown parameter at once (a typo fails here, not in SQL)."""
    if params.keys() != query.names:
        missing = sorted(query.names - params.keys())
        unknown = sorted(params.keys() - query.names)
        raise BadParameters(f"query {query.name}: missing {missing}, unknown {unknown}")
