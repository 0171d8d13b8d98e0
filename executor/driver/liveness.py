"""Liveness bound to the process: a lock that the database server or the kernel releases
the moment the process holding it dies.

Every worker and triggerer holds one, named by its id, for as long as it runs. The others
ask which ids still hold theirs (:meth:`Liveness.alive`) about once a second, and act on
an id that does not at once (take over its shards, retry its attempts), instead of
waiting for its lease or heartbeat to grow older than the TTL.

* PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock(space, key)``) on a
  connection of its own. A SIGKILLed process's socket is closed by its kernel, the server
  ends that session and the lock is gone; ``pg_locks`` shows every lock held, so one query
  answers for all ids at once, without taking anything. A restart of the server drops
  every lock at once: nobody judges while the server has been up for less than a grace
  period (the others are taking theirs again), nor for that long after taking its own
  lock again (its connection dropped: a restart, or a network cut).
* SQLite (one host): a POSIX record lock (``fcntl.lockf``) on a file of its own beside the
  database file, ``<db>-live/<key>.lock``. The kernel drops it when the process dies;
  another process learns it by taking the lock itself (it then removes the file).

Neither tells a *hung* process (SIGSTOP, a long pause, a partitioned host) from a live
one: its lock stays held. That case is the TTL's: leases and heartbeats still expire, and
the process fences itself when it wakes (see docs/operations.md, "Liveness").
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("slotless.liveness")

# The advisory-lock space of slotless's liveness locks (the two-integer form, so that no
# single-bigint lock, ours or an application's, can collide with them).
LOCK_SPACE = 0x510715
# Nobody is judged for this long after the server started, nor by a process that has
# just taken its own lock again: after a restart every process reconnects within a second
# or two, and none of them must read the others' locks, not yet taken again, as deaths.
GRACE = 5.0
RECONNECT_EVERY = 1.0


def lock_key(ident: str) -> int:
    """A process id as a positive 31-bit key (an ``oid`` in ``pg_locks`` reads the same)."""
    return int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=4).digest()) & 0x7FFFFFFF


class LockTaken(RuntimeError):
    """Another live process holds the lock this id maps to (pick another id)."""


class Liveness(Protocol):
    """One process's lock, and the question of who else still holds theirs."""

    @property
    def held(self) -> bool:
        """Whether this process holds its lock right now (False while reconnecting)."""
        ...

    async def hold(self, ident: str) -> None:
        """Take the lock of ``ident``; before this process acts under that id."""
        ...

    async def alive(self, idents: Collection[str]) -> set[str]:
        """Which of ``idents`` hold their lock. Any id it cannot judge counts as alive."""
        ...

    async def close(self) -> None: ...


class NoLiveness:
    """A database with no lock that dies with a process (SQLite in memory): only TTLs."""

    held = True

    async def hold(self, ident: str) -> None:
        return None

    async def alive(self, idents: Collection[str]) -> set[str]:
        return set(idents)

    async def close(self) -> None:
        return None


# -- SQLite: a file lock per process ----------------------------------------------------

# Paths this process holds, across every FileLiveness in it (a test may run a worker and
# a triggerer in one process). POSIX record locks belong to the process, so trying our own
# file would succeed, and closing that descriptor would drop the lock: never touch them.
_HELD_FILES: dict[str, int] = {}


