"""The native check for the SFTP provider's ``SFTPTrigger`` (provider 7.0.0).

The provider's ``run()`` opens a new SSH connection per row every ``poke_interval`` and
sends a ``stat`` of its path (a ``readdir`` of it, with a ``file_pattern``). Here every row
waiting on one thing is one group (:mod:`.plans`), and every group waiting in one
(connection, directory) is answered by ONE ``readdir`` per interval over ONE SSH connection
per Airflow connection, kept for the process's life: the groups check on a grid of their
interval and share the listing the first of them started (the link's ``SingleFlight``), or
the one made since the grid point, as :mod:`.native_s3` does. The client is slotless's own
(triggers/sftp.py's ``SFTPLink``), given the very ``asyncssh.connect`` options the
provider's ``SFTPHookAsync`` builds from the connection (resolved in a thread, through the
hook's own ``_parse_extras``).

Same answer as the provider, from the listing:

- ``file_pattern``: the directory ``path``'s entries, as the server sends them (``.``,
  ``..`` and directories included), whose name ``fnmatch``es it; with ``newer_than``, those
  with a modification time and ``newer_than <= mtime`` (mtime as the provider converts it:
  local time, to seconds, then UTC by Airflow's default timezone). Event ``{"status":
  "success", "message": "Sensed N files: [names]"}``;
- a plain ``path``: its name among its directory's entries (a symbolic link is ``stat``-ed,
  as the provider's ``stat`` follows it), ``newer_than`` as above. Event ``{"status":
  "success", "message": "Sensed file: <path>"}``. A directory the server will not list
  (execute-only) is answered by a ``stat`` of the path, the provider's own request.

Different on purpose (the convention of :mod:`.native_s3`): a connection that is not
defined, refused credentials, a host key not accepted, keys that cannot be loaded, or a
path the server refuses fail the task instances through ``submit_failure`` with one line
(the provider polls until its timeout on a missing connection, and yields ``{"status":
"error"}`` for the rest, which its ``execute_complete`` raises); a server that cannot be
reached or a connection lost is retried with backoff and fails nothing (the provider yields
an error event).

What it does not do exactly goes through the adapter (the provider's own ``run()``): a kwarg
not in :data:`KWARGS`, a plain path naming no entry (``/``, ``dir/``, ``..``), a
``newer_than`` the provider cannot parse (:func:`sftp_key`, :func:`newer_than_utc`); and, found
when the client is made, a connection whose extras name a proxy command or anything the
provider's hook does not read (:func:`airflow_connection`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import logging
import posixpath
import stat
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Hashable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from triggers.base import TransientError
from triggers.context import to_thread
from triggers.registry import in_import_thread
from triggers.sftp import SFTPCheckError, SFTPDenied, SFTPLink

from .grid import SAY_EVERY_S, Clients, NotNative, back_off, grid, next_point, one_line

log = logging.getLogger("slotless.airflow")

SFTP = "airflow.providers.sftp.triggers.sftp.SFTPTrigger"
HOOK = "airflow.providers.sftp.hooks.sftp"
TRIGGERS = "airflow.providers.sftp.triggers.sftp"

# What the provider's SFTPTrigger.serialize() writes.
KWARGS = frozenset({"path", "file_pattern", "sftp_conn_id", "newer_than", "poke_interval"})
# Extras SFTPHookAsync reads (all through its own _parse_extras, called here).
HOOK_EXTRAS = frozenset(
    {
        "key_file",
        "known_hosts",
        "passphrase",
        "private_key",
        "private_key_passphrase",
        "host_key",
        "no_host_key_check",
        "ignore_hostkey_verification",
    }
)
# The SSH provider's SSHHook (paramiko) reads these; SFTPHookAsync ignores them, and so
# does this check. ``proxy_command`` is not among them: a connection that asks for a hop
# is served by the adapter, never connected to directly from here.
SSH_HOOK_EXTRAS = frozenset(
    {
        "conn_timeout",
        "cmd_timeout",
        "compress",
        "allow_host_key_change",
        "look_for_keys",
        "disabled_algorithms",
        "ciphers",
    }
)
# What is read of SFTPHookAsync (provider 7.0.0) to build its options.
MIRRORED = (
    "_parse_extras",
    "_should_use_known_hosts",
    "_mod_time_to_utc",
    "get_connection",
    "key_file",
    "known_hosts",
    "passphrase",
    "private_key",
)
# Kept beside the provider's options: a lost connection is noticed and replaced (the
# provider opens one per check, so never keeps a dead one).
CONNECT_TIMEOUT_S = 10.0
KEEPALIVE_S = 30.0

Key = tuple[Any, ...]
Spot = tuple[str, str]  # (sftp_conn_id, directory)


def sftp_key(kwargs: dict[str, Any]) -> Key | None:
    """``("sftp", sftp_conn_id, path, file_pattern, newer_than)`` (``newer_than`` as ISO
    text, or None), or None: the native check would not do exactly what the provider
    does, and the row runs through the adapter."""
    k = kwargs.get
    if not set(kwargs) <= KWARGS:
        return None
    path, pattern = k("path"), k("file_pattern", "") or ""
    conn, newer = k("sftp_conn_id", "sftp_default"), k("newer_than")
    interval = k("poke_interval", 5)
    if not (isinstance(path, str) and path and isinstance(conn, str) and conn):
        return None
    if not isinstance(pattern, str):
        return None
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
        return None
    if not pattern and posixpath.basename(path) in ("", ".", ".."):
        return None  # not an entry of a directory: the provider's stat, through the adapter
    if not newer:
        newer = None  # the provider's `if not self.newer_than`
    elif isinstance(newer, datetime):
        newer = newer.isoformat()  # what dateutil parses back to the same instant
    elif not isinstance(newer, str):
        return None
    return ("sftp", conn, path, pattern, newer)


def directory(key: Key) -> str:
    """The directory whose listing answers ``key``."""
    _, _, path, pattern, _ = key
    if pattern:
        return path.rstrip("/") or "/"
    return posixpath.dirname(path) or "."


class SFTPFailed(Exception):
    """The check cannot succeed as things are (connection, credentials, host key): one line."""


@dataclass
class _Conn:
    """What ``SFTPLink`` reads of a connection, and the provider's own connect options."""

    conn_id: str
    host: str | None
    port: int | None
    login: str | None
    options: dict[str, Any] = field(repr=False)  # a password, a private key
    scheme: str = "sftp"
    password: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def redacted(self) -> str:
        return f"Airflow SFTP connection, {self.login or ''}@{self.host}:{self.port or 22}"


