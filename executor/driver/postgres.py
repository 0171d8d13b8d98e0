"""The distributed backend: PostgreSQL through an asyncpg pool.

Workers and triggerers on any number of hosts coordinate only through this database:

* ``write()`` is one READ COMMITTED transaction on a pooled connection. Claims take rows
  with ``FOR UPDATE SKIP LOCKED``; every state change is a compare-and-set re-checked
  under the row lock, so two processes racing for a row change it once.
* ``wait(channel, timeout)`` returns as soon as a NOTIFY arrives on ``channel`` (tasks
  became claimable, a trigger row was inserted; see schema/postgres/001_init.sql), or
  after ``timeout``: idle processes wake at once instead of at their next poll, and
  polling stays as a slow fallback. One extra connection per process LISTENs. NOTIFY
  channels belong to the database, not to a schema: each name is suffixed with a tag of
  the schema (schema/postgres/015_schema_channels.sql), so that installations in two
  schemas of one database do not wake each other.
* ``clock()`` is the server's clock: its offset from this host's monotonic clock is
  measured at open (best of a few round trips) and again every ``CLOCK_RESYNC`` seconds.
  The store stamps every time it writes (shard leases, heartbeats, ready_at) with it, so
  a lease's expiry is judged on the database's timeline by every triggerer, whatever the
  hosts' clocks say (error: half a round trip plus drift between syncs, far below a
  lease's TTL). Queries keep taking ``now`` as a parameter, the same on both backends.
* Migrations (executor/driver/migrate.py) take an advisory lock, so many processes may
  start at once.

URL: ``postgresql://user@host:port/db?search_path=myschema&pool_max_size=5``. Query
parameters other than the few below are sent to the server as settings (asyncpg).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

import schema
from schema import Query

from .db import Row, Tx, check_params
from .liveness import Liveness, PgLiveness, close_connection
from .migrate import migrate
from .opening import migrating, read_only, translating

T = TypeVar("T")

log = logging.getLogger("slotless.store.postgres")


class _PoolFloorFilter(logging.Filter):
    """asyncpg's pool logs a traceback each time it fails to reopen its idle connections
    during an outage; the store's callers already say once that the database is away."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to restore the pool connection floor")


logging.getLogger("asyncpg.pool").addFilter(_PoolFloorFilter())

CLOCK_RESYNC = 60.0  # seconds between two measurements of the server clock
LISTEN_CHECK = 30.0  # seconds between two checks that the LISTEN connection is alive
RECONNECT_EVERY = 2.0  # at most one attempt to re-open the LISTEN connection this often

# Our own URL parameters (taken out before asyncpg sees the URL), with their defaults.
_OPTIONS = {
    "pool_min_size": 1,
    "pool_max_size": 5,
    "statement_cache_size": 100,  # 0 behind PgBouncer in transaction mode
    "listen": 1,  # 0: never LISTEN (poll only; for comparisons and poolers without it)
}


async def _keep_session(conn: asyncpg.Connection) -> None:
    """What a pooled connection needs when it goes back to the pool: nothing more than
    asyncpg's own rollback of a transaction left open. Our statements leave no session
    state (transaction-scoped locks only; LISTEN and the liveness lock have connections of
    their own), and asyncpg's default reset query would cost a round trip per transaction."""


