"""A real Airflow 3.3 deployment whose deferred tasks ``slotless airflow-triggerer`` serves.

Airflow's own api-server, scheduler (LocalExecutor) and dag-processor run on a private
PostgreSQL database (tests/support/airflow_deployment.py), one deployment for the module.
One DAG has three deferrable sensors: a ``FileSensor``, an ``S3KeySensor`` against a moto
server and a ``TimeDeltaSensor``. Each test triggers a run of it and waits, on states read
from Airflow's database, until all three are DEFERRED, then lands the file and the S3 key
and waits until the run succeeds:

- with no ``airflow triggerer`` and one ``slotless airflow-triggerer``;
- rolled back: slotless stopped while the three wait, ``airflow triggerer`` started;
- two slotless instances, the one holding the three SIGKILLed: the other takes them over
  once Airflow's health threshold (set to a few seconds here) has passed.

"All three DEFERRED" also waits until the scheduler has taken the executor events of
the workers that exited on ``defer()``: Airflow 3.3.2's scheduler fails a resumed task if
it handles that event late (apache/airflow#72716; see
``AirflowDeployment.executor_events_seen``), which a loaded machine made happen here.

The time sensor's moment is the run's ``conf["delay"]`` seconds after the sensor starts on
its worker (not after the run is made: how long scheduling takes varies most with the
machine's load): long enough for the scheduler to handle its worker's exit and for the
test to stop or kill the triggerer while it waits, so its row too is served by the
triggerer that finishes the run.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.airflow_deployment import HEALTH_THRESHOLD, AirflowDeployment, slotless_metrics
from support.helpers import free_port, wait_until
from support.pg import private_database
from support.servers import MotoS3Server

from benchmarks.airflow_env import airflow_python

# The first test may build .venv-airflow (minutes on a busy machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

DAG_ID = "three_waits"
BUCKET = "landing"
SENSORS = ["file", "s3", "delta"]

DAG = """
from datetime import datetime

from airflow.providers.amazon.aws.sensors.s3 import S3KeySensor
from airflow.providers.standard.sensors.filesystem import FileSensor
from airflow.providers.standard.sensors.time_delta import TimeDeltaSensor
from airflow.sdk import DAG

# Native rendering: the delta template below renders to a timedelta, not its text.
with DAG(
    "three_waits",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    render_template_as_native_obj=True,
):
    FileSensor(
        task_id="file",
        filepath="{inbox}/{{{{ run_id }}}}.csv",
        fs_conn_id="local_fs",
        deferrable=True,
        poke_interval=0.5,
    )
    S3KeySensor(
        task_id="s3",
        bucket_name="{bucket}",
        bucket_key="{{{{ run_id }}}}/done",
        aws_conn_id="moto",
        deferrable=True,
        poke_interval=0.5,
    )
    TimeDeltaSensor(
        task_id="delta",
        # The run's conf["delay"] seconds from when the sensor starts on its worker: its
        # base time is run_after, so the time the run took to get here is added.
        delta=(
            "{{{{ macros.datetime.now(dag_run.run_after.tzinfo) - dag_run.run_after"
            " + macros.timedelta(seconds=dag_run.conf['delay']) }}}}"
        ),
        deferrable=True,
    )
