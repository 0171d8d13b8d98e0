"""Airflow's own triggers, unmodified, in the slotless triggerer (real processes).

The triggerer, the worker and ``slotless trigger`` run from ``.venv-airflow``, a separate
virtual environment with apache-airflow-core and apache-airflow-providers-standard at the
versions ``constraints-airflow.txt`` pins, which this module builds once under the checkout
(see benchmarks/airflow_env.py; about a minute with a warm pip cache, and it says so when
it does). The DAGs use the providers' FileTrigger, DateTimeTrigger and
TimeDeltaTrigger and the triggers written the Airflow way in tests/support/airflow_triggers.py.

How checks are counted: the triggerer process gets a ``sitecustomize`` whose audit hook
records each ``glob.glob`` call Airflow's FileTrigger makes on the watched path (its one
check per poke), with the monotonic time, into a file the test reads.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import textwrap
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from support.helpers import sql, stop_process, wait_until

from benchmarks.airflow_env import REPO, airflow_python

# The first test may build .venv-airflow (a minute on a quiet machine, several on a busy one).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STD = "airflow.providers.standard.triggers"
HERE = "support.airflow_triggers"

COUNTER = """
import os, sys, time
_path = os.environ.get("COUNT_GLOB_PATH")
_out = os.environ.get("COUNT_GLOB_OUT")
if _path and _out:
    def _hook(event, args):
        if event == "glob.glob" and args and args[0] == _path:
            fd = os.open(_out, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.write(fd, f"{time.monotonic()}\\n".encode())
            os.close(fd)
    sys.addaudithook(_hook)
"""

FILES_DAG = """
from datetime import UTC, datetime, timedelta

from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

from executor import DAG
from triggers.airflow import AirflowTrigger, from_airflow

INBOX = {inbox!r}
dag = DAG("airflow_files")

# Two sensors on the same file: one wait for the triggerer, checked once per cycle.
landed = AirflowTrigger(
    "{std}.file.FileTrigger", filepath=INBOX + "/data.csv", poke_interval=0.5
)
a = dag.sensor("wait_a", landed, timeout=120)
b = dag.sensor("wait_b", landed, timeout=120)
flag = dag.sensor(
    "wait_flag", AirflowTrigger("{here}.FlagTrigger", path=INBOX + "/flag"), timeout=120
)
delta = dag.sensor(
    "wait_delta", from_airflow(TimeDeltaTrigger(timedelta(seconds=1))), timeout=120
)


@dag.task
def at_moment(ctx):
    moment = datetime.now(UTC) + timedelta(seconds=1)
    ctx.defer(
        AirflowTrigger("{std}.temporal.DateTimeTrigger", moment=moment),
        method="resumed",
        kwargs={{"asked": moment.isoformat()}},
        timeout=60,
    )


@at_moment.method
def resumed(ctx, asked):
    return {{"asked": asked, "event": ctx.event}}


@dag.task(parents=[a, b, flag, delta, at_moment])
def load(ctx):
    return sorted(ctx.inputs)
"""

MOVE_DAG = """
from executor import DAG
from triggers.airflow import AirflowTrigger

dag = DAG("airflow_move")
dag.sensor("wait_flag", AirflowTrigger("{here}.FlagTrigger", path={flag!r}), timeout=120)
"""

FAULTS_DAG = """
from executor import DAG
from triggers.airflow import AirflowTrigger

INBOX = {inbox!r}
dag = DAG("airflow_faults")
H = "{here}"

dag.sensor("silent", AirflowTrigger(H + ".SilentTrigger"), timeout=60)
dag.sensor("raising", AirflowTrigger(H + ".RaisingTrigger", message="bucket gone"), timeout=60)
dag.sensor(
    "errored",
    AirflowTrigger(H + ".ErrorTrigger", message="Could not connect to the endpoint URL"),
    timeout=60,
)
dag.sensor(
    "blocking",
    AirflowTrigger(H + ".BlockingTrigger", seconds=0.6, path=INBOX + "/unblock"),
    timeout=60,
)
dag.sensor("conn", AirflowTrigger(H + ".ConnTrigger", conn_id="warehouse"), timeout=60)
dag.sensor("no_conn", AirflowTrigger(H + ".ConnTrigger", conn_id="nowhere"), timeout=60)
# Allow-listed where the worker defers, not where the triggerer loads: refused there.
dag.sensor("refused", AirflowTrigger(H + ".FlagTrigger", path=INBOX + "/never"), timeout=60)


@dag.task
def unrelated(ctx):
    return "fine"
"""


@pytest.fixture(scope="module")
def python() -> Path:
    return airflow_python()


class Stack:
    """A triggerer and a worker from .venv-airflow on one SQLite file, and `trigger`."""

    def __init__(self, python: Path, tmp: Path) -> None:
        self.python = python
        self.tmp = tmp
        self.db = tmp / "slotless.db"
        self.url = f"sqlite:///{self.db}"
        self.dags = tmp / "dags"
        self.inbox = tmp / "inbox"
        self.hooks = tmp / "hooks"
        for d in (self.dags, self.inbox, self.hooks, tmp / "airflow_home"):
            d.mkdir(exist_ok=True)
        (self.hooks / "sitecustomize.py").write_text(COUNTER)
        self.globs = tmp / "globs.txt"
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        allowed = [f"{HERE}.{n}" for n in ("SilentTrigger", "RaisingTrigger")]
        allowed += [f"{HERE}.{n}" for n in ("BlockingTrigger", "ConnTrigger", "ErrorTrigger")]
        self.base_env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp),
            "AIRFLOW_HOME": str(tmp / "airflow_home"),
            "PYTHONPATH": f"{self.hooks}:{REPO}:{REPO / 'tests'}",
            "SLOTLESS_ALLOWED_TRIGGERS": ",".join(allowed),
        }

    def env(self, role: str) -> dict[str, str]:
        env = dict(self.base_env)
        flag = f"{HERE}.FlagTrigger"
        if role == "triggerer":
            env["SLOTLESS_ALLOWED_TRIGGERS"] += "," + flag
            env["COUNT_GLOB_PATH"] = str(self.inbox / "data.csv")
            env["COUNT_GLOB_OUT"] = str(self.globs)
            env["SLOTLESS_CONN_WAREHOUSE"] = "postgres://alice:s3cret@db.example:6543/dw"
        else:
            env["SLOTLESS_ALLOWED_TRIGGERS"] += "," + flag
        return env

    def start(self, role: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = self.tmp / f"{role}-{len(self.procs)}.log"
        proc = subprocess.Popen(
            [str(self.python), "-m", "slotless", role, "--db", self.url, *args],
            cwd=self.tmp,
            env=env or self.env(role),
            stdout=open(log, "w"),  # noqa: SIM115 - kept by the child
            stderr=subprocess.STDOUT,
        )
        self.procs.append((proc, log))

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in self.procs)

    def trigger(self, dag_id: str) -> str:
        proc = subprocess.run(
            [str(self.python), "-m", "slotless", "trigger", dag_id, "--db", self.url,
             "--dags", str(self.dags), "--json"],
            cwd=self.tmp, env=self.env("worker"), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return str(json.loads(proc.stdout)["run_id"])

    def states(self, run_id: str) -> dict[str, str]:
        rows = sql(self.db, "SELECT task_id, state FROM task WHERE run_id = ?", run_id)
        return {r["task_id"]: r["state"] for r in rows}

    def output(self, run_id: str, task_id: str) -> object:
        [row] = sql(
            self.db, "SELECT output FROM task WHERE run_id = ? AND task_id = ?", run_id, task_id
        )
        return json.loads(row["output"])

    def log_of(self, run_id: str, task_id: str) -> str:
        rows = sql(
            self.db,
            "SELECT e.* FROM task_event e JOIN task t ON t.id = e.task_row"
            " WHERE t.run_id = ? AND t.task_id = ? ORDER BY e.id",
            run_id,
            task_id,
        )
        return "\n".join(str(r) for r in rows)

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                stop_process(proc)


@pytest.fixture
def stack(python: Path, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(python, tmp_path)
    try:
        yield s
    finally:
        s.stop()


def test_airflow_file_date_and_custom_triggers_end_the_dag_success(stack: Stack) -> None:
    (stack.dags / "files.py").write_text(
        textwrap.dedent(FILES_DAG.format(inbox=str(stack.inbox), std=STD, here=HERE))
    )
    stack.start("triggerer", "--lease-ttl", "3")
    stack.start("worker", "--poll-interval", "0.05", "--slots", "4")
    run_id = stack.trigger("airflow_files")

    def deferred() -> bool:
        s = stack.states(run_id)
        return s.get("wait_a") == "DEFERRED" and s.get("wait_b") == "DEFERRED"

    wait_until(deferred, 90, what="both file sensors deferred")

    # One held FileTrigger for both sensors: its checks come one per 0.5 s cycle. Two
    # held copies would check twice per cycle (gaps near zero between them).
    def checks() -> list[float]:
        return [float(x) for x in stack.globs.read_text().split()] if stack.globs.exists() else []

    wait_until(lambda: len(checks()) >= 8, 60, what="eight checks of data.csv")
    times = checks()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.45, (gaps, stack.logs())
    assert len(times) <= (times[-1] - times[0]) / 0.5 + 2

    # The time triggers fire on their own; the file sensors still wait.
    wait_until(lambda: stack.states(run_id).get("at_moment") == "SUCCESS", 60, what="moment")
    wait_until(lambda: stack.states(run_id).get("wait_delta") == "SUCCESS", 60, what="delta")
    assert stack.states(run_id)["wait_a"] == "DEFERRED"

    (stack.inbox / "data.csv").write_text("id,amount\n1,10\n")
    (stack.inbox / "flag").write_text("go")

    def ended() -> str:
        rows = sql(stack.db, "SELECT state FROM dag_run WHERE run_id = ?", run_id)
        return rows[0]["state"] if rows and rows[0]["state"] not in ("RUNNING", "QUEUED") else ""

    assert wait_until(ended, 60, what="the run to end") == "SUCCESS", (
        stack.states(run_id),
        stack.logs(),
    )
    # Airflow's TriggerEvent payloads are kept: True for a file, a datetime as ISO text.
    assert stack.output(run_id, "wait_a") is True and stack.output(run_id, "wait_b") is True
    assert stack.output(run_id, "wait_flag") == {"path": str(stack.inbox / "flag"), "content": "go"}
    resumed = stack.output(run_id, "at_moment")
    assert isinstance(resumed, dict)
    assert resumed["event"][:19] == resumed["asked"][:19]
    assert isinstance(stack.output(run_id, "wait_delta"), str)
    # cleanup() ran when the wait ended, once (one held trigger).
    assert (stack.inbox / "flag.cleanups").read_text().count("\n") == 1
    # After the fire no more checks of data.csv: the held run() was closed.
    n = len(checks())
    wait_until(lambda: stack.states(run_id)["load"] == "SUCCESS", 10, what="load")
    assert len(checks()) <= n + 1


def test_a_held_trigger_is_cleaned_up_when_its_wait_moves_to_another_triggerer(
    stack: Stack,
) -> None:
    flag = stack.inbox / "flag"
    (stack.dags / "move.py").write_text(MOVE_DAG.format(here=HERE, flag=str(flag)))
    stack.start("triggerer", "--lease-ttl", "3")
    stack.start("worker", "--poll-interval", "0.05", "--slots", "4")
    run_id = stack.trigger("airflow_move")
    wait_until(
        lambda: stack.states(run_id).get("wait_flag") == "DEFERRED", 90, what="flag deferred"
    )
    # Running in the first triggerer, then it stops: the trigger's cleanup() runs there.
    # Its run() must have started: a wait counted as held (the heartbeat's `triggers`) may
    # still be importing its class in the import thread, and a trigger never built has
    # nothing to clean up.
    first, _ = stack.procs[0]
    runs = stack.inbox / "flag.runs"

    def started() -> bool:
        return runs.exists() and runs.read_text().split() == [str(first.pid)]

    wait_until(started, 60, what="the trigger's run() started in the first triggerer")
    assert stop_process(first) == 0, stack.logs()
    cleanups = stack.inbox / "flag.cleanups"
    assert cleanups.read_text().split() == [str(first.pid)]

    stack.start("triggerer", "--lease-ttl", "3")
    flag.write_text("moved")
    wait_until(
        lambda: stack.states(run_id).get("wait_flag") == "SUCCESS", 60, what="flag on the second"
    )
    second, _ = stack.procs[-1]
    assert cleanups.read_text().split() == [str(first.pid), str(second.pid)]


def test_a_trigger_that_returns_raises_blocks_or_is_refused_fails_only_its_task(
    stack: Stack,
) -> None:
    (stack.dags / "faults.py").write_text(
        textwrap.dedent(FAULTS_DAG.format(inbox=str(stack.inbox), here=HERE))
    )
    env = stack.env("triggerer")
    env["SLOTLESS_ALLOWED_TRIGGERS"] = stack.base_env["SLOTLESS_ALLOWED_TRIGGERS"]  # no Flag
    stack.start("triggerer", "--lease-ttl", "3", env=env)
    stack.start("worker", "--poll-interval", "0.05", "--slots", "8")
    run_id = stack.trigger("airflow_faults")

    def settled(task_id: str, state: str) -> bool:
        return stack.states(run_id).get(task_id) == state

    for task_id in ("silent", "raising", "errored", "no_conn", "refused"):
        wait_until(partial(settled, task_id, "FAILED"), 60, what=f"{task_id} FAILED")
    assert "run() returned without yielding an event" in stack.log_of(run_id, "silent")
    # The providers' error payload fails the sensor with its message, as their
    # execute_complete() would: it is not an output that ends it SUCCESS.
    errored = stack.log_of(run_id, "errored")
    assert "reported status 'error': Could not connect to the endpoint URL" in errored
    assert "ValueError: bucket gone" in stack.log_of(run_id, "raising")
    no_conn = stack.log_of(run_id, "no_conn")
    assert "nowhere" in no_conn and "SLOTLESS_CONN_<ID>" in no_conn
    assert "not allow-listed" in stack.log_of(run_id, "refused")

    # A slotless connection, read through Airflow's BaseHook.get_connection.
    wait_until(lambda: settled("conn", "SUCCESS"), 60, what="conn SUCCESS")
    assert stack.output(run_id, "conn") == {"host": "db.example", "login": "alice", "port": 6543}
    assert "s3cret" not in stack.log_of(run_id, "conn")

    # The blocking trigger is named in its task's log and keeps waiting; the rest go on.
    blocked = f"by trigger class {HERE}.BlockingTrigger"
    wait_until(lambda: blocked in stack.log_of(run_id, "blocking"), 90, what="the block named")
    wait_until(lambda: settled("unrelated", "SUCCESS"), 60, what="unrelated SUCCESS")
    assert settled("blocking", "DEFERRED")
    (stack.inbox / "unblock").write_text("")
    wait_until(lambda: settled("blocking", "SUCCESS"), 60, what="blocking SUCCESS")
    assert stack.procs[0][0].poll() is None, stack.logs()  # the triggerer kept running
