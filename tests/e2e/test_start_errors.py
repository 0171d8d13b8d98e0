"""A database that cannot be used at a command's start is one line, exit status 2: the real
``slotless`` executable in subprocesses, on a missing PostgreSQL database (its password
never printed), a SQLite path in a missing folder, a read-only database (refused by the
commands that write, still read by ``status``). A database that goes read-only under a
running triggerer is a WARNING per period, never a traceback; ``slotless logs | head``
ends quietly."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from support import pg
from support.helpers import (
    REPO,
    async_wait_until,
    cli,
    cli_env,
    raw_sql,
    skip_unless_ci,
    stop_process,
    write_dag,
)
from support.pg import with_params

from executor.store import open_store

pg_server, pg_url = pg.pg_server, pg.pg_url  # fixtures

pytestmark = pytest.mark.slow

PASSWORD = "hunter2-" + secrets.token_hex(4)

TINY = """
from executor import DAG

dag = DAG("tiny")


@dag.task
def one(ctx):
    for i in range(4000):
        ctx.log(f"line {i:05d} of a long log, long enough to fill a pipe's buffer")
    return 1
"""


def run_together(*commands: list[str], env: dict[str, str] | None = None) -> list[tuple]:
    """Each ``slotless`` command in its own process, all at once (the machine has two
    cores, and each spends most of its time starting); (exit status, stderr) each."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "slotless", *c],
            cwd=REPO,
            env=env or cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in commands
    ]
    out: list[tuple[object, str]] = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a triggerer that retries for ever
            p.kill()
            _, err = p.communicate()
            out.append(("still running after 30 s", err))
            continue
        out.append((p.returncode, err))
    return out


