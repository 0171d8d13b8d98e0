"""The standard provider's ``DagStateTrigger`` and ``WorkflowTrigger`` checked natively by
``slotless airflow-triggerer``, against a real Airflow 3.3 metadata database on PostgreSQL.

Runs of an "upstream" DAG (an ``extract`` task and a ``load`` task mapped over three
values) are made by Airflow's own ``create_dagrun``; task instances of a "waiters" DAG are
deferred through Airflow's ORM as its worker and execution API defer them
(tests/support/airflow_deferred.py), each on the trigger ``TriggerDagRunOperator`` or
``ExternalTaskSensor`` (deferrable) builds, serialized by the provider itself. The upstream
states are then set through the ORM, as the scheduler and the execution API set them.

Shown: 46 task instances on 10 distinct conditions are 10 native checks answered by ONE
read of Airflow's tables per interval (the process's own count on /metrics), nothing fires
while the upstream runs are running, and once they succeed every task instance leaves
DEFERRED with the provider's exact payload; a sensor on ``load`` over three runs resumes
once ONE run's three map indexes succeeded, as the route's count (every map index) makes
the provider's answer; a failed mapped instance is
``{"status": "failed"}`` and a skipped task ``{"status": "skipped"}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.airflow_deployment import slotless_metrics
from support.airflow_home import AirflowHome
from support.helpers import free_port, stop_process, wait_until
from support.pg import fetch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXT = "airflow.providers.standard.triggers.external_task"
DAGSTATE, WORKFLOW = f"{EXT}.DagStateTrigger", f"{EXT}.WorkflowTrigger"
DAYS = {k: f"2026-05-0{k}T00:00:00+00:00" for k in (1, 2, 3, 9)}
COPIES = 5  # task instances per condition

# Per upstream run k: a DagStateTrigger (TriggerDagRunOperator), a WorkflowTrigger on the
# run (ExternalTaskSensor without task ids) and one on its extract task; each five times,
# at two intervals (one check, at the shortest). And one on load over all three runs.
WAITS: dict[str, tuple[str, dict[str, Any]]] = {}
for _k in (1, 2, 3):
    for _c in range(COPIES):
        WAITS[f"ds{_k}_{_c}"] = (
            DAGSTATE,
            {
                "dag_id": "upstream",
                "states": ["success", "failed"],
                "run_ids": [f"u{_k}"],
                "execution_dates": None,
                "poll_interval": 0.5,
            },
        )
        _sensor = {
            "external_dag_id": "upstream",
            "logical_dates": [{"iso": DAYS[_k]}],
            "allowed_states": ["success"],
            "failed_states": ["failed"],
            "poke_interval": 0.5 if _c % 2 else 1.0,
        }
        WAITS[f"run{_k}_{_c}"] = (WORKFLOW, _sensor)
        WAITS[f"extract{_k}_{_c}"] = (
            WORKFLOW,
            {**_sensor, "external_task_ids": ["extract"], "skipped_states": ["skipped"]},
        )
WAITS["load_all"] = (
    WORKFLOW,
    {
        "external_dag_id": "upstream",
        "external_task_ids": ["load"],
        "logical_dates": [{"iso": DAYS[k]} for k in (1, 2, 3)],
        "allowed_states": ["success"],
        "poke_interval": 0.5,
    },
)
CHECKS = 3 * 3 + 1
FAILS = {
    "load_failed": (
        WORKFLOW,
        {
            "external_dag_id": "upstream",
            "external_task_ids": ["load"],
            "logical_dates": [{"iso": DAYS[9]}],
            "failed_states": ["failed"],
            "allowed_states": ["success"],
            "poke_interval": 0.5,
        },
    ),
    "extract_skipped": (
        WORKFLOW,
        {
            "external_dag_id": "upstream",
            "external_task_ids": ["extract"],
            "run_ids": ["u9"],
            "skipped_states": ["skipped"],
            "allowed_states": ["success"],  # None would count every state: at once
            "poke_interval": 0.5,
        },
    ),
}

DAGS = {
    "upstream.py": """
from datetime import datetime

from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("upstream", schedule=None, start_date=datetime(2026, 1, 1)):
    EmptyOperator(task_id="extract")
    BashOperator.partial(task_id="load").expand(bash_command=["true", "true", "true"])
""",
    "waiters.py": f"""
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("waiters", schedule=None, start_date=datetime(2026, 1, 1)):
    for name in {[*WAITS, *FAILS]!r}:
        EmptyOperator(task_id=name)