class FileLiveness:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._path: str | None = None

    @property
    def held(self) -> bool:
        return self._path is not None

    def _file(self, ident: str) -> str:
        return str(self.directory / f"{lock_key(ident):08x}.lock")

    async def hold(self, ident: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._file(ident)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise LockTaken(f"liveness lock {path} is held by another process") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{ident}\n".encode())  # for a person looking at the folder
        _HELD_FILES[path] = fd
        self._path = path

    async def alive(self, idents: Collection[str]) -> set[str]:
        return {ident for ident in idents if not self._dead(self._file(ident))}

    @staticmethod
    def _dead(path: str) -> bool:
        if path in _HELD_FILES:
            return False
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False  # never held one (or already judged): the TTL decides
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False  # held: alive
            raise
        # Ours now: its process is gone. Removed while we hold it, so that the next
        # checker finds no file (and nothing more to act on).
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
        return True

    async def close(self) -> None:
        path, self._path = self._path, None
        if path is not None:
            fd = _HELD_FILES.pop(path, None)
            with contextlib.suppress(OSError):
                os.unlink(path)
            if fd is not None:
                os.close(fd)


# -- PostgreSQL: a session advisory lock ------------------------------------------------


async def close_connection(conn: Any) -> None:
    """Close an asyncpg connection politely, within 5 s, else terminate it: a server that
    went away must not hold a shutdown."""
    if conn.is_closed():
        return
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5.0):
            await conn.close()
    if not conn.is_closed():
        conn.terminate()


class PgLiveness:
    """The advisory lock on a connection of its own, taken again after a reconnect.

    ``connect`` opens a new asyncpg connection; ``statements`` are the backend's
    ``liveness_lock`` / ``liveness_holders`` (schema/postgres/queries.sql).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        run: Callable[[Any, str, dict[str, Any]], Any],
        *,
        grace: float = GRACE,
    ) -> None:
        self._connect = connect
        self._run = run  # (conn, statement name, params) -> rows
        self._grace = grace
        self._conn: Any = None
        self._ident: str | None = None
        self._since = -float("inf")  # monotonic time the lock was last taken *again*
        self._lock = asyncio.Lock()  # one query at a time on the connection
        self._retaking: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def held(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def hold(self, ident: str) -> None:
        self._ident = ident
        await self._take()

    async def _take(self, again: bool = False) -> None:
        assert self._ident is not None
        conn = await self._connect()
        try:
            rows = await self._run(
                conn, "liveness_lock", {"space": LOCK_SPACE, "key": lock_key(self._ident)}
            )
            if not rows[0]["held"]:
                raise LockTaken(
                    f"advisory lock ({LOCK_SPACE}, {lock_key(self._ident)}) of {self._ident} "
                    "is held by another session"
                )
        except BaseException:
            conn.terminate()
            raise
        conn.add_termination_listener(self._lost)
        if again:
            self._since = time.monotonic()
        self._conn = conn

    def _lost(self, conn: Any) -> None:
        if conn is not self._conn or self._closed:
            return
        self._conn = None
        log.warning("liveness connection lost: taking the lock of %s again", self._ident)
        if self._retaking is None or self._retaking.done():
            self._retaking = asyncio.get_running_loop().create_task(self._retake())

    async def _retake(self) -> None:
        # The old session may still hold the lock until the server notices it is gone:
        # until then the try fails and the others still see us alive, which is right.
        while not self._closed and not self.held:
            try:
                await self._take(again=True)
                log.warning("liveness lock of %s held again", self._ident)
            except Exception as exc:
                log.debug("cannot take the liveness lock again yet: %s", exc)
                await asyncio.sleep(RECONNECT_EVERY)

    async def alive(self, idents: Collection[str]) -> set[str]:
        idents = set(idents)
        conn = self._conn
        if not idents or conn is None or time.monotonic() - self._since < self._grace:
            return idents  # our own lock was just taken again: nobody is judged yet
        try:
            async with self._lock, asyncio.timeout(5.0):
                (row,) = await self._run(conn, "liveness_holders", {"space": LOCK_SPACE})
        except Exception:
            if conn.is_closed():
                self._lost(conn)
            return idents
        if conn is not self._conn or row["uptime"] < self._grace:
            return idents  # the server has just started: the others are taking theirs again
        held = set(row["keys"])
        return {ident for ident in idents if lock_key(ident) in held}

    async def close(self) -> None:
        self._closed = True
        if self._retaking is not None:
            self._retaking.cancel()
            with contextlib.suppress(BaseException):
                await self._retaking
        conn, self._conn = self._conn, None
        if conn is not None:
            await close_connection(conn)