class PostgresTx:
    def __init__(self, conn: asyncpg.Connection, sql: dict[str, Query]) -> None:
        self._conn = conn
        self._sql = sql

    def _bind(self, name: str, /, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
        query = self._sql[name]
        check_params(query, params)
        return query.sql, [params[key] for key in query.params]

    async def fetch(self, name: str, /, **params: Any) -> list[Row]:
        sql, args = self._bind(name, params)
        return await self._conn.fetch(sql, *args)

    async def fetchone(self, name: str, /, **params: Any) -> Row | None:
        sql, args = self._bind(name, params)
        return await self._conn.fetchrow(sql, *args)

    async def execute(self, name: str, /, **params: Any) -> int:
        sql, args = self._bind(name, params)
        status = await self._conn.execute(sql, *args)
        last = status.rsplit(" ", 1)[-1]  # "UPDATE 3", "INSERT 0 1", "DELETE 0"
        return int(last) if last.isdigit() else 0

    async def executemany(self, name: str, rows: Iterable[Mapping[str, Any]]) -> None:
        bound = [self._bind(name, row)[1] for row in rows]
        if bound:
            await self._conn.executemany(self._sql[name].sql, bound)

    async def script(self, sql: str) -> None:
        await self._conn.execute(sql)  # no parameters: the simple protocol runs it whole


def schema_tag(name: str) -> str:
    """The suffix of this schema's NOTIFY channels: ``left(md5(schema), 12)``, as the
    notifying functions of schema/postgres/015_schema_channels.sql compute it (a schema
    name may be 63 bytes long; a channel name may not exceed that either)."""
    return hashlib.md5(name.encode(), usedforsecurity=False).hexdigest()[:12]


class PostgresDatabase:
    backend = "postgresql"

    def __init__(self, url: str, dsn: str, options: dict[str, int]) -> None:
        self.url = url
        self._dsn = dsn
        self._options = options
        self._sql = schema.queries("postgres")
        self._pool: asyncpg.Pool | None = None
        self._offset = 0.0  # server epoch seconds - time.monotonic()
        self._synced_at = -float("inf")
        self._listen_conn: asyncpg.Connection | None = None
        self._listen_lock = asyncio.Lock()
        self._listen_checked = 0.0
        self._listen_failed_at = -float("inf")
        self._channels: dict[str, asyncio.Event] = {}
        self._listened: set[str] = set()  # channels the current LISTEN connection follows
        self._tag = ""  # of the schema: the server's channel is "<channel>_<tag>"
        # Payload subscribers per channel (push sources: triggerer/push.py).
        self._subscribers: dict[str, list[Callable[[str | None], None]]] = {}

    @classmethod
    async def open(cls, url: str) -> PostgresDatabase:
        """Connect (a pool) and migrate; what goes wrong is one :class:`CannotOpen` line."""
        with translating(url, "postgresql"):
            dsn, options = split_url(url)
            db = cls(url, dsn, options)
            db._pool = await asyncpg.create_pool(
                dsn,
                min_size=min(options["pool_min_size"], options["pool_max_size"]),
                max_size=options["pool_max_size"],
                statement_cache_size=options["statement_cache_size"],
                reset=_keep_session,
            )
        try:
            with translating(url, "postgresql"):
                await db._sync_clock(samples=5)
            with migrating(url, "postgresql"):
                await migrate(db, "postgres")
            async with db._pool.acquire() as conn:
                db._tag = schema_tag(await conn.fetchval("SELECT current_schema()"))
        except BaseException:
            await db._pool.close()
            raise
        return db

    async def check_writes(self) -> None:
        """Raise :class:`ReadOnly` on a standby or a read-only database or role."""
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            if await conn.fetchval("SELECT current_setting('transaction_read_only')") == "on":
                raise read_only(self.url, "postgresql", "transaction_read_only is on")

    # -- the server's clock -----------------------------------------------------------------

    def clock(self) -> float:
        """Now, in epoch seconds, on the database server's clock."""
        return time.monotonic() + self._offset

    async def _sync_clock(self, samples: int = 1) -> None:
        assert self._pool is not None
        best: tuple[float, float] | None = None  # (round trip, offset)
        async with self._pool.acquire() as conn:
            for _ in range(samples):
                t0 = time.monotonic()
                server = await conn.fetchval(
                    "SELECT extract(epoch FROM clock_timestamp())::double precision"
                )
                t1 = time.monotonic()
                candidate = (t1 - t0, server - (t0 + t1) / 2)
                if best is None or candidate[0] < best[0]:
                    best = candidate
        assert best is not None
        self._offset = best[1]
        self._synced_at = time.monotonic()

    # -- transactions -----------------------------------------------------------------------

    @asynccontextmanager
    async def write(self) -> AsyncIterator[PostgresTx]:
        assert self._pool is not None
        if time.monotonic() - self._synced_at > CLOCK_RESYNC:
            self._synced_at = time.monotonic()  # one resync at a time, even if it fails
            try:
                await self._sync_clock()
            except Exception:  # the transaction below will say what is wrong, if anything
                log.warning("could not read the database clock; keeping the last offset")
        async with self._pool.acquire() as conn, conn.transaction():
            yield PostgresTx(conn, self._sql)

    async def transact(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """``body(tx)`` in one write transaction (SQLite runs it in one driver call)."""
        async with self.write() as tx:
            return await body(tx)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[PostgresTx]:
        # Autocommit statements, as on SQLite: each sees one consistent snapshot.
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            yield PostgresTx(conn, self._sql)

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[PostgresTx]:
        # READ COMMITTED would take a new snapshot per statement; REPEATABLE READ takes one
        # at the first and keeps it. READ ONLY: it can never fail to serialize, nor write.
        assert self._pool is not None
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            yield PostgresTx(conn, self._sql)

    # -- wake-ups -----------------------------------------------------------------------------

    async def wait(self, channel: str, timeout: float) -> bool:
        """Until a NOTIFY on ``channel`` (True) or ``timeout`` seconds (False).

        A notification that arrived since the last call counts: none is lost between two
        waits. If the LISTEN connection is down, this is a plain sleep (polling).
        """
        event = self._channels.get(channel)
        if event is None:
            event = self._channels[channel] = asyncio.Event()
        if self._options["listen"]:
            await self._listening(channel)
            if self._listen_conn is None:  # down: come back soon to listen again
                timeout = min(timeout, RECONNECT_EVERY)
        if not event.is_set():
            # asyncio.timeout, not wait_for: on 3.11 wait_for may swallow a cancel that races
            # the event, and the worker or triggerer stopping would wait for this forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await event.wait()
        notified = event.is_set()
        event.clear()
        return notified

    async def _listening(self, channel: str) -> None:
        async with self._listen_lock:
            conn = self._listen_conn
            now = time.monotonic()
            if (
                conn is not None
                and not conn.is_closed()
                and now - self._listen_checked > LISTEN_CHECK
            ):
                self._listen_checked = now
                try:  # a silent network failure shows only when we speak
                    async with asyncio.timeout(5.0):
                        await conn.execute("SELECT 1")
                except Exception:
                    self._lost(conn)
                    conn = None
            if conn is None or conn.is_closed():
                if now - self._listen_failed_at < RECONNECT_EVERY:
                    return
                conn = None
                try:
                    conn = await asyncpg.connect(self._dsn)
                    conn.add_termination_listener(self._lost)
                    # A copy: a channel asked for during these awaits is listened to by
                    # its own caller's next look (it is not in _listened).
                    names = list(self._channels)
                    for name in names:
                        await conn.add_listener(self._server_channel(name), self._notified)
                    self._listened = set(names)
                except Exception as exc:
                    if conn is not None:
                        conn.terminate()
                    if self._listen_failed_at == -float("inf"):  # once per outage
                        log.warning("cannot LISTEN (%s); polling until it works again", exc)
                    self._listen_failed_at = now
                    return
                if self._listen_failed_at != -float("inf"):
                    log.warning("LISTEN works again")
                    self._listen_failed_at = -float("inf")
                self._listen_conn = conn
                self._listen_checked = now
                for event in self._channels.values():
                    event.set()  # anything may have happened while nobody listened
            elif channel not in self._listened:
                await conn.add_listener(self._server_channel(channel), self._notified)
                self._listened.add(channel)
                self._channels[channel].set()

    async def subscribe(
        self, channel: str, callback: Callable[[str | None], None]
    ) -> Callable[[], None] | None:
        """Payloads of ``channel``'s notifications, on the process's LISTEN connection."""
        if not self._options["listen"]:
            return None
        if channel not in self._channels:
            self._channels[channel] = asyncio.Event()
        subs = self._subscribers.setdefault(channel, [])
        subs.append(callback)
        await self._listening(channel)
        if self._listen_conn is None:  # cannot LISTEN now: the caller polls, tries later
            subs.remove(callback)
            return None

        def stop() -> None:
            if callback in subs:
                subs.remove(callback)

        return stop

    def _server_channel(self, channel: str) -> str:
        return f"{channel}_{self._tag}"

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        channel = channel.removesuffix(f"_{self._tag}")
        event = self._channels.get(channel)
        if event is not None:
            event.set()
        for callback in list(self._subscribers.get(channel, ())):
            try:
                callback(payload)
            except Exception:  # one subscriber's bug must not stop the others hearing
                log.exception("a subscriber of %s failed", channel)

    def _lost(self, conn: Any) -> None:
        if conn is self._listen_conn:
            self._listen_conn = None
            for event in self._channels.values():
                event.set()  # wake the waiters: they poll once and listen again
            for subs in self._subscribers.values():
                for callback in list(subs):
                    with contextlib.suppress(Exception):
                        callback(None)
        if not conn.is_closed():
            conn.terminate()

    # -- liveness -------------------------------------------------------------------------

    def liveness(self) -> Liveness:
        """A session advisory lock on a connection of its own (see liveness.py)."""
        return PgLiveness(self._connect_liveness, self._run_liveness)

    async def _connect_liveness(self) -> asyncpg.Connection:
        # Keepalives: a host cut off is noticed by the server in about 30 s, not 2 hours,
        # and its lock released then (its leases have expired long before).
        return await asyncpg.connect(
            self._dsn, server_settings={"tcp_keepalives_idle": "10",
                                        "tcp_keepalives_interval": "5",
                                        "tcp_keepalives_count": "3"}
        )  # fmt: skip

    async def _run_liveness(
        self, conn: asyncpg.Connection, name: str, params: dict[str, Any]
    ) -> list[Row]:
        return await PostgresTx(conn, self._sql).fetch(name, **params)

    async def close(self) -> None:
        conn, self._listen_conn = self._listen_conn, None
        if conn is not None:
            await close_connection(conn)
        if self._pool is not None:
            await self._pool.close()


def split_url(url: str) -> tuple[str, dict[str, int]]:
    """Take slotless's own options out of a URL; the rest is asyncpg's DSN."""
    parts = urlsplit(url)
    options = dict(_OPTIONS)
    rest = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in options:
            try:
                options[key] = int(value)
            except ValueError:
                raise ValueError(f"{key} must be an integer in {url!r}") from None
        else:
            rest.append((key, value))
    if options["pool_max_size"] < 1:
        raise ValueError(f"pool_max_size must be at least 1 in {url!r}")
    scheme = "postgresql" if parts.scheme == "postgres" else parts.scheme
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment)), options
