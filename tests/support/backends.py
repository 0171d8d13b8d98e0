"""Fixtures for the store layer's tests: each runs on SQLite and on PostgreSQL.

A test module takes them with ``backend, url, store = backends.backend, backends.url,
backends.store`` (and ``pg_server`` with them: the PostgreSQL fixture they use; and
``live_store`` where a triggerer runs against the store on the real clock)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from executor.store import Store, open_store
from support import pg
from support.helpers import FakeClock
from support.pg import create_schema, drop_schema, with_params

pg_server = pg.pg_server  # fixture


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A server-level URL: a SQLite file, or the PostgreSQL server (found or started once)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_server"))


@pytest.fixture
async def url(backend: str) -> AsyncIterator[str]:
    """A fresh database: the SQLite file, or a PostgreSQL schema of its own, dropped after."""
    if backend.startswith("sqlite"):
        yield backend
        return
    name = await create_schema(backend)
    try:
        yield with_params(backend, search_path=name)
    finally:
        await drop_schema(backend, name)


@pytest.fixture
async def store(url: str, clock: FakeClock) -> AsyncIterator[Store]:
    """A store on ``url`` whose clock is ``clock`` (moves only when the test says)."""
    s = await open_store(url, clock=clock)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def live_store(url: str) -> AsyncIterator[Store]:
    """A store on ``url`` with the real clock (a triggerer runs against it)."""
    s = await open_store(url)
    try:
        yield s
    finally:
        await s.close()
