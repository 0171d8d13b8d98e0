"""The SFTP provider's ``SFTPTrigger`` checked natively by ``slotless airflow-triggerer``,
against a real Airflow 3.3 metadata database and OpenSSH's sshd.

Task instances are deferred through Airflow's own ORM as its worker and execution API defer
them (tests/support/airflow_deferred.py), each with the trigger ``SFTPSensor(deferrable=True)``
makes, serialized by the provider itself. Their SFTP connection is a row of Airflow's
connection table (key file, known_hosts: the host key is checked); sshd's sftp-server logs
every ``opendir`` it serves, which the test counts.

Shown: 36 task instances on 12 paths in three directories, plus a pattern and two
``newer_than`` waits, are 15 checks answered by one listing per directory per interval over
ONE SSH connection (sshd's count equals the process's own on /metrics); nothing fires before
the files land; each task instance then leaves DEFERRED with the provider's exact payload. A
refused login and a connection that is not defined fail their task instances alone, in one
line; a connection naming a proxy command runs the provider's own ``run()``; the process
stays up and serves the rest.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.airflow_deployment import slotless_metrics
from support.airflow_home import AirflowHome
from support.helpers import free_port, stop_process, wait_until
from support.pg import fetch
from support.servers import OpenSSHServer, SSHKeys, sshd_available

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SFTP = "airflow.providers.sftp.triggers.sftp.SFTPTrigger"
DIRS = ("in0", "in1", "in2")
FILES = [f"{d}/f{i}.csv" for d in DIRS for i in range(4)]
# Three task instances per file, at three poke_intervals: one check, at the shortest.
INTERVALS = (0.5, 1.0, 5.0)
WAITS = {f"f{n}_{k}": (rel, s) for n, rel in enumerate(FILES) for k, s in enumerate(INTERVALS)}
SINCE = "2025-01-01T00:00:00+00:00"
OLD = 1_600_000_000.0  # 2020: an mtime older than SINCE
FIRST = [*WAITS, "pattern", "fresh", "touched"]
CHECKS = len(FILES) + 3
SECOND = ["refused", "undefined", "hop", "fine"]

DAG = f"""
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("sftpwaits", schedule=None, start_date=datetime(2026, 1, 1)):
    for name in {[*FIRST, *SECOND]!r}:
        EmptyOperator(task_id=name)
