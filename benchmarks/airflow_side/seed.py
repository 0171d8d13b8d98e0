"""Run with the Airflow venv's python: write N deferred task instances, each with its
FileTrigger row, as a deferring FileSensor(deferrable=True) would leave them.

    python seed.py N INTERVAL PATHS_JSON

PATHS_JSON: a file holding the list of N file paths (equal paths make equal triggers, as
Airflow writes them: one trigger row per task instance, no de-duplication).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from airflow.models.dagrun import DagRun
from airflow.models.serialized_dag import SerializedDagModel
from airflow.models.taskinstance import TaskInstance
from airflow.models.trigger import Trigger
from airflow.providers.standard.triggers.file import FileTrigger
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState, TaskInstanceState
from airflow.utils.types import DagRunTriggeredByType, DagRunType


def main() -> None:
    n, interval, paths_file = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    paths = json.loads(Path(paths_file).read_text())
    assert len(paths) == n
    began = time.monotonic()
    with create_session() as session:
        dag = SerializedDagModel.get_dag("vs_bench", session=session)
        now = datetime.now(UTC)
        run = dag.create_dagrun(
            run_id=f"bench_{now:%H%M%S%f}",
            logical_date=now,
            data_interval=(now, now),
            run_after=now,
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.RUNNING,
            session=session,
        )
        session.flush()
        task = dag.get_task("wait")
        version = run.created_dag_version_id
        assert version is not None, "the DAG was not serialized (airflow dags reserialize)"
        for ti in session.query(TaskInstance).filter(TaskInstance.run_id == run.run_id):
            session.delete(ti)
        session.flush()
        # Rows go in by the thousand: one flush returns a thousand trigger ids at once
        # (benchmarks/vs_airflow_triggerer.py writes 100,000; a round trip per row would
        # dominate). Each row is still one Trigger and one TaskInstance of Airflow's ORM.
        run_id = run.run_id
        for start in range(0, n, 1000):
            chunk = paths[start : start + 1000]
            triggers = [
                Trigger.from_object(FileTrigger(filepath=p, poke_interval=interval)) for p in chunk
            ]
            session.add_all(triggers)
            session.flush()
            for i, trigger in enumerate(triggers, start):
                ti = TaskInstance(task, dag_version_id=version, run_id=run_id, map_index=i)
                ti.state = TaskInstanceState.DEFERRED
                ti.trigger_id = trigger.id
                ti.next_method = "execute_complete"
                ti.next_kwargs = {}
                ti.start_date = now
                session.add(ti)
            session.flush()
            session.expunge_all()  # the session would otherwise hold every row written
        session.commit()
        assert isinstance(run, DagRun)
    print(json.dumps({"run_id": run_id, "seconds": time.monotonic() - began}))


if __name__ == "__main__":
    main()
