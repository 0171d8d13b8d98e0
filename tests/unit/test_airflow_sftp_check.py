"""The native SFTPTrigger check (triggerer/airflow/native_sftp.py) against asyncssh's real
SFTP server on 127.0.0.1, without Airflow: the connection is given as the provider's hook
would resolve it; everything from the SSH connection on is the code the airflow-triggerer
runs.

What is shown: the provider's answers and messages from a listing (a plain path, a file or a
directory, a link followed; a ``file_pattern`` over every entry the server lists, ``.`` and
``..`` too), many waits in two directories answered by one listing per directory per
interval over one SSH connection, and refused credentials failing in one line.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.helpers import async_wait_until
from support.servers import AsyncSFTPServer, SSHKeys

from triggerer.airflow.native_sftp import SFTP, SFTPFailed, SFTPNative, _Conn
from triggerer.airflow.plans import plan


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[AsyncSFTPServer]:
    root = tmp_path / "root"
    root.mkdir()
    srv = await AsyncSFTPServer(root, SSHKeys(tmp_path / "keys")).start()
    try:
        yield srv
    finally:
        await srv.stop()


def _native(srv: AsyncSFTPServer) -> SFTPNative:
    def resolve(conn_id: str) -> _Conn:
        # What airflow_connection gives for a key file and a known_hosts file.
        key = srv.keys.client_key if conn_id == "files" else srv.keys.other_client_key()
        options = {
            "port": srv.port,
            "username": srv.user,
            "password": None,
            "client_keys": str(key),
            "known_hosts": str(srv.keys.known_hosts(srv.port)),
            "connect_timeout": 5.0,
        }
        return _Conn(conn_id, "127.0.0.1", srv.port, srv.user, options)

    return SFTPNative(resolve=resolve)


def _key(path: str, pattern: str = "", conn: str = "files") -> tuple[Any, ...]:
    p = plan(SFTP, {"path": path, "file_pattern": pattern, "sftp_conn_id": conn})
    assert p.kind == "sftp"
    return p.key


async def _first(native: SFTPNative, key: tuple[Any, ...]) -> str | None:
    """The message of ``key``'s first check, or None if it found nothing."""
    said: list[str] = []
    task = asyncio.create_task(native.wait(key, None, lambda: 60.0, said.append))
    try:
        await async_wait_until(lambda: said or task.done(), timeout=10, what="a check")
        return task.result() if task.done() else None
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_providers_answers_from_a_listing(server: AsyncSFTPServer) -> None:
    for rel in ("in/a.csv", "in/b.csv", "in/sub/deep.csv", "in/x.ready"):
        server.local(rel).parent.mkdir(parents=True, exist_ok=True)
        server.local(rel).write_text("x")
    server.local("in/link.csv").symlink_to("a.csv")
    server.local("in/dead.csv").symlink_to("gone.csv")
    native = _native(server)
    try:
        cases: list[tuple[tuple[Any, ...], str | None]] = [
            (_key("/in/a.csv"), "Sensed file: /in/a.csv"),
            (_key("/in/sub"), "Sensed file: /in/sub"),  # a directory is a path too
            (_key("/in/a"), None),
            # A link is what its target is, as the provider's stat follows it.
            (_key("/in/link.csv"), "Sensed file: /in/link.csv"),
            (_key("/in/dead.csv"), None),
            (_key("/in/missing/a.csv"), None),  # no such directory: not yet
            (_key("/in", "*.ready"), "Sensed 1 files: ['x.ready']"),
            (_key("/in/", "*.txt"), None),
            (_key("/nowhere", "*"), None),
        ]
        for key, message in cases:
            assert await _first(native, key) == message, key
        # fnmatch over the server's entries as listed, "." and ".." included.
        got = await _first(native, _key("/in", "*"))
        assert got is not None and got.startswith("Sensed 8 files: ")
        names = ast.literal_eval(got.split(": ", 1)[1])
        assert set(names) == {".", "..", "a.csv", "b.csv", "sub", "x.ready", "link.csv", "dead.csv"}
    finally:
        await native.close()


async def test_waits_in_a_directory_share_one_listing_per_interval(
    server: AsyncSFTPServer,
) -> None:
    for d in ("a", "b"):
        server.local(d).mkdir()
    keys = [_key(f"/{d}/f{i}.csv") for d in ("a", "b") for i in range(10)]
    keys.append(_key("/a", "*.ready"))
    native = _native(server)
    checks: list[str] = []
    waits = [asyncio.create_task(native.wait(k, None, lambda: 0.2, checks.append)) for k in keys]
    try:
        await async_wait_until(lambda: len(checks) >= 5 * len(keys), timeout=15, what="checks")
        rounds = len(checks) / len(keys)
        # Two directories a round: one listing each, however many wait in it.
        assert 2 * (rounds - 1) <= server.readdirs <= 2 * (rounds + 1), (rounds, server.readdirs)
        assert native.listings == server.readdirs
        assert server.connections == 1
        assert not any(w.done() for w in waits)
        for i in range(10):
            server.local(f"a/f{i}.csv").write_text("x")
        server.local("a/go.ready").write_text("x")
        done, _ = await asyncio.wait(waits[:10] + waits[-1:], timeout=10)
        assert len(done) == 11
        assert waits[-1].result() == "Sensed 1 files: ['go.ready']"
        assert not any(w.done() for w in waits[10:-1])
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        await native.close()


async def test_refused_credentials_fail_in_one_line(server: AsyncSFTPServer) -> None:
    native = _native(server)
    try:
        with pytest.raises(SFTPFailed) as failed:
            await native.wait(_key("/a.csv", conn="stranger"), None, lambda: 0.2, lambda _: None)
        said = str(failed.value)
        assert "\n" not in said
        assert said.startswith("SSH server refused the credentials of connection 'stranger'")
    finally:
        await native.close()