"""

STATES = "SELECT task_id, state FROM task_instance WHERE dag_id = 'sftpwaits' AND run_id = $1"


class Airflow(AirflowHome):
    def deferred(self, run_id: str) -> set[str]:
        """The task instances still DEFERRED: one query, not a Python with Airflow."""
        rows = asyncio.run(fetch(self.pg_url, STATES, run_id))
        return {r["task_id"] for r in rows if r["state"] == "deferred"}


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenSSHServer]:
    if not sshd_available():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but /usr/sbin/sshd is missing: .ci/run installs it")
        pytest.skip("OpenSSH's sshd is not installed (apt-get install openssh-server)")
    keys = SSHKeys(tmp_path_factory.mktemp("keys"))
    root = tmp_path_factory.mktemp("sftp-root")
    server = OpenSSHServer(root, keys, tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Airflow]:
    with Airflow.migrated(tmp_path_factory, "slotless_airflow_sftp", {"w.py": DAG}) as af:
        yield af


def _conn(sshd: OpenSSHServer, key: Path | None = None, **extra: str) -> str:
    """An Airflow connection URI: the key file and known_hosts as extras."""
    extras = {
        "key_file": str(key or sshd.keys.client_key),
        "known_hosts": str(sshd.keys.known_hosts(sshd.port)),
        **extra,
    }
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in extras.items())
    return f"sftp://{sshd.user}@127.0.0.1:{sshd.port}/?{query}"


def _trigger(
    task_id: str, path: str, interval: float = 0.5, conn: str = "files", **more: Any
) -> dict[str, Any]:
    # What SFTPSensor(deferrable=True).execute() builds, serialized by the provider.
    args = {"path": path, "sftp_conn_id": conn, "poke_interval": interval, **more}
    return {"task_id": task_id, "classpath": SFTP, "args": args}


def _touch(sshd: OpenSSHServer, rel: str, mtime: float | None = None) -> None:
    p = sshd.local(rel)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("x")
    if mtime is not None:
        os.utime(p, (mtime, mtime))


def _start(airflow: Airflow, log: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    return airflow.start_triggerer(log, "--metrics-port", str(port)), port


def _events(airflow: Airflow, run_id: str) -> dict[str, Any]:
    return airflow.helper("states", {"dag_id": "sftpwaits", "run_id": run_id})


def test_sftp_waits_are_one_listing_per_directory_per_interval(
    airflow: Airflow, sshd: OpenSSHServer, tmp_path: Path
) -> None:
    for d in DIRS:
        sshd.local(d).mkdir()
    _touch(sshd, "in0/unrelated.txt")
    _touch(sshd, "fresh/old.csv", OLD)  # matches the pattern, but older than SINCE
    _touch(sshd, "stale/report.txt", OLD)
    tasks = [_trigger(name, sshd.path(rel), s) for name, (rel, s) in WAITS.items()]
    tasks += [
        _trigger("pattern", sshd.path("in1"), file_pattern="*.ready"),
        _trigger("fresh", sshd.path("fresh"), file_pattern="*.csv", newer_than=SINCE),
        _trigger("touched", sshd.path("stale/report.txt"), newer_than=SINCE),
    ]
    spec = {
        "dag_id": "sftpwaits",
        "run_id": "r1",
        "tasks": tasks,
        "connections": {"files": _conn(sshd)},
    }
    assert set(airflow.helper("defer", spec)) == set(FIRST)
    sshd.reset()
    proc, port = _start(airflow, tmp_path / "triggerer.log")

    def metrics() -> dict[str, float]:
        assert proc.poll() is None, (tmp_path / "triggerer.log").read_text()[-3000:]
        return slotless_metrics(port)

    try:
        wait_until(
            lambda: metrics().get('slotless_airflow_checks{kind="sftp"}') == CHECKS,
            timeout=60,
            what=f"{len(FIRST)} rows held as {CHECKS} native SFTP checks",
        )
        m = metrics()
        assert m["slotless_airflow_triggers"] == len(FIRST)
        assert m['slotless_airflow_checks{kind="adapter"}'] == 0

        # Five directories (three, "fresh", "stale"), all checked every 0.5 s: each of
        # sshd's opendirs answers the checks waiting in its directory, 15 checks per five.
        checks = 'slotless_airflow_native_checks_total{kind="sftp"}'
        listings = "slotless_airflow_sftp_listings_total"
        first, opened, made = m[checks], sshd.readdirs, m[listings]
        wait_until(
            lambda: sshd.readdirs >= opened + 5 * 4,
            timeout=30,
            interval=0.05,
            what="four more rounds of listings",
        )
        listed = sshd.readdirs - opened
        m = metrics()
        rounds, checked = listed / 5, m[checks] - first
        assert CHECKS * (rounds - 2) <= checked <= CHECKS * (rounds + 2), (listed, checked)
        # The process counts the listings sshd served (read moments apart: a round off).
        assert listed - 5 <= m[listings] - made <= listed + 10, (listed, m[listings] - made)
        assert sshd.connections == 1  # one SSH connection, for every check
        assert airflow.deferred("r1") == set(FIRST)  # nothing is there yet

        for rel in FILES:
            _touch(sshd, rel)
        _touch(sshd, "in1/x.ready")
        _touch(sshd, "fresh/new.csv")
        os.utime(sshd.local("stale/report.txt"), (time.time(), time.time()))
        wait_until(
            lambda: not airflow.deferred("r1"),
            timeout=60,
            interval=0.3,
            what="every task instance to resume",
        )
        states = _events(airflow, "r1")
        expected = {name: f"Sensed file: {sshd.path(rel)}" for name, (rel, _) in WAITS.items()}
        expected["pattern"] = "Sensed 1 files: ['x.ready']"
        expected["fresh"] = "Sensed 1 files: ['new.csv']"  # old.csv is older than SINCE
        expected["touched"] = f"Sensed file: {sshd.path('stale/report.txt')}"
        for name, message in expected.items():
            s = states[name]
            assert s["state"] == "scheduled" and s["trigger_id"] is None, (name, s)
            event = {"status": "success", "message": message}
            assert s["next_kwargs"] == {"asked": name, "event": event}, (name, s)
        assert metrics()['slotless_airflow_submitted_total{outcome="event"}'] == len(FIRST)
        assert sshd.connections == 1
    finally:
        code = stop_process(proc)
    assert code == 0, (tmp_path / "triggerer.log").read_text()[-3000:]


def test_a_refused_login_or_an_undefined_connection_fails_alone_in_one_line(
    airflow: Airflow, sshd: OpenSSHServer, tmp_path: Path
) -> None:
    sshd.local("out").mkdir()
    tasks = [
        _trigger("refused", sshd.path("out/a.csv"), conn="stranger"),
        _trigger("undefined", sshd.path("out/a.csv"), conn="nowhere"),
        _trigger("hop", sshd.path("out/a.csv"), conn="hop"),
        _trigger("fine", sshd.path("out/b.csv"), conn="files2"),
    ]
    spec = {
        "dag_id": "sftpwaits",
        "run_id": "r2",
        "tasks": tasks,
        "connections": {
            "files2": _conn(sshd),
            "stranger": _conn(sshd, sshd.keys.other_client_key()),
            "hop": _conn(sshd, proxy_command="nc %h %p"),
        },
    }
    assert set(airflow.helper("defer", spec)) == set(SECOND)
    log = tmp_path / "triggerer.log"
    proc, port = _start(airflow, log)
    try:
        wait_until(
            lambda: airflow.deferred("r2") == {"hop", "fine"},
            timeout=60,
            interval=0.3,
            what="the refused login and the undefined connection to fail",
        )
        states = _events(airflow, "r2")
        said = {}
        for name in ("refused", "undefined"):
            s = states[name]
            assert s["next_method"] == "__fail__", (name, s)
            lines = s["next_kwargs"]["traceback"]
            assert len(lines) == 1 and lines[0].count("\n") == 1, lines  # one line
            said[name] = lines[0]
        assert "SSH server refused the credentials of connection 'stranger'" in said["refused"]
        assert "SFTP connection 'nowhere' is not defined" in said["undefined"]
        wait_until(
            lambda: "connection 'hop' names a proxy command" in log.read_text(),
            timeout=30,
            what="the proxy command's connection to go to the adapter",
        )
        assert proc.poll() is None  # the process stays up
        _touch(sshd, "out/a.csv")
        _touch(sshd, "out/b.csv")
        wait_until(
            lambda: not airflow.deferred("r2"),
            timeout=30,
            interval=0.3,
            what="the other two to resume",
        )
        states = _events(airflow, "r2")
        for name, rel in (("hop", "out/a.csv"), ("fine", "out/b.csv")):
            event = {"status": "success", "message": f"Sensed file: {sshd.path(rel)}"}
            assert states[name]["next_kwargs"] == {"asked": name, "event": event}, states[name]
        m = slotless_metrics(port)
        assert m['slotless_airflow_submitted_total{outcome="failure"}'] == 2
        assert m['slotless_airflow_submitted_total{outcome="event"}'] == 2
    finally:
        code = stop_process(proc)
    assert code == 0, log.read_text()[-3000:]
