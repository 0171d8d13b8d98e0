"""The embedded backend: one SQLite file through aiosqlite, in WAL mode.

Several processes (workers, a triggerer) may share the file: writes take the lock up
front with ``BEGIN IMMEDIATE`` and wait up to the busy timeout for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite

import schema
from schema import Query

from .db import Row, Tx, check_params
from .liveness import FileLiveness, Liveness, NoLiveness
from .migrate import migrate
from .opening import is_sqlite_read_only, migrating, missing_folder, read_only, translating

BUSY_TIMEOUT_MS = 30_000
# Overrides it (milliseconds): a lock held longer is not an error either way, the callers
# retry a write that met it (executor/driver/faults.py), so only how often they try changes.
BUSY_ENV = "SLOTLESS_SQLITE_BUSY_MS"

T = TypeVar("T")


class SqliteTx:
    def __init__(self, conn: aiosqlite.Connection, sql: dict[str, Query]) -> None:
        self._conn = conn
        self._sql = sql

    def _bind(self, name: str, /, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        query = self._sql[name]
        check_params(query, params)
        for key in query.lists:  # a list parameter arrives as one JSON array
            params[key] = json.dumps(list(params[key]))
        return query.sql, params

    async def fetch(self, name: str, /, **params: Any) -> list[Row]:
        # sqlite3.Row reads like a mapping (row["col"], keys()) without declaring it.
        return cast(list[Row], list(await self._conn.execute_fetchall(*self._bind(name, params))))

    async def fetchone(self, name: str, /, **params: Any) -> Row | None:
        rows = await self.fetch(name, **params)
        return rows[0] if rows else None

    async def execute(self, name: str, /, **params: Any) -> int:
        # One round trip to the connection's thread, not two (execute, then close the
        # cursor): each costs 20-100 us.
        return cast(
            int, await self._conn._execute(_changed, self._conn._conn, *self._bind(name, params))
        )

    async def executemany(self, name: str, rows: Iterable[Mapping[str, Any]]) -> None:
        query = self._sql[name]
        bound: list[Mapping[str, Any]]
        if query.lists:
            bound = [self._bind(name, dict(row))[1] for row in rows]
        else:  # no copy: sqlite3 reads the mappings as they are (10,000 runs' rows a tick)
            bound = list(rows)
            for row in bound:
                check_params(query, row)
        if bound:
            await self._conn.executemany(query.sql, bound)

    async def script(self, sql: str) -> None:
        # executescript would COMMIT; run statement by statement inside the transaction.
        for statement in _statements(sql):
            await self._conn.execute(statement)


class _ThreadTx(SqliteTx):
    """A transaction run whole in the driver's thread (:meth:`SqliteDatabase.transact`):
    the same statements, called on the sqlite3 connection directly, so each ``await`` on
    it finishes at once instead of being a round trip to the thread (20-100 us each)."""

    def __init__(self, raw: sqlite3.Connection, sql: dict[str, Query]) -> None:
        self._raw = raw
        self._sql = sql

    async def fetch(self, name: str, /, **params: Any) -> list[Row]:
        return cast(list[Row], self._raw.execute(*self._bind(name, params)).fetchall())

    async def execute(self, name: str, /, **params: Any) -> int:
        return _changed(self._raw, *self._bind(name, params))

    async def executemany(self, name: str, rows: Iterable[Mapping[str, Any]]) -> None:
        query = self._sql[name]
        bound: list[Mapping[str, Any]]
        if query.lists:
            bound = [self._bind(name, dict(row))[1] for row in rows]
        else:
            bound = list(rows)
            for row in bound:
                check_params(query, row)
        if bound:
            self._raw.executemany(query.sql, bound)

    async def script(self, sql: str) -> None:
        for statement in _statements(sql):
            self._raw.execute(statement)


def _changed(raw: sqlite3.Connection, sql: str, params: dict[str, Any]) -> int:
    """Run one statement; the rows it changed itself (sqlite3_changes: not those its SQL
    triggers changed, as the connection's total_changes would count them)."""
    cur = raw.execute(sql, params)
    try:
        cur.fetchall()  # a RETURNING statement counts its rows once stepped to the end
        return max(cur.rowcount, 0)
    finally:
        cur.close()


def _nothing() -> None:
    """Queued behind a transaction to learn when it has ended."""


def _in_thread(raw: sqlite3.Connection, sql: dict[str, Query], body: Callable[[Tx], Any]) -> Any:
    """Run a transaction body in the driver's thread, to its end, in one call."""
    raw.execute("BEGIN IMMEDIATE")
    try:
        coro = body(_ThreadTx(raw, sql))
        try:
            coro.send(None)
        except StopIteration as done:
            result = done.value
        else:
            coro.close()
            raise RuntimeError("a transaction body awaited something other than its transaction")
    except BaseException:
        raw.execute("ROLLBACK")
        raise
    raw.execute("COMMIT")
    return result


class SqliteDatabase:
    backend = "sqlite"

    def __init__(self, url: str, path: str, conn: aiosqlite.Connection) -> None:
        self.url = url
        self.path = path
        self._conn = conn
        self._sql = schema.queries("sqlite")
        # One connection per process: transactions from this process's coroutines queue here.
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str, path: str) -> SqliteDatabase:
        """Open (and migrate) the file; what goes wrong is one :class:`CannotOpen` line."""
        missing = missing_folder(url, path)
        if missing is not None:
            raise missing
        busy = int(os.environ.get(BUSY_ENV) or BUSY_TIMEOUT_MS)
        with translating(url, "sqlite"):
            conn = await _connect(path, busy)
        conn.row_factory = sqlite3.Row
        db = cls(url, path, conn)
        try:  # a file that is not a database fails here: close, or its thread keeps us alive
            with translating(url, "sqlite"):
                await conn.execute(f"PRAGMA busy_timeout = {busy}")
                await _wal(conn)
                await conn.execute("PRAGMA synchronous = NORMAL")
            with migrating(url, "sqlite"):
                await migrate(db, "sqlite")
        except BaseException:
            await conn.close()
            raise
        return db

    async def check_writes(self) -> None:
        """Raise :class:`ReadOnly` if the file refuses writes (a read-only file or folder,
        a read-only mount): a table created in a transaction that is rolled back."""

        def probe(raw: sqlite3.Connection) -> None:
            raw.execute("BEGIN IMMEDIATE")
            try:
                raw.execute("CREATE TABLE slotless_write_probe (x INTEGER)")
            finally:
                raw.execute("ROLLBACK")

        async with self._lock:
            try:
                await self._conn._execute(probe, self._conn._conn)
            except sqlite3.Error as exc:
                if is_sqlite_read_only(exc) or "disk i/o" in str(exc).lower():
                    raise read_only(self.url, "sqlite", str(exc)) from exc
                raise

    @asynccontextmanager
    async def write(self) -> AsyncIterator[SqliteTx]:
        async with self._lock:
            await self._begin("BEGIN IMMEDIATE")
            try:
                yield SqliteTx(self._conn, self._sql)
            except BaseException:
                await self._conn.execute("ROLLBACK")
                raise
            await self._conn.execute("COMMIT")

    async def transact(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """``body(tx)`` in one read-write transaction, run whole in the driver's thread:
        one call there for the transaction (BEGIN, every statement, COMMIT), instead of
        one per statement. The body must await nothing but ``tx`` (it fails otherwise).
        Cancelled meanwhile, the transaction still ends (committed or rolled back) before
        the cancellation goes on."""
        async with self._lock:
            # Awaited directly, not through a task and a shield: each of those was another
            # turn of the event loop on the way there and back, per transaction (the chain's
            # latency). The call is queued before the first suspension, so a cancellation
            # can only arrive once it is.
            try:
                return cast(
                    T, await self._conn._execute(_in_thread, self._conn._conn, self._sql, body)
                )
            except asyncio.CancelledError:
                # The driver's thread runs the transaction to its end regardless, and serves
                # its queue in order: once this no-op has run, the transaction has ended.
                with contextlib.suppress(Exception):
                    await self._conn._execute(_nothing)
                raise

    async def _begin(self, statement: str) -> None:
        """Run ``statement`` (a BEGIN); cancelled meanwhile, undo it before going on."""
        begin = asyncio.ensure_future(self._conn.execute(statement))
        try:
            await asyncio.shield(begin)
        except asyncio.CancelledError:
            # Cancelled while waiting (for the file's write lock, say): the driver's thread
            # still begins. End it, or this connection would stay in a transaction (holding
            # the lock) and refuse every later BEGIN ("cannot start a transaction within a
            # transaction").
            await asyncio.shield(self._undo_begin(begin))
            raise

    async def _undo_begin(self, begin: asyncio.Future[Any]) -> None:
        try:
            await begin
        except Exception:
            return  # it failed (e.g. busy timeout): no transaction to undo
        await self._conn.execute("ROLLBACK")

    @asynccontextmanager
    async def read(self) -> AsyncIterator[SqliteTx]:
        # Reads run in autocommit: each statement sees one consistent snapshot, and we
        # save the BEGIN/COMMIT round trips on the hot path.
        async with self._lock:
            yield SqliteTx(self._conn, self._sql)

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[SqliteTx]:
        # A deferred BEGIN takes no lock; in WAL mode the first SELECT starts a read
        # transaction, and every later one reads the same end of the log until COMMIT, while
        # other processes go on writing. (Autocommit reads would each see their own moment.)
        async with self._lock:
            await self._begin("BEGIN")
            try:
                yield SqliteTx(self._conn, self._sql)
            finally:
                # Ended whatever happens (cancelled too): a read transaction left open would
                # refuse this connection's next BEGIN and hold back the WAL's checkpoints.
                await asyncio.shield(self._end_read())

    async def _end_read(self) -> None:
        try:
            await self._conn.execute("COMMIT")
        except sqlite3.OperationalError:
            if self._conn.in_transaction:
                raise  # otherwise already ended (an error rolled it back): nothing to end

    def clock(self) -> float:
        """The host's clock: every process sharing the file runs on this host."""
        return time.time()

    async def wait(self, channel: str, timeout: float) -> bool:
        await asyncio.sleep(timeout)  # no notifications on SQLite: the caller polls
        return False

    def liveness(self) -> Liveness:
        """A lock file per process beside the database (one host); none in memory."""
        if self.path == ":memory:" or self.path.startswith("file::memory:"):
            return NoLiveness()
        return FileLiveness(Path(f"{os.path.abspath(self.path)}-live"))

    async def subscribe(
        self, channel: str, callback: Callable[[str | None], None]
    ) -> Callable[[], None] | None:
        return None  # no notifications on SQLite: push sources that need them poll

    async def close(self) -> None:
        await self._conn.close()


async def _connect(path: str, busy: int) -> aiosqlite.Connection:
    """aiosqlite's connect, waiting on a failure until its thread has ended: the thread
    reports its end to the event loop, and a command that exits on the error at once would
    close the loop first ("Event loop is closed", twice, from that thread)."""
    conn = aiosqlite.connect(path, isolation_level=None, timeout=busy / 1000)
    try:
        return await conn
    except BaseException:
        thread = getattr(conn, "_thread", None)
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, 5.0)
        raise


async def _wal(conn: aiosqlite.Connection) -> None:
    """Switch to WAL. Two processes opening a new file at once may get "database is locked"
    here at once (SQLite does not wait on the busy timeout for it): retry until it passes."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            await conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)


def _statements(script: str) -> list[str]:
    """Split a DDL file into statements (our DDL has no ``--`` or ``;`` inside literals);
    a trigger's ``BEGIN ... END`` stays whole (sqlite3.complete_statement says when)."""
    text = re.sub(r"--[^\n]*", "", script)
    out, part = [], ""
    for piece in text.split(";"):
        part += piece + ";"
        if sqlite3.complete_statement(part):
            if stmt := part.strip().removesuffix(";").strip():
                out.append(stmt)
            part = ""
    if stmt := part.strip().removesuffix(";").strip():
        out.append(stmt)
    return out
