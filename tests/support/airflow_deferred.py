"""Task instances deferred in a real Airflow metadata database, as Airflow writes them.

Run inside the Airflow test environment (.venv-airflow), with Airflow's configuration in
the environment (AIRFLOW_HOME, AIRFLOW__DATABASE__SQL_ALCHEMY_CONN, ...):

    python -m support.airflow_deferred sync DAGS_DIR
    python -m support.airflow_deferred defer < {"dag_id", "run_id", "tasks": [...]}
    python -m support.airflow_deferred states < {"dag_id", "run_id"}
    python -m support.airflow_deferred set_states < {"dag_id", "run_id", "state", "tasks"}
    python -m support.airflow_deferred log < {"dag_id", "run_id", "task_id", "try_number"}

``defer`` creates a DagRun of the (synced) DAG through Airflow's own ``create_dagrun``, then
defers each task as Airflow's worker and execution API do: the worker builds the trigger
and ``serialize()``s it, serde-encodes its kwargs and the next_kwargs; the API stores a
``Trigger`` row with those kwargs as JSON text and sets the task instance DEFERRED with its
trigger_id, next_method and next_kwargs (api_fastapi/execution_api/routes/task_instances.py).
A task's ``"queue"`` is its trigger row's queue (what the worker writes when Airflow's
``[triggerer] queues_enabled`` is on). ``"connections"`` ({conn_id: uri}) are stored in
Airflow's connection table first. A ``"logical_date"`` (ISO text) is the run's (a manual
run has none otherwise); ``"tasks"`` may be empty, for a run that others wait on.
``set_states`` sets a run's state (Airflow's own ``DagRun.set_state``) and its task
instances' (``{task_id: state}``, every map index; ``"task_id[i]"`` for one) through the ORM,
as the scheduler and the execution API would.
A task given ``"fernet_key"`` has its kwargs encrypted with that key instead (as a row
written by ``Trigger(...)`` itself is), to test a triggerer with another key.

Each task: {"task_id", "classpath", "args": {...}} builds ``classpath(**args)``, with
``{"seconds": n}`` under ``delta`` made a timedelta and each ``{"iso": text}`` a datetime;
or {"task_id", "raw_classpath", "raw_kwargs"} stores those as they are (a class that does
not exist).
"""

from __future__ import annotations

import importlib
import json
import sys
from datetime import timedelta
from typing import Any


def sync(dags_dir: str) -> None:
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=dags_dir, bundle_name="dags-folder")
    if bag.import_errors:
        raise SystemExit(f"DAG import errors: {bag.import_errors}")
    sync_bag_to_db(bag, "dags-folder", None)


def defer(spec: dict[str, Any]) -> dict[str, int]:
    from airflow._shared.timezones import timezone
    from airflow.models.connection import Connection
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.trigger import Trigger
    from airflow.sdk.serde import serialize as serde_serialize
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from cryptography.fernet import Fernet
    from sqlalchemy import update  # type: ignore[import-not-found]

    out: dict[str, int] = {}
    with create_session() as session:
        for conn_id, uri in spec.get("connections", {}).items():
            session.add(Connection(conn_id=conn_id, uri=uri))
        dag = SerializedDagModel.get_dag(spec["dag_id"], session=session)
        logical = spec.get("logical_date")
        at = None if logical is None else timezone.parse(logical)
        run = dag.create_dagrun(
            run_id=spec["run_id"],
            logical_date=at,
            data_interval=None if at is None else (at, at),
            run_after=timezone.utcnow(),
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.RUNNING,
            session=session,
        )
        tis = {ti.task_id: ti for ti in run.get_task_instances(session=session)}
        for task in spec["tasks"]:
            if "raw_classpath" in task:
                classpath, kwargs = task["raw_classpath"], task["raw_kwargs"]
            else:
                classpath, kwargs = _build(task["classpath"], task.get("args", {})).serialize()
            stored = json.dumps(serde_serialize(kwargs))
            if "fernet_key" in task:
                stored = Fernet(task["fernet_key"].encode()).encrypt(stored.encode()).decode()
            row = Trigger(classpath=classpath, kwargs={}, queue=task.get("queue"))
            row.encrypted_kwargs = stored
            session.add(row)
            session.flush()
            session.execute(
                update(TI)
                .where(TI.id == tis[task["task_id"]].id)
                .values(
                    state=TaskInstanceState.DEFERRED,
                    trigger_id=row.id,
                    next_method="execute_complete",
                    next_kwargs=serde_serialize(
                        task.get("next_kwargs", {"asked": task["task_id"]})
                    ),
                    trigger_timeout=None,
                    # A deferred task has run once (its worker deferred it); 0 unless asked.
                    try_number=task.get("try_number", 0),
                )
            )
            out[task["task_id"]] = row.id
    return out


