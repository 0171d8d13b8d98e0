from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.helpers import FakeClock
from support.receivers import http_receiver, smtp_receiver  # noqa: F401  (fixtures)

from executor.store import Store, open_store


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "slotless.db"


@pytest.fixture
def db_url(db_path: Path) -> str:
    return f"sqlite:///{db_path}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(db_url: str):
    """A store on a fresh file, with the real clock."""
    s = await open_store(db_url)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def fake_store(db_url: str, clock: FakeClock):
    """A store on a fresh file whose clock is ``clock`` (moves only when the test says)."""
    s: Store = await open_store(db_url, clock=clock)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def fresh_triggers():
    """The test triggers' switches and records (``support.triggers``) empty around a test."""
    from support.triggers import reset

    reset()
    yield
    reset()
