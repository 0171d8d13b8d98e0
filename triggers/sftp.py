"""SFTPFileTrigger: a file (or glob) exists on an SFTP server (batched per directory).

Checked with asyncssh over one SSH connection per connection id, shared by every trigger
that names it and kept for the triggerer's lifetime. All the waiting paths in one
directory are answered by one directory listing per cycle, not a ``stat`` each (and never
a new SSH connection per check: that manages about 13 checks/s against OpenSSH).

The connection (``SLOTLESS_CONN_<ID>``) is a URI such as
``sftp://user@files.example.com:2222?key_file=/keys/id_ed25519&known_hosts=/keys/known_hosts``
or ``sftp://user:password@host``. Extras: ``key_file`` (comma-separated for several),
``passphrase``, ``known_hosts`` (a file, or ``none`` to skip host-key checks: tests only),
``connect_timeout`` (s, default 10), ``keepalive_interval`` (s, default 30).

A lost connection is dropped and the check retried (the triggerer backs off and logs it
in each waiting task's log); the next check reconnects. Credentials or a host key the
server refuses fail the waiting tasks with a clear message instead.
"""

from __future__ import annotations

import asyncio
import posixpath
import stat
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import field_validator, model_validator

from .base import BaseTrigger, TransientError, TriggerEvent
from .context import TriggerContext, to_thread
from .listing import SingleFlight, check_glob, compile_glob, has_magic, on_grid

MAX_PAYLOAD_PATHS = 1000


class SFTPCheckError(RuntimeError):
    """A check that cannot succeed as things are (credentials or host key refused...)."""


class SFTPDenied(SFTPCheckError):
    """The server refused to list or read a path (its permissions)."""


class SFTPFileTrigger(BaseTrigger):
    """Fires when ``path`` exists on the server named by ``conn_id``.

    ``path`` is a file path (absolute, or relative to the login directory) or a glob in
    its last component (``/inbox/*.csv``; ``*`` does not cross ``/``). ``newer_than``
    waits for a file modified after that moment (naive datetimes are UTC). The event's
    payload is ``{"paths": [matching paths, sorted], "count": n}``.
    """

    path: str
    newer_than: datetime | None = None
    conn_id: str = "sftp_default"

    @field_validator("path")
    @classmethod
    def _valid_path(cls, value: str) -> str:
        if not value or value.endswith("/"):
            raise ValueError(f"path {value!r} must name a file (or a glob of files)")
        directory, name = posixpath.split(value)
        if has_magic(directory):
            raise ValueError(
                f"path {value!r}: wildcards are allowed in the file name only, not in "
                f"the directory {directory!r}"
            )
        check_glob(name)  # ValueError names what is malformed
        return value

    @model_validator(mode="after")
    def _aware(self) -> SFTPFileTrigger:
        if self.newer_than is not None and self.newer_than.tzinfo is None:
            object.__setattr__(self, "newer_than", self.newer_than.replace(tzinfo=UTC))
        return self

    def next_check_at(self, now: float, interval: float) -> float:
        return on_grid(now, interval)  # checks of one cycle fall due together: one request

    def describe(self) -> str:
        sep = "" if self.path.startswith("/") else "/~/"
        return f"sftp://{self.conn_id}{sep}{self.path}"

    @property
    def directory(self) -> str:
        return posixpath.dirname(self.path) or "."

    def match(self, entries: dict[str, tuple[int, int]] | None) -> TriggerEvent | None:
        """Answer from a listing of the directory: name -> (size, mtime); None if absent."""
        if not entries:
            return None
        name = posixpath.basename(self.path)
        if has_magic(name):
            rx = compile_glob(name)
            names = [n for n in entries if rx.match(n)]
        else:
            names = [name] if name in entries else []
        if self.newer_than is not None:
            after = self.newer_than.timestamp()
            names = [n for n in names if entries[n][1] > after]
        if not names:
            return None
        names.sort()
        directory = posixpath.dirname(self.path)
        paths = [posixpath.join(directory, n) for n in names[:MAX_PAYLOAD_PATHS]]
        return TriggerEvent(payload={"paths": paths, "count": len(names)})

    @classmethod
    async def poke_many(
        cls, triggers: Sequence[BaseTrigger], ctx: TriggerContext
    ) -> Sequence[TriggerEvent | BaseException | None]:
        groups: dict[tuple[str, str], list[SFTPFileTrigger]] = defaultdict(list)
        for t in triggers:
            assert isinstance(t, SFTPFileTrigger)
            groups[(t.conn_id, t.directory)].append(t)
        results: dict[int, TriggerEvent | BaseException | None] = {}

        async def one(conn_id: str, directory: str, group: list[SFTPFileTrigger]) -> None:
            try:
                entries = await list_directory(ctx, conn_id, directory)
            except Exception as exc:  # each directory fails alone; UnknownConnection too
                for t in group:
                    results[id(t)] = exc
                return
            for t in group:
                results[id(t)] = t.match(entries)

        await asyncio.gather(*(one(c, d, g) for (c, d), g in groups.items()))
        return [results[id(t)] for t in triggers]


