"""Named values between tasks (``ctx.push`` / ``ctx.pull``), and what a clear brings back
with a task: its setups and their teardowns.

A value is written in the transaction that records its attempt's SUCCESS (recording.py:
:func:`write_values` for the rows that moved), so a failed attempt, a stale report or a
deferral leaves none; a clear deletes the values of the tasks it clears
(:func:`forget_values`, control.py), as it forgets their outputs. Queries:
schema/common/values.sql.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ..context import Published
from ..driver.db import Tx
from .part import Part


class Values(Part):
    """What ended tasks published, for the attempts that pull it (executor/pulling.py)."""

    async def published(self, run_id: str, task_ids: Sequence[str]) -> dict[str, Published]:
        async with self.db.read() as tx:
            return await read_published(tx, run_id, task_ids)


async def write_values(tx: Tx, by_row: Mapping[int, Mapping[str, str]]) -> None:
    """Store succeeded attempts' values (task row -> key -> JSON), in their SUCCESS's
    transaction: call it only for the rows that transition moved."""
    rows = [
        {"task_row": row, "key": key, "value": text}
        for row, values in by_row.items()
        for key, text in values.items()
    ]
    if rows:
        await tx.executemany("insert_task_values", rows)


async def forget_values(tx: Tx, ids: Sequence[int]) -> None:
    """Cleared rows lose their values (with their outputs)."""
    if ids:
        await tx.execute("delete_task_values", ids=list(ids))


async def forget_instance_values(tx: Tx, run_id: str, task_ids: Sequence[str]) -> None:
    """The values of a cleared mapped task's instances, before the instances go."""
    await tx.execute("delete_instance_values", run_id=run_id, task_ids=list(task_ids))


async def read_published(tx: Tx, run_id: str, task_ids: Sequence[str]) -> dict[str, Published]:
    """Each task's output and values; a mapped task's as lists in map-index order."""
    outputs: dict[str, dict[int, Any]] = {}
    values: dict[str, dict[str, dict[int, Any]]] = {}
    mapped: dict[str, int] = {}  # a mapped task -> its instances
    for r in await tx.fetch("published", run_id=run_id, task_ids=list(task_ids)):
        task_id, index = r["task_id"], r["map_index"]
        if index < 0 and r["expand_from"] is not None:
            mapped.setdefault(task_id, 0)  # the template: a mapped task, even with none
            continue
        if index >= 0:
            mapped[task_id] = max(mapped.get(task_id, 0), index + 1)
        if r["state"] == "SUCCESS" and r["output"] is not None:
            outputs.setdefault(task_id, {})[index] = json.loads(r["output"])
        if r["key"] is not None:
            values.setdefault(task_id, {}).setdefault(r["key"], {})[index] = json.loads(r["value"])
    out: dict[str, Published] = {}
    for task_id in task_ids:
        outs, vals = outputs.get(task_id, {}), values.get(task_id, {})
        if task_id in mapped:
            n = mapped[task_id]
            out[task_id] = Published(
                [outs.get(i) for i in range(n)],
                {k: [by.get(i) for i in range(n)] for k, by in vals.items()},
            )
        else:
            out[task_id] = Published(outs.get(-1), {k: by[-1] for k, by in vals.items()})
    return out


async def with_setups(
    tx: Tx,
    run_id: str,
    picked: Iterable[str],
    parents: Mapping[str, Collection[str]],
    children: Mapping[str, Collection[str]],
) -> set[str]:
    """``picked`` and what clearing them brings back, as in Airflow 3: each setup a
    picked task is in the scope of (an ancestor, or itself, one of whose teardowns is the
    task or below it), and that setup's teardowns, so that what is torn down is set up
    again, and what is set up again is torn down."""
    roles = {r["task_id"]: r["role"] for r in await tx.fetch("run_roles", run_id=run_id)}
    picked = set(picked)
    out = set(picked)
    for setup, role in roles.items():
        if role != "setup":
            continue
        teardowns = {c for c in children.get(setup, ()) if roles.get(c) == "teardown"}
        # Its scope: below it (or it) and above one of its teardowns (or one of them).
        scope = _reach([setup], children) & _reach(teardowns, parents)
        if picked & scope:
            out |= {setup} | teardowns
    return out


def _reach(start: Iterable[str], edges: Mapping[str, Collection[str]]) -> set[str]:
    """``start`` and every task reached from it along ``edges``."""
    seen = set(start)
    todo = list(seen)
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