class _AirflowLink(SFTPLink):
    """slotless's SFTP link, connecting with the provider's options."""

    def _options(self) -> dict[str, Any]:
        return dict(self.conn.options)


def airflow_connection(conn_id: str) -> _Conn:
    """What the provider's ``SFTPHookAsync(sftp_conn_id)._get_conn()`` would pass to
    ``asyncssh.connect``, computed by its own ``_parse_extras``. Blocking (Airflow reads the
    connection through the Task SDK, keys are read from files): called in a thread."""
    import asyncssh

    hook = importlib.import_module(HOOK).SFTPHookAsync(sftp_conn_id=conn_id)
    if not all(hasattr(hook, a) for a in MIRRORED):
        raise NotNative("this SFTP provider's SFTPHookAsync is not the one mirrored here")
    try:
        conn = hook.get_connection(conn_id)
    except Exception as exc:
        if type(exc).__name__ == "AirflowNotFoundException":
            raise SFTPFailed(f"SFTP connection {conn_id!r} is not defined") from None
        raise
    extras = set(conn.extra_dejson)
    if "proxy_command" in extras:
        raise NotNative(f"connection {conn_id!r} names a proxy command")
    if unknown := extras - HOOK_EXTRAS - SSH_HOOK_EXTRAS:
        unread = ", ".join(sorted(unknown))
        raise NotNative(f"connection {conn_id!r} has extras its hook does not read: {unread}")
    name = f"SFTP connection {conn_id!r}"
    try:
        hook._parse_extras(conn)  # host_key, no_host_key_check, known_hosts, keys ...
        options: dict[str, Any] = {
            "port": conn.port if conn.port is not None else 22,
            "username": conn.login,
            "password": conn.password,
        }
        # As _get_conn: each only when set, so asyncssh's defaults stay its defaults.
        if hook.key_file:
            options["client_keys"] = hook.key_file
            asyncssh.load_keypairs(hook.key_file, hook.passphrase or None)  # readable?
        if hook.known_hosts:
            if hook.known_hosts.lower() == "none":
                options["known_hosts"] = None
            elif hook._should_use_known_hosts():
                options["known_hosts"] = hook.known_hosts
                if isinstance(hook.known_hosts, str):
                    asyncssh.read_known_hosts(hook.known_hosts)  # readable?
        if hook.private_key:
            options["client_keys"] = [
                asyncssh.import_private_key(hook.private_key, hook.passphrase)
            ]
        if hook.passphrase:
            options["passphrase"] = hook.passphrase
    except (ValueError, OSError, asyncssh.Error) as exc:  # KeyImportError is a ValueError
        raise SFTPFailed(f"{name}: {one_line(exc)}") from None
    options.update(
        connect_timeout=CONNECT_TIMEOUT_S, keepalive_interval=KEEPALIVE_S, keepalive_count_max=3
    )
    return _Conn(conn_id=conn_id, host=conn.host, port=conn.port, login=conn.login, options=options)


