"""What one ``slotless airflow-triggerer`` holds, as JSON: ``GET /status`` on its metrics
port, read by ``slotless status --airflow``.

Per check (the rows equal in what they wait for, :mod:`.plans`): its class and key, how
many task instances wait on it and of which DAGs, the first few of them (trigger id and
task instance key), since when, its interval, its last check and result, and which
TriggererJob checks it. Per-trigger detail is here, not in Prometheus, whose labels would
grow with every row: ``/metrics`` stays labelled by DAG and class only.

Bounded at any size: the checks are sorted by how many task instances wait on them and
the first ``checks`` are listed (100 by default), each with its first ``tasks`` task
instances (5 by default); the totals always count everything.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from . import native_external
from .plans import poke_interval

if TYPE_CHECKING:
    from .engine import Engine, Group

MARK = "airflow-triggerer"  # the "slotless" field that tells a reader what answered
FORMAT = 1
CHECKS_SHOWN = 100
TASKS_SHOWN = 5
MAX_SHOWN = 10_000  # the most of either a request may ask for


def snapshot(
    engine: Engine, *, checks: int = CHECKS_SHOWN, tasks: int = TASKS_SHOWN
) -> dict[str, Any]:
    groups = sorted(list(engine.groups.values()), key=lambda g: (-len(g.rows), g.started))
    return {
        "slotless": MARK,
        "format": FORMAT,
        "job_id": engine.job_id,
        "now": time.time(),
        "live": list(engine.live),
        "triggers": len(engine.member),
        "assigned": len(engine.assigned),
        "pool": len(engine.known),
        "check_count": len(groups),
        "checks": [_check(engine, g, tasks) for g in groups[:checks]],
        "recent": list(engine.recent),
    }


def _check(engine: Engine, g: Group, tasks: int) -> dict[str, Any]:
    rows = list(g.rows.values())
    dags: dict[str, int] = {}
    for r in rows:
        if r.dag_id is not None:
            dags[r.dag_id] = dags.get(r.dag_id, 0) + 1
    since = min((r.since for r in rows if r.since is not None), default=None)
    if g.plan.kind in ("file", "s3", "sftp"):
        interval: float | None = min((poke_interval(r.kwargs) for r in rows), default=None)
        next_at = None
    elif g.plan.kind == "external":
        interval, next_at = native_external.interval(g.plan.key, (r.kwargs for r in rows)), None
    else:
        interval = None  # a timer sleeps until its moment; an adapted run() paces itself
        next_at = g.kwargs.get("moment") if g.plan.kind == "time" else None
    return {
        "check": g.describe(),
        "kind": g.plan.kind,
        "classpath": g.classpath,
        "key": repr(g.plan.key),
        "checked_by": engine.job_id,
        "waiting": len(rows),
        "dags": dags,
        "since": since,
        "checking_since": g.started,
        "interval": interval,
        "fires_at": None if next_at is None else _iso(next_at),
        "last_check": g.last_check,
        "last_result": g.last_result,
        "events": g.events,
        "tasks": [
            {
                "trigger_id": r.id,
                "dag_id": r.dag_id,
                "task_id": r.task_id,
                "run_id": r.run_id,
                "map_index": r.map_index,
                "try_number": r.try_number,
                "since": r.since,
            }
            for r in rows[:tasks]
        ],
    }


def _iso(value: Any) -> str:
    iso = getattr(value, "isoformat", None)
    return str(iso()) if callable(iso) else str(value)


def bounded(raw: str | None, default: int) -> int:
    """A query parameter's count: ``default`` when absent, clamped to 0..MAX_SHOWN;
    ValueError (said to the caller as a 400) when not a number."""
    if raw is None or raw == "":
        return default
    return max(0, min(MAX_SHOWN, int(raw)))
