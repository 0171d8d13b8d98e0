"""A run's time waits: its deadline, its dagrun_timeout and its sensors' ``expected_by``.

Like a schedule's start wait (executor/store/starts.py), each is a wait without a task: a
``run_wait`` row pointing at a trigger row, a :class:`~triggers.temporal.DateTimeTrigger`
at the moment (waits due at one moment share one trigger row, so one check), which the
triggerer loads beside the tasks' waits (as ``wait_kind`` 'run', ``wait_id`` its id) and
fires in its outbox's transaction (executor/store/deadlines.py). No loop of its own.

**Armed** as the run's state changes (:func:`waits_of`, :func:`arm`): the deadline and the
late waits when the run is created (executor/store/runs.py), the timeout when it starts
RUNNING (a queued run's clock starts then; executor.statemachine.transition_run). A run
cleared after it ended is armed again: its timeout from the clear, its deadline and late
waits if their moment is still ahead. **Dropped** when the run ends (:func:`disarm_runs`):
a fire for an ended run then finds no row and does nothing, as does a replayed fire (the
fire deletes its row).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from triggers.base import BaseTrigger, shard_of
from triggers.temporal import DateTimeTrigger

from .driver.db import Tx

DEADLINE = "deadline"
TIMEOUT = "timeout"
LATE = "late"

# (run_id, kind, task_id or "", due at in epoch seconds)
Wait = tuple[str, str, str, float]


def waits_of(run: Mapping[str, Any], now: float, *, times: bool, timeout: bool) -> list[Wait]:
    """The waits to arm for ``run`` (its dag_run columns): with ``times``, its deadline (if
    not noticed yet) and its late waits whose moment is still ahead; with ``timeout``, its
    dagrun_timeout from ``now`` (it starts RUNNING). A moment already past when the run is
    created (a backfill, a run started late by hand) is not announced: nothing could have
    made that run end in time."""
    run_id = run["run_id"]
    out: list[Wait] = []
    if times:
        deadline = run["deadline_at"]
        if deadline is not None and not run["deadline_missed_at"] and deadline > now:
            out.append((run_id, DEADLINE, "", float(deadline)))
        for task_id, due in sorted(json.loads(run["late_at"] or "{}").items()):
            if due > now:
                out.append((run_id, LATE, task_id, float(due)))
    if timeout and run["timeout_s"]:
        out.append((run_id, TIMEOUT, "", now + float(run["timeout_s"])))
    return out


async def arm(tx: Tx, waits: Sequence[Wait], now: float) -> None:
    """Insert ``waits`` (a wait that exists already is kept: ON CONFLICT DO NOTHING)."""
    if not waits:
        return
    moments: dict[float, int] = {}
    rows = []
    for run_id, kind, task_id, due in waits:
        if due not in moments:
            moment = DateTimeTrigger(moment=datetime.fromtimestamp(due, UTC))
            moments[due] = await insert_trigger(tx, moment, now, None)
        rows.append(
            {
                "run_id": run_id,
                "kind": kind,
                "task_id": task_id,
                "trigger_id": moments[due],
                "due_at": due,
                "now": now,
            }
        )
    await tx.executemany("insert_run_wait", rows)


async def disarm_runs(tx: Tx, run_ids: Iterable[str]) -> None:
    """Forget these runs' waits (they ended); their trigger rows go with the orphan sweep,
    and the triggerers drop them at their next full reload (a fire meanwhile finds none)."""
    ids = sorted(set(run_ids))
    if ids:
        await tx.execute("delete_run_waits_of", run_ids=ids)


async def insert_trigger(tx: Tx, trigger: BaseTrigger, now: float, not_before: float | None) -> int:
    """A trigger row for a wait without a task (a start wait, a run wait)."""
    classpath, kwargs = trigger.serialize()
    poke_hash = trigger.poke_hash()
    row = await tx.fetchone(
        "insert_trigger",
        classpath=classpath,
        kwargs=json.dumps(kwargs, sort_keys=True),
        poke_hash=poke_hash,
        shard=shard_of(poke_hash),
        now=now,
        description=trigger.describe(),
        not_before=not_before,
    )
    assert row is not None
    return int(row["id"])