def newer_than_utc(path: str, newer_than: Any) -> Any:
    """The provider's own ``newer_than_utc`` (dateutil's parse, Airflow's default timezone
    for a naive time); NotNative if it raises (its ``run()`` yields its own error event)."""
    trigger = importlib.import_module(TRIGGERS).SFTPTrigger(path=path, newer_than=newer_than)
    try:
        return trigger.newer_than_utc
    except Exception as exc:
        raise NotNative(f"newer_than {newer_than!r}: {one_line(exc)}") from None


@dataclass
class SFTPNative:
    """The process's native SFTP checks: their links and the listings they share."""

    # sftp_conn_id -> a _Conn; Airflow's by default, a test's own.
    resolve: Callable[[str], _Conn] | None = None
    listings: int = 0  # readdirs made, for /metrics
    _clients: Clients = field(default_factory=Clients)  # an _AirflowLink per connection
    _waits: Counter[Hashable] = field(default_factory=Counter)  # spot -> groups waiting
    # spot -> the last listing: when it began (monotonic), its entries (None: no directory)
    _last: dict[Hashable, tuple[float, list[Any] | None]] = field(default_factory=dict)
    _said: dict[Hashable, float] = field(default_factory=dict)

    async def wait(
        self,
        key: Key,
        newer: datetime | None,
        interval: Callable[[], float],
        on_check: Callable[[str], None],
    ) -> str:
        """The event's message once what ``key`` waits for is there. NotNative before the
        first check if the connection needs the adapter; SFTPFailed when it cannot succeed."""
        spot: Spot = (key[1], directory(key))
        self._waits[spot] += 1
        failures = 0
        due = grid(interval(), time.monotonic())
        try:
            while True:
                every = interval()
                try:
                    link = await self._link(key[1])
                    message = await self._match(link, key, spot, newer, due)
                except TransientError as exc:
                    failures += 1
                    on_check(f"retrying: {exc}")
                    due = await back_off(every, failures)
                    continue
                except SFTPCheckError as exc:
                    raise SFTPFailed(str(exc)) from None
                failures = 0
                on_check("found" if message else "no match yet")
                if message:
                    return message
                due = await next_point(every)
        finally:
            self._waits[spot] -= 1
            if self._waits[spot] <= 0:
                for kept in (self._waits, self._last, self._said):
                    kept.pop(spot, None)

    async def close(self) -> None:
        await self._clients.close()

    async def _link(self, conn_id: str) -> Any:
        return await self._clients.get(conn_id, partial(self._open, conn_id))

    async def _open(self, conn_id: str) -> Any:
        resolve = self.resolve
        if resolve is None:
            await in_import_thread(HOOK, partial(importlib.import_module, HOOK))
            resolve = airflow_connection
        await in_import_thread("asyncssh", partial(importlib.import_module, "asyncssh"))
        try:
            conn = await to_thread(resolve, conn_id)
        except (NotNative, SFTPFailed):
            raise
        except Exception as exc:  # the connection could not be read now (its database)
            raise TransientError(f"reading SFTP connection {conn_id!r}: {one_line(exc)}") from None
        try:
            link = _AirflowLink(conn)
        except SFTPCheckError as exc:  # no host
            raise SFTPFailed(str(exc)) from None
        return link

    async def _match(
        self, link: Any, key: Key, spot: Spot, newer: datetime | None, since: float
    ) -> str | None:
        """The provider's message if what ``key`` waits for is in the listing."""
        _, _, path, pattern, _ = key
        if pattern:
            entries = await self._listing(link, spot, since)
            if entries is None:
                return None  # the provider's FileNotFoundError: not yet
            matched = [e for e in entries if fnmatch.fnmatch(str(e.filename), pattern)]
            if newer is not None:  # a name without a modification time is skipped, as there
                matched = [e for e in matched if _newer(newer, e.attrs.mtime)]
            names = [str(e.filename) for e in matched]
            return f"Sensed {len(names)} files: {names}" if names else None
        try:
            attrs = await self._attrs(link, spot, path, since)
        except SFTPDenied:
            attrs = await link.stat(path)  # a directory it may not list: the provider's stat
        if attrs is None:
            return None  # the provider's "No files matching": not yet
        if attrs.mtime is None:
            # The provider's run() fails on it too (its mod-time conversion raises).
            raise SFTPFailed(f"{path!r} via SFTP connection {key[1]!r} has no modification time")
        if newer is not None and not _newer(newer, attrs.mtime):
            return None
        return f"Sensed file: {path}"

    async def _attrs(self, link: Any, spot: Spot, path: str, since: float) -> Any:
        entries = await self._listing(link, spot, since)
        name = posixpath.basename(path)
        entry = next((e for e in entries or () if str(e.filename) == name), None)
        if entry is None:
            return None
        perms = entry.attrs.permissions
        if perms is None or stat.S_ISLNK(perms) or entry.attrs.mtime is None:
            return await link.stat(path)  # what the provider's stat says of it
        return entry.attrs

    async def _listing(self, link: Any, spot: Spot, since: float) -> list[Any] | None:
        """``spot``'s entries from a listing begun at ``since`` or later: the one already
        made this interval, the one in flight, or a new one."""
        last = self._last.get(spot)
        if last is not None and last[0] >= since:
            return last[1]
        return await link.flights.run(
            ("readdir", spot[1]), partial(self._list, link, spot), fresh_after=since
        )

    async def _list(self, link: Any, spot: Spot) -> list[Any] | None:
        began = time.monotonic()
        self.listings += 1
        try:
            entries = await link.readdir(spot[1])
        except TransientError as exc:
            if time.monotonic() - self._said.get(spot, -SAY_EVERY_S) >= SAY_EVERY_S:
                self._said[spot] = time.monotonic()
                log.warning("listing sftp://%s%s failed (%s); retrying", *spot, exc)
            raise
        last = self._last.get(spot)
        if self._waits[spot] > 0 and (last is None or last[0] <= began):
            self._last[spot] = (began, entries)
        return entries


