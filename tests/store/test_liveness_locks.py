"""The liveness lock on both backends, with real processes: held while the process lives,
seen released the moment it is SIGKILLed, never taken from a live one."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import backends, pg
from support.helpers import REPO, async_wait_until, cli_env

from executor.driver.liveness import LockTaken, lock_key
from executor.store import open_database

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
pg_url = pg.pg_url  # fixture

HOLDER = """
import asyncio, sys
from executor.store import open_database

async def main():
    db = await open_database(sys.argv[1])
    await db.liveness().hold(sys.argv[2])
    print("held", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


HOLDER_PID = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted "
    "AND objid = $1::bigint::oid"
)


def holder(db_url: str, ident: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), db_url, ident],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == "held\n", f"the holder did not take its lock: {line!r}"
    return proc


async def test_a_lock_is_held_while_its_process_lives_and_released_when_it_is_killed(
    url: str, tmp_path: Path
) -> None:
    db = await open_database(url)
    me = db.liveness()
    await me.hold("observer")
    proc = holder(url, "victim")
    try:
        assert await me.alive({"victim", "observer"}) == {"victim", "observer"}
        # Nobody takes a live process's lock, not even under its id.
        with pytest.raises(LockTaken):
            await db.liveness().hold("victim")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

        async def released() -> bool:
            return await me.alive({"victim", "observer"}) == {"observer"}

        await async_wait_until(released, timeout=30, what="the killed process's lock released")
        if url.startswith("sqlite"):
            # No lock file: never held one (or judged already): the TTL decides, not this.
            # (On PostgreSQL a listed id holds its lock before its row is written.)
            assert await me.alive({"never-started"}) == {"never-started"}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        await me.close()
        await db.close()


async def test_a_dropped_postgres_session_takes_its_lock_again(pg_url: str) -> None:
    """(SQLite's lock is the kernel's: there is no session to drop.)"""
    import asyncpg

    url = pg_url

    db = await open_database(url)
    me, other = db.liveness(), db.liveness()
    await me.hold("dropped")
    await other.hold("judge")
    admin = await asyncpg.connect(url)
    try:
        first = await admin.fetchval(HOLDER_PID, lock_key("dropped"))
        # The server ends our liveness session (as a network cut or a restart would).
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", first)

        async def taken_again() -> bool:
            now = await admin.fetchval(HOLDER_PID, lock_key("dropped"))
            return now is not None and now != first and me.held

        await async_wait_until(taken_again, timeout=30, what="the lock taken again")

        async def seen_alive() -> bool:
            return await other.alive({"dropped"}) == {"dropped"}

        await async_wait_until(seen_alive, timeout=30, what="the judge to see it alive")
    finally:
        await admin.close()
        await me.close()
        await other.close()
        await db.close()


async def test_nobody_is_judged_while_the_judge_has_just_reconnected(pg_url: str) -> None:
    """After a server restart every lock is gone at once: a judge that has just taken its
    own lock back waits out a grace period before it reads anyone's as released.
    (PostgreSQL only: a file lock does not go away with a server.)"""
    import asyncpg

    db = await open_database(pg_url)
    judge = db.liveness()
    admin = await asyncpg.connect(pg_url)
    try:
        await judge.hold("judge")
        # "ghost" holds nothing: a steady judge reads it as dead at once ...
        assert await judge.alive({"ghost"}) == set()
        first = await admin.fetchval(HOLDER_PID, lock_key("judge"))
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", first)

        async def taken_again() -> bool:
            now = await admin.fetchval(HOLDER_PID, lock_key("judge"))
            return now is not None and now != first and judge.held

        await async_wait_until(taken_again, timeout=30, what="the judge's lock taken again")
        # ... but not when it has just taken its own lock again, as after a restart.
        assert await judge.alive({"ghost"}) == {"ghost"}
    finally:
        await admin.close()
        await judge.close()
        await db.close()
