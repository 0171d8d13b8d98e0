"""Creating a run: a DAG's shape inserted as rows, at most once per run key, queued when
its DAG already has ``max_active_runs`` runs going.

Every way a run starts ends here: :meth:`Store.start_run` (the Python API, ``slotless
run|trigger|backfill``) with a DAG it imported, and the triggerer firing a schedule or a
start condition with the shape the catalogue stored (:class:`RunShape` as JSON), so that
no service imports a DAG file to start a run.

A QUEUED run has all its rows, none of them claimable (trigger rules are not applied
yet). When a run ends, :func:`executor.statemachine` starts the oldest QUEUED run of its
DAG that fits under its limit, in the same transaction.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date
from typing import TYPE_CHECKING, Any

from ..rows import TaskRow
from ..schedules import Interval
from ..statemachine import evaluate, transition_run
from ..states import RunState
from .db import Tx

if TYPE_CHECKING:
    from ..dag import DAG


@dataclass(frozen=True, slots=True)
class StartedRun:
    """What creating a run did: the run (new, or the one holding the key), and its state."""

    run_id: str
    run_key: str
    created: bool
    state: str = RunState.RUNNING


@dataclass(frozen=True, slots=True)
class TaskShape:
    task_id: str
    parents: tuple[str, ...]
    trigger_rule: str
    priority: int = 0
    expand_from: str | None = None
    map_cap: int | None = None
    max_attempts: int = 1


@dataclass(frozen=True, slots=True)
class RunShape:
    """The rows a run of a DAG inserts: what run creation needs of a DAG, and no code."""

    dag_id: str
    tasks: tuple[TaskShape, ...]

    @classmethod
    def of(cls, dag: DAG) -> RunShape:
        return cls(
            dag.dag_id,
            tuple(
                TaskShape(
                    s.task_id,
                    tuple(s.parents),
                    s.trigger_rule.value,
                    s.priority,
                    s.expand,
                    s.effective_map_cap(),
                    s.retries + 1,
                )
                for s in dag.tasks.values()
            ),
        )

    def to_json(self) -> str:
        return json.dumps([[*_fields(t)] for t in self.tasks], separators=(",", ":"))

    @classmethod
    def from_json(cls, dag_id: str, text: str) -> RunShape:
        return cls(dag_id, tuple(_task(*fields) for fields in json.loads(text)))


def _fields(t: TaskShape) -> tuple[Any, ...]:
    return (t.task_id, t.parents, t.trigger_rule, t.priority, t.expand_from, t.map_cap,
            t.max_attempts)  # fmt: skip


def _task(task_id: str, parents: list[str], *rest: Any) -> TaskShape:
    return TaskShape(task_id, tuple(parents), *rest)


@dataclass(frozen=True, slots=True)
class NewRun:
    """How a run is created: its date, key and what it starts with."""

    logical_date: date  # the ds: the date of the interval's start on the schedule's clock
    run_key: str
    interval: Interval | None = None  # a schedule's data interval
    conf: Mapping[str, Any] | None = None
    dag_file: str | None = None
    start_event: Any = None  # a start condition's payload: ctx.start_event
    max_active: int | None = None  # queue it when the DAG has this many runs going
    run_id: str | None = None


def scheduled_run_key(interval: Interval) -> str:
    """A schedule's run key: its interval's start in UTC (``2026-04-25T06:00:00Z``), so one
    run per interval ever, whoever fires it and however often."""
    return interval.start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manual_run_key(logical_date: date, token: str) -> str:
    """A manual run's default key: the date and a random part (``2026-04-25~manual-3fa9c1``),
    so that manual runs of one date are distinct and never take a schedule's key."""
    return f"{logical_date.isoformat()}~manual-{token}"


def new_run_id(dag_id: str, logical_date: date, token: str | None = None) -> str:
    return f"{dag_id}:{logical_date.isoformat()}:{token or secrets.token_hex(3)}"


async def insert_run(tx: Tx, shape: RunShape, new: NewRun, now: float) -> StartedRun:
    """Insert ``new`` as a run of ``shape`` in ``tx``; nothing when its key is taken.

    With ``new.max_active``, the run is QUEUED if its DAG has that many RUNNING runs or
    any QUEUED one (first come, first started); the DAG's runs are locked for the check
    (on PostgreSQL an advisory lock per DAG), so concurrent creators never overshoot.
    """
    dag_id = shape.dag_id
    state = RunState.RUNNING
    if new.max_active is not None and shape.tasks:
        await tx.fetchone("lock_dag_runs", dag_id=dag_id)
        going = await tx.fetchone("dag_runs_going", dag_id=dag_id)
        assert going is not None
        if going["running"] >= new.max_active or going["queued"] > 0:
            state = RunState.QUEUED
    run_id = new.run_id or new_run_id(dag_id, new.logical_date)
    iv = new.interval
    inserted = await tx.fetchone(
        "insert_run",
        run_id=run_id,
        dag_id=dag_id,
        logical_date=new.logical_date.isoformat(),
        state=state.value,
        dag_file=new.dag_file,
        now=now,
        tasks=len(shape.tasks),
        run_key=new.run_key,
        conf=None if new.conf is None else json.dumps(dict(new.conf)),
        data_interval_start=None if iv is None else iv.start.isoformat(),
        data_interval_end=None if iv is None else iv.end.isoformat(),
        start_event=None if new.start_event is None else json.dumps(new.start_event),
        max_active=new.max_active,
    )
    if inserted is None:
        # The key is taken. On PostgreSQL the insert waited for a concurrent one to commit;
        # this read (READ COMMITTED: a new snapshot) sees its row.
        existing = await tx.fetchone("run_by_key", dag_id=dag_id, run_key=new.run_key)
        assert existing is not None, f"run key {new.run_key!r} taken, yet no run has it"
        return StartedRun(existing["run_id"], new.run_key, False, existing["state"])
    has_children = {p for t in shape.tasks for p in t.parents}
    await tx.executemany(
        "insert_task",
        [
            {
                "run_id": run_id,
                "task_id": t.task_id,
                "trigger_rule": t.trigger_rule,
                "priority": t.priority,
                "is_leaf": int(t.task_id not in has_children),
                "expand_from": t.expand_from,
                "map_cap": t.map_cap,
                "max_attempts": t.max_attempts,
                "n_parents": len(t.parents),
                "now": now,
            }
            for t in shape.tasks
        ],
    )
    await tx.executemany(
        "insert_edge",
        [
            {"run_id": run_id, "parent": parent, "child": t.task_id}
            for t in shape.tasks
            for parent in t.parents
        ],
    )
    if not shape.tasks:  # no task will ever end to finish it
        await transition_run(tx, run_id, RunState.RUNNING, RunState.SUCCESS, now=now)
    elif state is RunState.RUNNING:
        await evaluate(tx, TaskRow.all(await tx.fetch("run_tasks", run_id=run_id)), now)
    return StartedRun(run_id, new.run_key, True, state.value)
