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
        for i, path in enumerate(paths):
            trigger = Trigger.from_object(FileTrigger(filepath=path, poke_interval=interval))
            session.add(trigger)
            session.flush()
            ti = TaskInstance(task, dag_version_id=version, run_id=run.run_id, map_index=i)
            ti.state = TaskInstanceState.DEFERRED
            ti.trigger_id = trigger.id
            ti.next_method = "execute_complete"
            ti.next_kwargs = {}
            ti.start_date = now
            session.add(ti)
            if i % 1000 == 999:
                session.flush()
        session.commit()
        assert isinstance(run, DagRun)
    print(json.dumps({"run_id": run.run_id, "seconds": time.monotonic() - began}))


if __name__ == "__main__":
    main()