def assert_one_line(result: tuple, *needles: str) -> str:
    code, err = result
    assert code == 2, (code, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_a_missing_postgres_database_is_one_line_without_its_password(pg_server: str) -> None:
    parts = urlsplit(pg_server)
    missing = f"slotless_missing_{secrets.token_hex(4)}"
    netloc = f"{parts.username or 'postgres'}:{PASSWORD}@{parts.hostname}:{parts.port or 5432}"
    url = urlunsplit((parts.scheme, netloc, f"/{missing}", "", ""))
    shown = url.replace(PASSWORD, "***")
    commands = [["status"], ["worker"], ["triggerer"]]
    results = run_together(*[[*c, "--db", url] for c in commands])
    for command, result in zip(commands, results, strict=True):
        line = assert_one_line(result, shown, f'"{missing}" does not exist', "createdb")
        assert PASSWORD not in line, (command, line)


def test_a_sqlite_path_in_a_missing_folder_is_one_line_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "not-made"
    url = f"sqlite:///{folder / 'x.db'}"
    dag = write_dag(tmp_path, TINY)
    a_folder = f"sqlite:///{tmp_path}"  # SQLite cannot open it: its own error, no path
    results = run_together(
        ["worker", "--db", url],
        ["triggerer", "--db", url],
        ["run", str(dag), "--db", url],
        ["worker", "--db", a_folder],
    )
    for result in results[:3]:
        assert_one_line(result, url, f"folder {folder} does not exist")
    assert not folder.exists()
    # Said once, and not followed by the driver's thread failing on a closed event loop.
    assert_one_line(results[3], a_folder, "unable to open database file")


@contextmanager
def read_only_file(path: Path) -> Iterator[None]:
    """Make ``path`` read-only. Root writes through a file's mode, so as root the file is
    made immutable (chattr +i; ext4 and most filesystems) until the block ends."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        skip_unless_ci("read-only file tests", f"chattr +i failed: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


async def new_database(url: str) -> None:
    store = await open_store(url)
    await store.close()


async def test_a_read_only_sqlite_file_is_refused_at_start_by_the_commands_that_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ro.db"
    url = f"sqlite:///{path}"
    await new_database(url)
    with read_only_file(path):
        refused_at_start(url, tmp_path, "writable")


async def test_a_read_only_postgres_database_is_refused_at_start_by_the_commands_that_write(
    tmp_path: Path, pg_url: str
) -> None:
    await new_database(pg_url)
    # As on a standby, or a database set read-only (asyncpg sends URL parameters as settings).
    refused_at_start(with_params(pg_url, default_transaction_read_only="on"), tmp_path, "primary")


def refused_at_start(url: str, tmp_path: Path, fix: str) -> None:
    dag = write_dag(tmp_path, TINY)
    commands = [["triggerer"], ["worker"], ["run", str(dag)], ["status"]]
    results = run_together(*[[*c, "--db", url] for c in commands])
    for result in results[:3]:
        assert_one_line(result, "is read-only", fix)
    assert results[3][0] == 0, results[3]  # reading it still works


def warnings_by_loop(text: str) -> dict[str, list[datetime]]:
    """The time of each "database ..." WARNING line, by the loop that wrote it."""
    found: dict[str, list[datetime]] = {}
    pattern = r"^(\S+ \S+) slotless\.\S+ (.+?): database (?:still )?(?:unavailable|read-only)"
    for m in re.finditer(pattern, text, re.MULTILINE):
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        found.setdefault(m.group(2), []).append(at)
    return found


async def test_a_sqlite_file_gone_read_only_under_a_triggerer_is_a_warning_per_period(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    url = f"sqlite:///{path}"
    await new_database(url)
    frozen: list[Path] = []

    def read_only() -> None:
        if os.geteuid() != 0:
            skip_unless_ci(
                "read-only file tests",
                "an open SQLite file cannot be made read-only for its writer but as root",
            )
        # The writes land in the WAL first: freeze both (not -shm: a shared memory map
        # written to an immutable file is a SIGBUS).
        for p in (path, Path(f"{path}-wal")):
            subprocess.run(["chattr", "+i", str(p)], check=True)
            frozen.append(p)

    def writable() -> None:
        subprocess.run(["chattr", "-i", *map(str, frozen)], check=False)

    try:
        await _read_only_under_a_triggerer(url, tmp_path, read_only, writable)
    finally:
        writable()


async def test_a_postgres_database_gone_read_only_under_a_triggerer_is_a_warning_per_period(
    tmp_path: Path, pg_url: str
) -> None:
    import asyncpg

    # The triggerer connects as a role of its own, which is then made read-only (as a
    # failover to a standby would) and its connections cut: the pool reconnects read-only.
    role = f"slotless_ro_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
    parts = urlsplit(pg_url)
    url = urlunsplit((parts.scheme, f"{role}@{parts.hostname}:{parts.port or 5432}",
                      parts.path, parts.query, ""))  # fmt: skip
    await new_database(pg_url)  # the schema is the test's, not the role's

    async def cut() -> None:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
        )

    async def read_only() -> None:
        await admin.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
        await cut()

    async def writable() -> None:
        await admin.execute(f"ALTER ROLE {role} RESET default_transaction_read_only")
        await cut()

    try:
        await _read_only_under_a_triggerer(url, tmp_path, read_only, writable)
    finally:
        await cut()
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()


async def _read_only_under_a_triggerer(
    url: str, tmp_path: Path, read_only: Callable[[], Any], writable: Callable[[], Any]
) -> None:
    """A triggerer renewing its leases every 0.2 s meets a database gone read-only: one
    WARNING per period (shrunk to 1 s) from each loop, no traceback; then it is back."""
    log = tmp_path / "triggerer.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slotless", "triggerer", "--db", url, "--lease-ttl", "1"],
            cwd=REPO,
            env=cli_env(SLOTLESS_DB_WARN_EVERY="1"),  # a minute in production
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        async def serving() -> bool:  # its heartbeat row: a lease renewed
            rows = await raw_sql(url, "SELECT count(*) AS n FROM triggerer")
            return bool(rows[0]["n"])

        await async_wait_until(serving, timeout=30, what="the triggerer's first lease")
        await _call(read_only)

        def reminded() -> bool:
            times = warnings_by_loop(log.read_text()).get("triggerer: renewing shard leases")
            return times is not None and len(times) >= 3

        await async_wait_until(reminded, timeout=30, what="three warnings of the lease loop")
        await _call(writable)
        await async_wait_until(
            lambda: "database back after" in log.read_text(), timeout=30, what="the way back"
        )
    finally:
        await asyncio.to_thread(stop_process, proc)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    for loop, times in warnings_by_loop(text).items():
        # The lease loop tried every 0.2 s meanwhile: a WARNING per period, not one a try.
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        assert all(g >= 0.95 for g in gaps), (loop, gaps, text[-4000:])


async def _call(f: Callable[[], Any]) -> None:
    done = f()
    if inspect.isawaitable(done):
        await done


async def test_logs_into_a_pipe_closed_early_ends_quietly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    ran = cli("run", str(write_dag(tmp_path, TINY)), "--db", url, "--json")
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "slotless", "logs", run_id, "one", "--db", url],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()  # what `| head -1` reads, before it closes the pipe
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err  # as cat's, killed by SIGPIPE there
    assert b"[attempt 1]" in first
    assert err == ""