""",
}

STATES = "SELECT task_id, state FROM task_instance WHERE dag_id = 'waiters' AND run_id = $1"


class Airflow(AirflowHome):
    def __init__(self, python: Path, tmp: Path, url: str, pg_url: str) -> None:
        super().__init__(python, tmp, url, pg_url, DAGS)

    def deferred(self, run_id: str) -> set[str]:
        """The waiters still DEFERRED: one query, not a Python with Airflow."""
        rows = asyncio.run(fetch(self.pg_url, STATES, run_id))
        return {r["task_id"] for r in rows if r["state"] == "deferred"}

    def upstream_run(self, k: int) -> None:
        spec = {"dag_id": "upstream", "run_id": f"u{k}", "logical_date": DAYS[k], "tasks": []}
        assert self.helper("defer", spec) == {}

    def defer(self, run_id: str, waits: dict[str, tuple[str, dict[str, Any]]]) -> None:
        tasks = [
            {"task_id": name, "classpath": classpath, "args": args}
            for name, (classpath, args) in waits.items()
        ]
        ids = self.helper("defer", {"dag_id": "waiters", "run_id": run_id, "tasks": tasks})
        assert set(ids) == set(waits)
        assert self.deferred(run_id) == set(waits)


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Airflow]:
    with Airflow.migrated(tmp_path_factory, "slotless_airflow_external") as af:
        yield af


def test_waits_on_other_dags_runs_are_one_read_per_interval(
    airflow: Airflow, tmp_path: Path
) -> None:
    for k in (1, 2, 3):
        airflow.upstream_run(k)
    airflow.defer("r1", WAITS)
    port = free_port()
    log = tmp_path / "triggerer.log"
    proc = airflow.start_triggerer(log, "--metrics-port", str(port))

    def metrics() -> dict[str, float]:
        assert proc.poll() is None, log.read_text()[-3000:]
        return slotless_metrics(port)

    try:
        wait_until(
            lambda: metrics().get('slotless_airflow_checks{kind="external"}') == CHECKS,
            timeout=60,
            interval=0.2,
            what=f"{len(WAITS)} rows held as {CHECKS} native checks",
        )
        m = metrics()
        assert m["slotless_airflow_triggers"] == len(WAITS)
        assert m['slotless_airflow_checks{kind="adapter"}'] == 0

        # Four reads while the 10 checks go on: each read answered all 10 (a read per
        # check would be 10 per round). A round read mid-way is one off each end.
        checks = 'slotless_airflow_native_checks_total{kind="external"}'
        reads = "slotless_airflow_external_reads_total"
        first_checks, first_reads = m[checks], m[reads]
        wait_until(
            lambda: metrics()[reads] >= first_reads + 4,
            timeout=20,
            interval=0.05,
            what="four more reads",
        )
        m = metrics()
        read, checked = m[reads] - first_reads, m[checks] - first_checks
        assert CHECKS * (read - 2) <= checked <= CHECKS * (read + 2), (read, checked)
        # Nothing fires while the upstream runs are running.
        assert airflow.deferred("r1") == set(WAITS)

        def succeed(k: int) -> None:
            tasks = {"extract": "success", "load": "success"}
            spec = {"dag_id": "upstream", "run_id": f"u{k}", "state": "success", "tasks": tasks}
            assert airflow.helper("set_states", spec) == {"extract": 1, "load": 3}

        # u1 succeeds: its waiters resume, and so does the one on load over three dates:
        # the route counts every map index, so u1's three load instances are 3, the number
        # of its dates (the provider's own answer, however odd).
        succeed(1)
        left = {n for n in WAITS if not n.endswith(tuple(f"1_{c}" for c in range(COPIES)))}
        left.discard("load_all")
        wait_until(
            lambda: airflow.deferred("r1") == left,
            timeout=30,
            interval=0.3,
            what="u1's waiters and load_all to resume, and only them",
        )
        succeed(2)
        succeed(3)
        wait_until(
            lambda: not airflow.deferred("r1"),
            timeout=30,
            interval=0.3,
            what="every waiter to resume",
        )
        states = airflow.helper("states", {"dag_id": "waiters", "run_id": "r1"})
        for name, (classpath, args) in WAITS.items():
            s = states[name]
            assert s["state"] == "scheduled" and s["trigger_id"] is None, (name, s)
            assert s["next_method"] == "execute_complete", (name, s)
            if classpath == DAGSTATE:
                # The provider's (classpath, serialize() + {run_ids[0]: its state}).
                run_id = args["run_ids"][0]
                want: Any = [classpath, {**args, run_id: "success"}]
            else:
                want = {"status": "success"}
            assert s["next_kwargs"] == {"asked": name, "event": want}, (name, s)
        m = metrics()
        assert m['slotless_airflow_submitted_total{outcome="event"}'] == len(WAITS)
        assert m['slotless_airflow_submitted_total{outcome="failure"}'] == 0
    finally:
        code = stop_process(proc)
    assert code == 0, log.read_text()[-3000:]


def test_a_failed_mapped_instance_and_a_skipped_task_are_the_providers_events(
    airflow: Airflow, tmp_path: Path
) -> None:
    airflow.upstream_run(9)
    airflow.defer("r2", FAILS)
    port = free_port()
    log = tmp_path / "triggerer.log"
    proc = airflow.start_triggerer(log, "--metrics-port", str(port))
    try:
        wait_until(
            lambda: slotless_metrics(port).get('slotless_airflow_checks{kind="external"}') == 2,
            timeout=60,
            interval=0.2,
            what="the two rows held as native checks",
        )
        assert airflow.deferred("r2") == set(FAILS)
        done = airflow.helper(
            "set_states",
            {
                "dag_id": "upstream",
                "run_id": "u9",
                "tasks": {"load[1]": "failed", "extract": "skipped"},
            },
        )
        assert done == {"load[1]": 1, "extract": 1}
        wait_until(
            lambda: not airflow.deferred("r2"),
            timeout=30,
            interval=0.3,
            what="both waiters to resume",
        )
        states = airflow.helper("states", {"dag_id": "waiters", "run_id": "r2"})
        assert states["load_failed"]["next_kwargs"] == {
            "asked": "load_failed",
            "event": {"status": "failed"},
        }
        assert states["extract_skipped"]["next_kwargs"] == {
            "asked": "extract_skipped",
            "event": {"status": "skipped"},
        }
    finally:
        code = stop_process(proc)
    assert code == 0, log.read_text()[-3000:]
