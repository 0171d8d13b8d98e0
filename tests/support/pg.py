"""PostgreSQL for tests: find a server, or start a throwaway one, and give each test a schema.

``SLOTLESS_TEST_PG_DSN`` names the server (default: the one on 127.0.0.1:5432, database
``test``). Where nothing answers there, a throwaway cluster is started from the installed
PostgreSQL binaries (``initdb``/``pg_ctl``) for the session. Where that fails too, the tests
skip with the reason, except under ``CI=true``, where they fail: CI must run them.

Each test gets its own schema (``search_path`` in the URL, which asyncpg sends as a server
setting), dropped afterwards, so tests never see each other's rows.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from support.helpers import free_port, skip_unless_ci

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def configured_dsn() -> str:
    return os.environ.get("SLOTLESS_TEST_PG_DSN") or DEFAULT_DSN


def unavailable(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail under CI=true where PostgreSQL tests must run."""
    skip_unless_ci("PostgreSQL tests", reason)


async def _probe(dsn: str) -> str | None:
    """None if ``dsn`` answers, else why not."""
    try:
        import asyncpg
    except ImportError:
        return "asyncpg is not installed (pip install 'slotless[postgres]')"
    try:
        conn = await asyncpg.connect(dsn, timeout=3)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()
    return None


def probe(dsn: str) -> str | None:
    return asyncio.run(_probe(dsn))


def _binaries() -> tuple[str, str] | None:
    candidates = [os.environ.get("PATH", "")]
    candidates += [str(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)]
    path = os.pathsep.join(candidates)
    initdb, pg_ctl = shutil.which("initdb", path=path), shutil.which("pg_ctl", path=path)
    return (initdb, pg_ctl) if initdb and pg_ctl else None


@contextmanager
def throwaway_cluster() -> Iterator[str]:
    """A PostgreSQL cluster in a temporary directory; yields its DSN. Raises if it cannot."""
    found = _binaries()
    if found is None:
        raise RuntimeError("no initdb/pg_ctl on PATH or under /usr/lib/postgresql")
    initdb, pg_ctl = found
    prefix: list[str] = []
    directory = Path(tempfile.mkdtemp(prefix="slotless-pg-"))
    if os.geteuid() == 0:  # initdb refuses root: run the cluster as the postgres user
        runuser = shutil.which("runuser")
        if runuser is None:
            raise RuntimeError("running as root and no runuser to start PostgreSQL as postgres")
        shutil.chown(directory, "postgres")
        prefix = [runuser, "-u", "postgres", "--"]
    data, port = directory / "data", free_port()

    def run(args: list[str]) -> None:
        subprocess.run(args, check=True, capture_output=True, timeout=120)

    try:
        run([*prefix, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"])
        options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(
            [
                *prefix,
                pg_ctl,
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(directory / "log"),
                "-w",
                "start",
            ]
        )
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as exc:
        stderr = getattr(exc, "stderr", b"") or b""
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError(f"cannot start a throwaway cluster: {exc} {stderr.decode()}") from exc
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(directory, ignore_errors=True)


def with_params(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), *params.items()]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


async def create_schema(dsn: str) -> str:
    import asyncpg

    name = f"t_{secrets.token_hex(6)}"
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {name}")
    finally:
        await conn.close()
    return name


async def drop_schema(dsn: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    finally:
        await conn.close()


# ------------------------------------------------------------------------------ fixtures
# Imported by the test modules that need PostgreSQL (``from support.pg import pg_server``).


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The DSN of a PostgreSQL server for this session (configured, or a throwaway one)."""
    dsn = configured_dsn()
    why = probe(dsn)
    if why is None:
        yield dsn
        return
    cluster = throwaway_cluster()
    try:
        local = cluster.__enter__()
    except RuntimeError as exc:
        unavailable(f"no PostgreSQL answers at {dsn} ({why}), and {exc}")
    try:
        yield local
    finally:
        cluster.__exit__(None, None, None)


@pytest.fixture
async def pg_url(pg_server: str) -> AsyncIterator[str]:
    """A database URL whose ``search_path`` is a fresh schema, dropped after the test."""
    name = await create_schema(pg_server)
    try:
        yield with_params(pg_server, search_path=name)
    finally:
        await drop_schema(pg_server, name)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on each backend in turn: a SQLite file, or a PostgreSQL schema of
    its own (``pg_url``, dropped after). It overrides conftest's SQLite-only ``db_url`` in
    the modules that take it, with the fixtures it needs:
    ``pg_server, pg_url, db_url = pg.pg_server, pg.pg_url, pg.db_url``."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    return str(request.getfixturevalue("pg_url"))


# ------------------------------------------------------------- a database of one's own
# For a whole other system's metadata database (Airflow's), which wants a database, not a
# schema, and migrates it itself.


@contextmanager
def private_database(prefix: str) -> Iterator[tuple[str, str]]:
    """A new database on the configured server, dropped (FORCE) after: its URL as asyncpg
    takes it, and as SQLAlchemy with psycopg (Airflow) does. Skips, or fails under CI,
    where no server answers."""
    reason = probe(configured_dsn())
    if reason is not None:
        unavailable(reason)
    name = f"{prefix}_{secrets.token_hex(4)}"
    asyncio.run(_server_execute(f'CREATE DATABASE "{name}"'))
    try:
        parts = urlsplit(configured_dsn())
        ours = urlunsplit(parts._replace(path=f"/{name}", query=""))
        yield ours, ours.replace("postgresql://", "postgresql+psycopg://", 1)
    finally:
        asyncio.run(_server_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _server_execute(statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(configured_dsn())
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def fetch(url: str, query: str, *args: Any) -> list[Any]:
    """The rows of one query, on a connection of its own."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()
