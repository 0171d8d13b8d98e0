"""Outcomes written through ``AirflowRows.submit`` in a real Airflow metadata database, and
the rows they leave, for comparing the batched write (triggerer/airflow/submitting.py) with
Airflow's own ``Trigger.submit_event`` / ``submit_failure`` called per trigger id.

Run inside the Airflow test environment (.venv-airflow), as support/airflow_deferred.py:

    python -m support.airflow_submitting submit < {"mode", "outcomes": [...]}
    python -m support.airflow_submitting rows < {"dag_id", "run_id"}
    python -m support.airflow_submitting callbacks < {"n"}

``submit`` starts a Job, assigns the outcomes' trigger rows to it (as ``assign_unassigned``
would) and times ``AirflowRows.submit`` of them: one call, or (``"most"``) one per
transaction of at most that many ids as the engine cuts a burst (after one of the first
``"warm"`` outcomes, untimed). Each outcome is
``{"ids": [...], "kind": ...}``: ``"event"`` with a ``"payload"``, ``"success"`` (a
``TaskSuccessEvent``, ``"xcoms"`` optional), ``"failure"`` with an ``"error"`` text, or
``"raised"`` (an exception raised and caught here, so it has a traceback). ``"mode"`` says
how the rows are written under submit's lock: ``"batched"`` (as the triggerer does),
``"flush_each"`` (batched, but a flush per task instance as Airflow's handler does), or
``"per_id"`` (Airflow's ``Trigger.submit_event`` / ``submit_failure`` once per trigger id,
what the triggerer did before).

``rows`` gives what a write leaves: each task instance's columns and XComs, the asset
events, the callbacks (triggerer callbacks, and the callback requests of ended tasks).
``callbacks`` makes ``n`` triggerer callbacks (Airflow's ``TriggererCallback.queue`` makes
their trigger rows) and gives their ids and trigger ids.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any


def submit(spec: dict[str, Any]) -> dict[str, Any]:
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import update  # type: ignore[import-not-found]

    from triggerer.airflow import rows as rows_module
    from triggerer.airflow import submitting
    from triggerer.airflow.rows import AirflowRows, Outcome, in_batches

    outcomes = [Outcome(list(o["ids"]), **_outcome(o)) for o in spec["outcomes"]]
    rows = AirflowRows(capacity=1_000_000)
    job_id = rows.start_job()
    ids = sorted({tid for o in outcomes for tid in o.ids})
    with create_session() as session:
        session.execute(update(Trigger).where(Trigger.id.in_(ids)).values(triggerer_id=job_id))
    writers = {
        "batched": submitting.write,
        "flush_each": _flush_each,
        "per_id": _per_id,
    }
    rows_module.write = writers[spec["mode"]]  # type: ignore[assignment]
    # The first few untimed: the process's first statements pay for imports and the
    # ORM's compiling its queries, which a running triggerer has long paid.
    warm = spec.get("warm", 0)
    rows.submit(outcomes[:warm])
    outcomes = outcomes[warm:]
    # As the engine writes a burst: transactions of at most "most" trigger ids, in turn.
    batches = in_batches(outcomes, spec.get("most", len(ids) or 1))
    began = time.perf_counter()
    skipped = [s for batch in batches for s in rows.submit(batch)]
    took = time.perf_counter() - began
    rows.end_job()
    return {"seconds": took, "written": [o.written for o in outcomes], "skipped": len(skipped)}


def _per_id(writes: Sequence[Any], session: Any) -> None:
    """What AirflowRows.submit did before the batched write: Airflow's methods per id."""
    from airflow.models.trigger import Trigger

    for w in writes:
        if w.error is not None:
            Trigger.submit_failure(w.trigger_id, w.error, session=session)
        else:
            Trigger.submit_event(w.trigger_id, w.event, session=session)


def _flush_each(writes: Sequence[Any], session: Any) -> None:
    from triggerer.airflow import submitting

    submitting.write(writes, session, hold_flushes=False)


def _outcome(o: dict[str, Any]) -> dict[str, Any]:
    from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

    kind = o["kind"]
    if kind == "event":
        return {"event": TriggerEvent(o["payload"])}
    if kind == "success":
        return {"event": TaskSuccessEvent(xcoms=o.get("xcoms"))}
    if kind == "failure":
        return {"error": o["error"]}
    try:
        raise RuntimeError(o["error"])
    except RuntimeError as exc:
        return {"error": exc}


def rows(spec: dict[str, Any]) -> dict[str, Any]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.callback import Callback
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    out: dict[str, Any] = {"tis": {}}
    with create_session() as session:
        for ti in session.scalars(
            select(TI).where(TI.dag_id == spec["dag_id"], TI.run_id == spec["run_id"])
        ):
            xcoms = session.execute(
                select(XComModel.key, XComModel.value).where(
                    XComModel.dag_id == ti.dag_id,
                    XComModel.run_id == ti.run_id,
                    XComModel.task_id == ti.task_id,
                )
            ).all()
            out["tis"][ti.task_id] = {
                "state": str(getattr(ti.state, "value", ti.state)) if ti.state else None,
                "next_method": ti.next_method,
                "next_kwargs": json.loads(json.dumps(ti.next_kwargs, default=str)),
                "trigger_id": ti.trigger_id,
                "scheduled": ti.scheduled_dttm is not None,
                "ended": ti.end_date is not None,
                "try_number": ti.try_number,
                "xcoms": {k: json.loads(json.dumps(v, default=str)) for k, v in xcoms},
            }
        out["asset_events"] = [
            {"asset": name, "extra": json.loads(json.dumps(extra, default=str))}
            for name, extra in session.execute(
                select(AssetModel.name, AssetEvent.extra)
                .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
                .order_by(AssetEvent.id)
            ).all()
        ]
        # Triggerer callbacks and the callback requests of ended task instances (Airflow's
        # DbCallbackRequest is a kind of Callback), oldest first.
        out["callbacks"] = [
            {
                "id": str(c.id),
                "type": c.type,
                "state": c.state,
                "output": c.output,
                "has_trigger": c.trigger_id is not None,
                "data": json.loads(json.dumps(c.data, default=str)),
            }
            for c in session.scalars(select(Callback).order_by(Callback.created_at))
        ]
    return out


def callbacks(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from airflow.models.callback import TriggererCallback
    from airflow.sdk import AsyncCallback
    from airflow.utils.session import create_session

    made = []
    with create_session() as session:
        for _ in range(spec["n"]):
            cb = TriggererCallback(AsyncCallback("support.airflow_submitting.noticed"))
            cb.queue(session=session)
            session.add(cb)
            session.flush()
            made.append({"id": str(cb.id), "trigger_id": int(cb.trigger.id)})
    return made


async def noticed(**kwargs: Any) -> None:
    """A triggerer callback's callable (never run here: its trigger's outcomes are given)."""
    return None


def main() -> None:
    spec = json.load(sys.stdin)
    commands = {"submit": submit, "rows": rows, "callbacks": callbacks}
    result = commands[sys.argv[1]](spec)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