def _newer(newer: datetime, mtime: int | None) -> bool:
    """The provider's comparison: its own conversion of the modification time."""
    if mtime is None:
        return False
    return bool(newer <= importlib.import_module(HOOK).SFTPHookAsync._mod_time_to_utc(mtime))


async def sftp_events(
    sftp: SFTPNative,
    key: Key,
    kwargs: dict[str, Any],
    interval: Callable[[], float],
    on_check: Callable[[str], None],
    adapted: Callable[[], AsyncGenerator[Any, None]],
) -> AsyncGenerator[Any, None]:
    """The provider's success event once ``key``'s file is there; the provider's own
    ``run()`` (through ``adapted``) when the native check would not do exactly as it."""
    from airflow.triggers.base import TriggerEvent

    try:
        newer = None
        if key[4] is not None:
            await in_import_thread(TRIGGERS, partial(importlib.import_module, TRIGGERS))
            newer = await to_thread(newer_than_utc, key[2], kwargs.get("newer_than"))
        message = await sftp.wait(key, newer, interval, on_check)
    except NotNative as exc:
        log.info("SFTPTrigger %r runs through the adapter: %s", key[1:], exc)
    else:
        yield TriggerEvent({"status": "success", "message": message})
        return
    async with contextlib.aclosing(adapted()) as events:
        async for event in events:
            yield event