async def list_directory(
    ctx: TriggerContext, conn_id: str, directory: str
) -> dict[str, tuple[int, int]] | None:
    """``{name: (size, mtime)}`` of the files in ``directory``, or None if it is missing."""
    link = await sftp_link(ctx, conn_id)
    return await link.flights.run(directory, lambda: link.listdir(directory))


async def sftp_link(ctx: TriggerContext, conn_id: str) -> SFTPLink:
    """The shared link for ``conn_id`` (one SSH connection, reconnected when lost)."""
    conn = ctx.connection(conn_id)  # UnknownConnection: fails the waiting tasks

    async def factory() -> SFTPLink:
        return SFTPLink(conn)

    return await ctx.shared(f"sftp:{conn_id}", factory)


class SFTPLink:
    """One SSH connection and SFTP session for a connection id; reconnects after a loss."""

    def __init__(self, conn: Any) -> None:
        if conn.scheme not in ("sftp", "ssh"):
            raise SFTPCheckError(
                f"connection {conn.conn_id!r} is {conn.redacted()}: an SFTP connection "
                "must be an sftp:// URI"
            )
        if not conn.host:
            raise SFTPCheckError(f"connection {conn.conn_id!r} names no host")
        self.conn = conn
        self.flights = SingleFlight()
        self.connects = 0  # how many SSH connections were opened (tests, benchmark)
        self._lock = asyncio.Lock()
        self._ssh: Any = None
        self._sftp: Any = None

    def _where(self) -> str:
        return f"connection {self.conn.conn_id!r} ({self.conn.redacted()})"

    async def session(self) -> Any:
        """The SFTP client, connecting first if there is no live connection."""
        ssh, sftp = self._ssh, self._sftp
        if sftp is not None and not ssh.is_closed():
            return sftp
        async with self._lock:
            if self._sftp is not None and self._ssh.is_closed():
                self._reset(self._sftp)
            if self._sftp is None:
                self._ssh, self._sftp = await self._connect()
            return self._sftp

    def _options(self) -> dict[str, Any]:
        """``asyncssh.connect``'s options for this connection (all but the host), from its
        URI's extras. SFTPCheckError for keys or a known_hosts file it cannot load."""
        import asyncssh

        conn, extra = self.conn, self.conn.extra
        options: dict[str, Any] = {
            "port": conn.port or 22,
            "connect_timeout": float(extra.get("connect_timeout", 10)),
            "keepalive_interval": float(extra.get("keepalive_interval", 30)),
            "keepalive_count_max": 3,
        }
        if conn.login:
            options["username"] = conn.login
        if conn.password is not None:
            options["password"] = conn.password
        try:
            if extra.get("key_file"):
                options["client_keys"] = [
                    asyncssh.read_private_key(path.strip(), extra.get("passphrase"))
                    for path in extra["key_file"].split(",")
                ]
                options["agent_path"] = None
            elif conn.password is not None:
                options["client_keys"] = None if "use_default_keys" in extra else []
                options["agent_path"] = None
            known = extra.get("known_hosts")
            if known is not None:
                options["known_hosts"] = (
                    None if known.lower() == "none" else asyncssh.read_known_hosts(known)
                )
        except (OSError, asyncssh.KeyImportError, ValueError) as exc:
            # A missing or unreadable key file is a configuration error, not a blip.
            raise SFTPCheckError(f"cannot load the keys of {self._where()}: {exc}") from exc
        return options

    async def _connect(self) -> tuple[Any, Any]:
        import asyncssh

        # Key and known_hosts files are read in a thread: a (re)connect must not stop the
        # loop on a slow disk or a network mount.
        options = await to_thread(self._options)
        try:
            ssh = await asyncssh.connect(self.conn.host, **options)
        except asyncssh.PermissionDenied as exc:
            raise SFTPCheckError(
                f"SSH server refused the credentials of {self._where()}: {exc.reason}"
            ) from exc
        except asyncssh.HostKeyNotVerifiable as exc:
            raise SFTPCheckError(
                f"SSH host key of {self._where()} not accepted: {exc.reason}"
            ) from exc
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            raise TransientError(f"cannot connect over SSH via {self._where()}: {exc}") from exc
        self.connects += 1
        try:
            sftp = await ssh.start_sftp_client()
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            ssh.close()
            raise TransientError(f"SFTP session refused via {self._where()}: {exc}") from exc
        return ssh, sftp

    def _reset(self, sftp: Any) -> None:
        """Forget a connection that failed (only if it is still the current one)."""
        if self._sftp is sftp:
            ssh = self._ssh
            self._ssh = self._sftp = None
            if ssh is not None:
                ssh.close()

    async def listdir(self, directory: str) -> dict[str, tuple[int, int]] | None:
        entries = await self.readdir(directory)
        if entries is None:
            return None
        out: dict[str, tuple[int, int]] = {}
        for n in entries:
            name = n.filename if isinstance(n.filename, str) else n.filename.decode()
            if name in (".", "..") or _is_dir(n.attrs):
                continue
            out[name] = (n.attrs.size or 0, n.attrs.mtime or 0)
        return out

    async def readdir(self, directory: str) -> list[Any] | None:
        """The server's entries of ``directory`` as it sends them (``asyncssh.SFTPName``,
        ``.`` and ``..`` included, in its order), or None if it is missing."""
        sftp = await self.session()
        try:
            return list(await sftp.readdir(directory))
        except Exception as exc:
            self._failed(sftp, exc, f"listing {directory!r}")
            return None

    async def stat(self, path: str) -> Any:
        """``path``'s attributes, its link followed (``asyncssh.SFTPAttrs``), or None if it
        is missing."""
        sftp = await self.session()
        try:
            return await sftp.stat(path)
        except Exception as exc:
            self._failed(sftp, exc, f"reading {path!r}")
            return None

    def _failed(self, sftp: Any, exc: Exception, doing: str) -> None:
        """Return for a missing path (not there yet); raise what any other failure means."""
        import asyncssh

        if isinstance(exc, asyncssh.SFTPNoSuchFile):
            return
        if isinstance(exc, asyncssh.SFTPPermissionDenied):
            denied = f"permission denied {doing} via {self._where()}: {exc.reason}"
            raise SFTPDenied(denied) from exc
        if isinstance(exc, (asyncssh.SFTPConnectionLost, asyncssh.SFTPNoConnection)):
            self._reset(sftp)
            raise TransientError(f"SFTP connection lost via {self._where()}: {exc}") from exc
        if isinstance(exc, asyncssh.SFTPError):
            raise SFTPCheckError(f"failed {doing} via {self._where()}: {exc}") from exc
        if isinstance(exc, (asyncssh.Error, OSError, TimeoutError)):
            self._reset(sftp)
            raise TransientError(f"SSH connection lost via {self._where()}: {exc}") from exc
        raise exc

    async def close(self) -> None:
        ssh = self._ssh
        self._ssh = self._sftp = None
        if ssh is not None:
            ssh.close()
            await ssh.wait_closed()


def _is_dir(attrs: Any) -> bool:
    import asyncssh

    if attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY:
        return True
    return attrs.permissions is not None and stat.S_ISDIR(attrs.permissions)
