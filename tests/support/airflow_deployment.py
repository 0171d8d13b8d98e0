"""A whole Airflow 3 deployment on a private PostgreSQL database, as processes.

Airflow's own ``api-server``, ``scheduler`` (LocalExecutor) and ``dag-processor`` run from
``.venv-airflow`` (benchmarks/airflow_env.py), each in its own process group so that what
it forks (the executor's workers, the parser's children, uvicorn) is killed with it. A
triggerer is started by the test: ``slotless airflow-triggerer`` or ``airflow triggerer``.

Everything is configured through ``AIRFLOW__*`` variables (no airflow.cfg is written),
with the loops tuned down so a DAG run takes seconds, not minutes:

- the scheduler loops every second and sleeps at most 0.2 s when idle;
- the dag-processor looks at its folder every 5 s;
- ``[triggerer] job_heartbeat_sec`` 1 s and ``triggerer_health_check_threshold``
  :data:`HEALTH_THRESHOLD` s (Airflow's default is 30 s): a SIGKILLed triggerer's rows are
  taken by another after that, so a take-over test does not wait half a minute;
- one api-server worker, on a free port, which the executor's workers reach for the
  Execution API; a fixed JWT secret, the same in every process (each would make its own).

Task instance and DAG run states are read from Airflow's database directly (asyncpg), one
query per poll, not through a Python that imports Airflow.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from support.helpers import free_port, wait_until
from support.pg import fetch

HEALTH_THRESHOLD = 5  # seconds: [triggerer] triggerer_health_check_threshold


class AirflowDeployment:
    def __init__(
        self, python: Path, home: Path, url: str, pg_url: str, connections: dict[str, Any]
    ) -> None:
        self.python = python
        self.bin = python.parent
        self.home = home
        self.pg_url = pg_url  # the same database, as asyncpg takes it
        self.logs = home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.api_port = free_port()
        self.env: dict[str, str] = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "HOME": str(home),
            "AIRFLOW_HOME": str(home / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": (
                f"http://127.0.0.1:{self.api_port}/execution/"
            ),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url,
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(HEALTH_THRESHOLD),
            # Each component would otherwise serve its logs on the same fixed ports.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        }
        for conn_id, conn in connections.items():
            self.env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
        self.procs: list[subprocess.Popen[bytes]] = []
        self._scheduler_read = 0
        self._taken: set[tuple[str, str, str]] = set()

    # processes
    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """``args`` in its own process group, output to logs/NAME.log."""
        with open(self.logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(
                list(args),
                env=self.env,
                cwd=self.home,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def airflow(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        return self.spawn(name, str(self.bin / "airflow"), *args)

    def slotless(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        return self.spawn(name, str(self.bin / "slotless"), "airflow-triggerer", *args)

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, env=self.env, cwd=self.home, capture_output=True, text=True, timeout=timeout
        )

    def start(self) -> None:
        """Migrate the database, then start the api-server, scheduler and dag-processor and
        wait until the api-server answers."""
        migrated = self.run(str(self.bin / "airflow"), "db", "migrate", timeout=300)
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        self.components = {
            "api-server": self.airflow(
                "api-server", "api-server", "--port", str(self.api_port), "--workers", "1"
            ),
            "scheduler": self.airflow("scheduler", "scheduler", "--skip-serve-logs"),
            "dag-processor": self.airflow("dag-processor", "dag-processor"),
        }
        wait_until(self._api_up, timeout=180, interval=0.5, what="Airflow's api-server to answer")

    def _api_up(self) -> bool:
        from urllib.error import URLError
        from urllib.request import urlopen

        self.assert_components_up()
        try:
            with urlopen(f"http://127.0.0.1:{self.api_port}/api/v2/version", timeout=5):
                return True
        except (URLError, OSError):
            return False

    def assert_components_up(self) -> None:
        for name, proc in self.components.items():
            assert proc.poll() is None, f"airflow {name} exited:\n{self.log(name)}"

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """``sig`` to the process's group; SIGKILL to the group if it is not gone in time.
        The leader's exit status (negative: the signal that ended it)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        # Whatever the group forked and the leader did not reap goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if code is None:
            code = proc.wait(10)
            raise AssertionError(f"process {proc.args!r} ignored signal {sig} for {timeout:g} s")
        return code

    def close(self, timeout: float = 20) -> None:
        """Every process group started here: SIGTERM to all at once (each takes seconds to
        shut down), then SIGKILL to whatever is left after ``timeout``."""
        left = [p for p in self.procs if p.poll() is None or _group_alive(p.pid)]
        for proc in left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in left:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def executor_events_seen(self, dag_id: str, run_id: str) -> set[str]:
        """The run's tasks whose executor event the scheduler has taken (its "Received
        executor event" line): for a task that deferred, the event of the worker that
        exited on ``defer()``. The scheduler takes the whole buffer and handles each event
        in that same call, milliseconds later: it logs "TaskInstance Finished", or, when
        the task instance's row is locked at that moment (its query skips locked rows),
        drops the event without a word, so "Finished" alone cannot be waited for.

        Airflow 3.3.2's scheduler fails a task instance whose trigger fired and whose resumed
        attempt is already RUNNING when that stale event is handled ("state mismatch",
        apache/airflow#72716; 3.3.2 guards only SCHEDULED and QUEUED). A loaded machine
        delays the event by seconds, so a test lands what a sensor waits for only after
        this, as a deployment whose sources change later than that never sees the race.
        """
        path = self.logs / "scheduler.log"
        with open(path, "rb") as f:
            f.seek(self._scheduler_read)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # whole lines only; the rest is read next time
        self._scheduler_read += end
        for m in _TAKEN.finditer(chunk[:end].decode(errors="replace")):
            self._taken.add((m["dag"], m["run"], m["task"]))
        return {task for dag, run, task in self._taken if (dag, run) == (dag_id, run_id)}

    # the database
    def query(self, query: str, *args: Any) -> list[Any]:
        return asyncio.run(fetch(self.pg_url, query, *args))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        rows = self.query(
            "SELECT task_id, state FROM task_instance WHERE dag_id = $1 AND run_id = $2",
            dag_id,
            run_id,
        )
        return {r["task_id"]: r["state"] for r in rows}

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query(
            "SELECT state FROM dag_run WHERE dag_id = $1 AND run_id = $2", dag_id, run_id
        )
        return rows[0]["state"] if rows else None

    def live_triggerer_jobs(self) -> int:
        """TriggererJobs running with a heartbeat within the health threshold, as Airflow
        counts a triggerer alive (a SIGKILLed one stays 'running', its heartbeat old)."""
        rows = self.query(
            "SELECT count(*) AS n FROM job WHERE job_type = 'TriggererJob'"
            " AND state = 'running' AND latest_heartbeat > now() - make_interval(secs => $1)",
            float(HEALTH_THRESHOLD),
        )
        return int(rows[0]["n"])

    def deferred_rows(self) -> int:
        """Trigger rows that DEFERRED task instances wait on."""
        rows = self.query(
            "SELECT count(DISTINCT trigger_id) AS n FROM task_instance"
            " WHERE state = 'deferred' AND trigger_id IS NOT NULL"
        )
        return int(rows[0]["n"])

    def holders(self, dag_id: str, run_id: str) -> dict[int, tuple[int | None, str | None]]:
        """Each trigger row the run's task instances wait on: the triggerer Job holding it
        (``trigger.triggerer_id``) and that Job's state."""
        rows = self.query(
            "SELECT t.id, t.triggerer_id, j.state FROM trigger t"
            " JOIN task_instance ti ON ti.trigger_id = t.id"
            " LEFT JOIN job j ON j.id = t.triggerer_id"
            " WHERE ti.dag_id = $1 AND ti.run_id = $2",
            dag_id,
            run_id,
        )
        return {r["id"]: (r["triggerer_id"], r["state"]) for r in rows}

    def dag_ready(self, dag_id: str) -> bool:
        """Parsed by the dag-processor and unpaused: the scheduler will run it."""
        self.assert_components_up()
        rows = self.query("SELECT is_paused FROM dag WHERE dag_id = $1 AND NOT is_stale", dag_id)
        return bool(rows) and not rows[0]["is_paused"]

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any]) -> None:
        done = self.run(
            str(self.bin / "airflow"),
            "dags",
            "trigger",
            dag_id,
            "--run-id",
            run_id,
            "--conf",
            json.dumps(conf),
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


_TAKEN = re.compile(
    r"Received executor event with state \S+ for task instance "
    r"TaskInstanceKey\(dag_id='(?P<dag>[^']+)', task_id='(?P<task>[^']+)', run_id='(?P<run>[^']+)'"
)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def slotless_metrics(port: int) -> dict[str, float]:
    """A ``slotless airflow-triggerer``'s slotless_airflow_* samples on its metrics port;
    none while it is still starting (importing Airflow, checking its database) and not
    listening yet."""
    from urllib.error import URLError
    from urllib.request import urlopen

    try:
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (URLError, OSError):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("slotless_airflow_"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