"""


class Setup:
    def __init__(self, dep: AirflowDeployment, s3: Any, inbox: Path) -> None:
        self.dep = dep
        self.s3 = s3  # a boto3 client on the moto server
        self.inbox = inbox


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    python = airflow_python()
    import boto3

    moto = MotoS3Server().start()
    s3 = boto3.client(
        "s3",
        endpoint_url=moto.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=BUCKET)
    home = tmp_path_factory.mktemp("airflow-deployment")
    inbox = home / "inbox"
    inbox.mkdir()
    (home / "dags").mkdir()
    (home / "dags" / "three_waits.py").write_text(DAG.format(inbox=inbox, bucket=BUCKET))
    connections = {
        "local_fs": {"conn_type": "fs", "extra": {"path": "/"}},
        "moto": {
            "conn_type": "aws",
            "login": "testing",
            "password": "testing",
            "extra": {
                "endpoint_url": moto.endpoint,
                "region_name": "us-east-1",
                "config_kwargs": {"s3": {"addressing_style": "path"}},
            },
        },
    }
    dep: AirflowDeployment | None = None
    try:
        with private_database("slotless_airflow_dep") as (pg_url, url):
            dep = AirflowDeployment(python, home, url, pg_url, connections)
            try:
                dep.start()
                wait_until(
                    lambda: dep is not None and dep.dag_ready(DAG_ID),
                    timeout=180,
                    interval=0.5,
                    what="the dag-processor to parse the DAG",
                )
                yield Setup(dep, s3, inbox)
            finally:
                dep.close()  # before the database is dropped under it
    finally:
        moto.stop()


class Run:
    """One DAG run, followed through Airflow's database."""

    def __init__(self, setup: Setup, run_id: str, delay: float) -> None:
        self.setup = setup
        self.dep = setup.dep
        self.run_id = run_id
        self.delay = delay
        self.seen: dict[str, set[str | None]] = {t: set() for t in SENSORS}
        self.dep.trigger(DAG_ID, run_id, {"delay": delay})

    def states(self) -> dict[str, str | None]:
        states = self.dep.task_states(DAG_ID, self.run_id)
        for task, state in states.items():
            self.seen.setdefault(task, set()).add(state)
        return states

    def all_deferred(self, *watch: tuple[str, Any]) -> bool:
        for name, proc in watch:
            assert proc.poll() is None, f"{name} exited:\n{self.dep.log(name)}"
        self.dep.assert_components_up()
        states = self.states()
        assert not any(s in ("failed", "upstream_failed") for s in states.values()), states
        if not all(states.get(t) == "deferred" for t in SENSORS):
            return False
        # The scheduler has handled the deferring workers' exits (see executor_events_seen).
        return self.dep.executor_events_seen(DAG_ID, self.run_id) >= set(SENSORS)

    def wait_deferred(self, *watch: tuple[str, Any]) -> None:
        try:
            wait_until(
                lambda: self.all_deferred(*watch),
                timeout=120,
                interval=0.2,
                what=f"{SENSORS} of run {self.run_id} to be DEFERRED, their workers' exits taken",
            )
        except AssertionError as exc:
            taken = sorted(self.dep.executor_events_seen(DAG_ID, self.run_id))
            raise AssertionError(
                f"{exc}: states {self.states()}, executor events taken for {taken}"
            ) from None

    def assert_all_deferred(self, when: str) -> None:
        states = self.states()
        assert states == {t: "deferred" for t in SENSORS}, (
            f"{states} when {when}: the time sensor fires {self.delay:g} s after it started, "
            "and this machine took longer than that to get here"
        )

    def land(self) -> None:
        """The file and the S3 key the sensors wait for."""
        (self.setup.inbox / f"{self.run_id}.csv").write_text("a,b\n")
        self.setup.s3.put_object(Bucket=BUCKET, Key=f"{self.run_id}/done", Body=b"x")

    def wait_success(self, *watch: tuple[str, Any]) -> None:
        def done() -> bool:
            for name, proc in watch:
                assert proc.poll() is None, f"{name} exited:\n{self.dep.log(name)}"
            self.dep.assert_components_up()
            states = self.states()
            assert not any(s in ("failed", "upstream_failed") for s in states.values()), (
                states,
                self.dep.log("scheduler"),
            )
            return self.dep.run_state(DAG_ID, self.run_id) == "success"

        wait_until(done, timeout=120, interval=0.3, what=f"run {self.run_id} to succeed")
        states = self.states()
        assert states == {t: "success" for t in SENSORS}, states
        # Each went through DEFERRED: a triggerer, not the worker, saw its condition.
        assert all("deferred" in self.seen[t] for t in SENSORS), self.seen


def _cycled(port: int) -> bool:
    return slotless_metrics(port).get("slotless_airflow_cycles_total", 0) >= 1


def _holds(port: int, proc: Any, name: str, dep: AirflowDeployment) -> bool:
    """The process holds every trigger row a task instance waits on: this run's three (and,
    after a failed test, what its run left waiting)."""
    assert proc.poll() is None, f"{name} exited:\n{dep.log(name)}"
    want = dep.deferred_rows()
    return want >= len(SENSORS) and slotless_metrics(port).get("slotless_airflow_triggers") == want


@contextlib.contextmanager
def held_by_slotless(
    setup: Setup, name: str, key: str, delay: int
) -> Iterator[tuple[Run, int, Any]]:
    """A run whose three sensors are DEFERRED and held by a new ``slotless
    airflow-triggerer`` called ``name``: (the run, the process's metrics port, the
    process). The process is stopped when the block ends, and must exit 0."""
    dep = setup.dep
    port = free_port()
    ours = dep.slotless(name, "--interval", "0.5", "--metrics-port", str(port))
    try:
        run = Run(setup, key, delay=delay)
        run.wait_deferred((name, ours))
        wait_until(
            lambda: _holds(port, ours, name, dep),
            timeout=90,
            interval=0.2,
            what=f"{name} to hold the three rows",
        )
        yield run, port, ours
    finally:
        code = dep.stop(ours)
    assert code == 0, dep.log(name)


