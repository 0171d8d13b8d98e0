"""Firing a run's time waits (executor/runwaits.py), in the triggerer's outbox
transaction: a deadline notifies, a dagrun_timeout cancels, an expected_by says "late".

The fire re-reads its waits (locked on PostgreSQL) and acts only on those that still
exist and point at the fired trigger, deleting them as it goes: a replayed fire, two
triggerers during a takeover, or a fire after the run ended (its waits were dropped)
does nothing. What is still true is checked too: a run that has ended is not late, a
sensor whose condition held (or that ended otherwise) is not late.

A notice is an event recorded in the same transaction (:func:`executor.notifications.record`,
``deadline_missed`` and ``late``, each with a key so that it is recorded once ever), and
delivered by a worker to the DAG's handlers: ``notify=`` URLs, callables.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from .. import notifications
from ..driver.db import Row, Tx
from ..runwaits import DEADLINE, LATE, TIMEOUT
from ..states import RUN_TERMINAL, TERMINAL
from .control import cancel_run


async def fire_run_waits(
    tx: Tx, waits: Mapping[int, int], now: float, *, due_only: bool = False
) -> int:
    """Fire run waits (run_wait id -> fired trigger id); returns how many acted.
    ``due_only``: leave those whose moment has not come (their trigger failed to load)."""
    armed = [
        w
        for w in await tx.fetch("armed_run_waits", ids=sorted(waits))
        if w["trigger_id"] == waits[w["id"]] and not (due_only and w["due_at"] > now)
    ]
    if not armed:
        return 0
    await tx.execute("delete_run_waits_by_id", ids=[w["id"] for w in armed])
    acted = 0
    for wait in armed:
        run = await tx.fetchone("run_info", run_id=wait["run_id"])
        if run is None or run["state"] in RUN_TERMINAL:
            continue  # ended meanwhile: nothing is late
        if wait["kind"] == DEADLINE:
            acted += await _deadline(tx, run, now)
        elif wait["kind"] == TIMEOUT:
            acted += await _timeout(tx, run, now)
        elif wait["kind"] == LATE:
            acted += await _late(tx, run, wait["task_id"], wait["due_at"], now)
    return acted


async def _deadline(tx: Tx, run: Row, now: float) -> int:
    await tx.execute("set_deadline_missed", run_id=run["run_id"], now=now)
    due = _clock(run["deadline_at"])
    text = f"run {run['run_id']} missed its deadline {due}: it is still {run['state']}"
    await notifications.record(
        tx, notifications.DEADLINE_MISSED, run_id=run["run_id"], now=now, message=text,
        context={"deadline": due}, key=f"deadline:{run['run_id']}",
    )  # fmt: skip
    return 1


async def _timeout(tx: Tx, run: Row, now: float) -> int:
    limit = _duration(run["timeout_s"])
    why = f"cancelled by dagrun_timeout: the run did not end within {limit}"
    await cancel_run(tx, run, why, now)
    return 1


async def _late(tx: Tx, run: Row, task_id: str, due: float, now: float) -> int:
    task = await tx.fetchone("task_row", run_id=run["run_id"], task_id=task_id, map_index=-1)
    if task is None or task["state"] in {s.value for s in TERMINAL}:
        return 0  # its condition held (SUCCESS), or it ended otherwise: not late
    text = (
        f"sensor {task_id} of run {run['run_id']} is late: its condition had not held by "
        f"{_clock(due)} (expected_by); it keeps waiting until its timeout"
    )
    await tx.execute(
        "insert_event",
        task_row=task["id"],
        ts=now,
        kind="late",
        from_state=None,
        to_state=None,
        attempt=task["attempt"],
        message=text,
    )
    await notifications.record(
        tx, notifications.LATE, run_id=run["run_id"], now=now, task_row=task["id"],
        task_id=task_id, attempt=task["attempt"], message=text,
        context={"expected_by": _clock(due)}, key=f"late:{task['id']}:{due}",
    )  # fmt: skip
    return 1


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _duration(seconds: float) -> str:
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    parts = [f"{h}h" if h else "", f"{m}m" if m else "", f"{sec}s" if sec or not s else ""]
    return "".join(parts) or f"{seconds:g}s"