def states(spec: dict[str, Any]) -> dict[str, Any]:
    """Each task instance's state, next_method, next_kwargs (decoded) and trigger_id."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.trigger import _decode_next_kwargs
    from airflow.utils.session import create_session
    from sqlalchemy import select

    out: dict[str, Any] = {}
    with create_session() as session:
        rows = session.scalars(
            select(TI).where(TI.dag_id == spec["dag_id"], TI.run_id == spec["run_id"])
        )
        for ti in rows:
            nk = _decode_next_kwargs(ti.next_kwargs) if ti.next_kwargs else None
            out[ti.task_id] = {
                "state": str(getattr(ti.state, "value", ti.state)) if ti.state else None,
                "next_method": ti.next_method,
                "next_kwargs": json.loads(json.dumps(nk, default=str)),
                "trigger_id": ti.trigger_id,
            }
    return out


def set_states(spec: dict[str, Any]) -> dict[str, int]:
    """A run's state and its task instances' states, set through Airflow's ORM; how many
    task instances each entry changed."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from sqlalchemy import select, update

    out: dict[str, int] = {}
    with create_session() as session:
        run = session.scalars(
            select(DagRun).where(DagRun.dag_id == spec["dag_id"], DagRun.run_id == spec["run_id"])
        ).one()
        for task, state in spec.get("tasks", {}).items():
            task_id, _, index = task.partition("[")
            where = [
                TI.dag_id == spec["dag_id"],
                TI.run_id == spec["run_id"],
                TI.task_id == task_id,
            ]
            if index:
                where.append(TI.map_index == int(index.rstrip("]")))
            done = session.execute(update(TI).where(*where).values(state=state))
            out[task] = done.rowcount
        if spec.get("state"):
            run.set_state(DagRunState(spec["state"]))
    return out


def task_log(spec: dict[str, Any]) -> dict[str, Any]:
    """A task instance's log as Airflow's UI gets it (its TaskLogReader, the configured
    task handler): each message's event text, and the sources it read."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.log.log_reader import TaskLogReader
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalars(
            select(TI).where(
                TI.dag_id == spec["dag_id"],
                TI.run_id == spec["run_id"],
                TI.task_id == spec["task_id"],
            )
        ).one()
        stream, _ = TaskLogReader().read_log_chunks(ti, spec["try_number"], {})
        events = [str(getattr(m, "event", m)) for m in stream]
    return {"events": events}


def _build(classpath: str, args: dict[str, Any]) -> Any:
    module, _, name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    if isinstance(args.get("delta"), dict):
        args = {**args, "delta": timedelta(**args["delta"])}
    return cls(**{k: _value(v) for k, v in args.items()})


def _value(value: Any) -> Any:
    """``{"iso": text}`` as the aware datetime Airflow would pass (a list of them too)."""
    from airflow._shared.timezones import timezone

    if isinstance(value, list):
        return [_value(v) for v in value]
    if isinstance(value, dict) and set(value) == {"iso"}:
        return timezone.parse(value["iso"])
    return value


def main() -> None:
    command = sys.argv[1]
    if command == "sync":
        sync(sys.argv[2])
        return
    spec = json.load(sys.stdin)
    commands = {"defer": defer, "states": states, "set_states": set_states, "log": task_log}
    result = commands[command](spec)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
