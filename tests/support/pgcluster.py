"""A private PostgreSQL cluster a test may stop, restart and read the log of.

Tests that stop or restart the server (database restarts, the chaos benchmark, reading the
server log for deadlocks) must never touch the machine's shared server: they start their own
cluster with ``initdb`` + ``pg_ctl`` (as the ``postgres`` user when running as root, since
initdb refuses root), on a free port, in a temporary directory removed at the end.

    with PgCluster.started() as cluster:
        dsn = cluster.dsn            # postgresql://postgres@127.0.0.1:<port>/postgres
        cluster.restart()            # a real server restart (fast shutdown)
        cluster.stop(); cluster.start()
        assert "deadlock detected" not in cluster.log_text()

The ``pg_cluster`` fixture gives one per test (skipped with the reason when no PostgreSQL
binaries are installed, failed instead under ``CI=true``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.helpers import free_port
from support.pg import _binaries, unavailable


class PgCluster:
    """One private PostgreSQL cluster: ``initdb`` once, then start/stop/restart at will."""

    def __init__(self, *, settings: dict[str, str] | None = None) -> None:
        found = _binaries()
        if found is None:
            raise RuntimeError("no initdb/pg_ctl on PATH or under /usr/lib/postgresql")
        self._initdb, self._pg_ctl = found
        self.directory = Path(tempfile.mkdtemp(prefix="slotless-pgc-"))
        self._prefix: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root: run the cluster as the postgres user
            runuser = shutil.which("runuser")
            if runuser is None:
                raise RuntimeError("running as root and no runuser to start PostgreSQL")
            shutil.chown(self.directory, "postgres")
            self._prefix = [runuser, "-u", "postgres", "--"]
        self.data = self.directory / "data"
        self.log = self.directory / "log"
        self.port = free_port()
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "fsync": "off",
            "max_connections": "200",
            **(settings or {}),
        }
        self._initialised = False

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, args: list[str], timeout: float = 120) -> None:
        try:
            subprocess.run([*self._prefix, *args], check=True, capture_output=True, timeout=timeout)
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(
                f"{' '.join(args[:1])} failed: {exc.stderr.decode(errors='replace')}"
                f"\n{self.log_text()[-2000:]}"
            ) from exc

    def _options(self) -> str:
        flags = " ".join(f"-c {k}={v}" for k, v in self.settings.items())
        return f"-p {self.port} -k {self.directory} {flags}"

    def start(self) -> None:
        """Start the server (initdb on the first call); returns once it accepts connections."""
        if not self._initialised:
            self._run([self._initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres"])
            self._initialised = True
        self._run(
            [
                *(self._pg_ctl, "-D", str(self.data), "-o", self._options()),
                *("-l", str(self.log), "-w", "-t", "60", "start"),
            ]
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (disconnects clients, clean), or ``immediate``."""
        self._run([self._pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def log_text(self) -> str:
        """The server's log so far (errors such as ``deadlock detected`` land here)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def destroy(self) -> None:
        subprocess.run(
            [*self._prefix, self._pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.directory, ignore_errors=True)

    @classmethod
    @contextmanager
    def started(cls, *, settings: dict[str, str] | None = None) -> Iterator[PgCluster]:
        cluster = cls(settings=settings)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.destroy()


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    """A private cluster for one test, torn down after it."""
    try:
        cluster = PgCluster()
    except RuntimeError as exc:
        unavailable(str(exc))
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.destroy()
        unavailable(f"cannot start a private PostgreSQL cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.destroy()