def test_deferred_sensors_run_with_slotless_and_no_airflow_triggerer(setup: Setup) -> None:
    dep = setup.dep
    with held_by_slotless(setup, "slotless-solo", "solo", delay=20) as (run, port, ours):
        # No Airflow triggerer anywhere: slotless's Job is the one live TriggererJob.
        assert dep.live_triggerer_jobs() == 1
        run.land()
        run.wait_success(("slotless-solo", ours))
        m = slotless_metrics(port)
        assert m['slotless_airflow_submitted_total{outcome="event"}'] == 3, m
        assert m.get('slotless_airflow_submitted_total{outcome="failure"}', 0) == 0, m


def test_rollback_to_airflows_triggerer_mid_run_loses_nothing(setup: Setup) -> None:
    dep = setup.dep
    with held_by_slotless(setup, "slotless-rollback", "rollback", delay=25) as held:
        run = held[0]
    # Stopped while all three wait; nothing of theirs was fired.
    run.assert_all_deferred("slotless airflow-triggerer was stopped")

    theirs = dep.airflow("airflow-triggerer", "triggerer", "--skip-serve-logs")
    try:
        # Airflow's triggerer takes the three rows at its first cycle (slotless's Job ended
        # at the stop: no health threshold to wait out), before anything lands.
        gone = {job for job, _ in dep.holders(DAG_ID, "rollback").values()}

        def taken() -> bool:
            assert theirs.poll() is None, dep.log("airflow-triggerer")
            held = dep.holders(DAG_ID, "rollback").values()
            return len(held) == 3 and all(s == "running" and j not in gone for j, s in held)

        wait_until(taken, timeout=120, interval=0.2, what="airflow triggerer to take the rows")
        run.land()
        run.wait_success(("airflow-triggerer", theirs))
    finally:
        dep.stop(theirs)


def test_one_of_two_slotless_instances_sigkilled_mid_run(setup: Setup) -> None:
    """Both instances are up before the run, so each takes what Airflow's assignment gives
    it; the one holding more of the three rows is SIGKILLed and the other must take them
    over (after Airflow's health threshold, HEALTH_THRESHOLD s here) and finish the run."""
    dep = setup.dep
    ports = {"slotless-a": free_port(), "slotless-b": free_port()}
    procs = {
        name: dep.slotless(name, "--interval", "0.5", "--metrics-port", str(port))
        for name, port in ports.items()
    }
    watch = list(procs.items())
    try:
        for name, port in ports.items():
            wait_until(
                functools.partial(_cycled, port),
                timeout=120,
                interval=0.2,
                what=f"{name} to run its first cycle",
            )
        run = Run(setup, "takeover", delay=30)
        run.wait_deferred(*watch)

        def held() -> dict[str, float] | None:
            counts = {
                n: slotless_metrics(p).get("slotless_airflow_triggers", 0) for n, p in ports.items()
            }
            want = dep.deferred_rows()
            return counts if want >= 3 and sum(counts.values()) == want else None

        counts = wait_until(held, timeout=90, interval=0.2, what="the three rows to be held")
        victim = max(counts, key=lambda n: counts[n])
        survivor = next(n for n in ports if n != victim)
        killed_at = time.monotonic()
        assert dep.stop(procs[victim], signal.SIGKILL) == -signal.SIGKILL
        wait_until(
            lambda: _holds(ports[survivor], procs[survivor], survivor, dep),
            timeout=HEALTH_THRESHOLD + 30,
            interval=0.1,
            what=f"{survivor} to take over the rows of {victim} (SIGKILLed)",
        )
        took = time.monotonic() - killed_at
        print(f"\n{counts}: {victim} SIGKILLed, its rows taken over {took:.1f} s later")
        # Taken over while all three still wait: the survivor fires them.
        run.assert_all_deferred(f"{survivor} took over")
        run.land()
        run.wait_success((survivor, procs[survivor]))
        m = slotless_metrics(ports[survivor])
        assert m['slotless_airflow_submitted_total{outcome="event"}'] == 3, m
    finally:
        codes = {name: dep.stop(proc) for name, proc in procs.items()}
    assert codes[survivor] == 0, dep.log(survivor)
