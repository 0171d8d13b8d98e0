"""Pools and queues in the store: setting and listing them, the workers' queue registry,
and refusing a DAG that names one that does not exist (rules: :mod:`executor.pools`).

Mixed into :class:`executor.store.Store`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..driver.db import Row, Tx
from ..errors import DagError
from ..pools import DEFAULT, PoolError, PoolUse, check_name, check_slots, held_back, unknown
from .part import Part
from .runs import RunShape

# Registry rows of workers gone longer than this are deleted by the next worker to start.


@dataclass(frozen=True, slots=True)
class QueueUse:
    name: str
    declared: bool  # default, or added with `slotless queues add`
    workers: int  # live workers serving it
    slots: int  # their slots (a worker serving two queues counts in both)
    ready: int  # tasks ready to run in it


async def check_known(tx: Tx, tasks: Iterable[Any], what: str) -> None:
    """Raise :class:`DagError` naming every pool and queue of ``tasks`` (each with
    ``task_id``, ``pool``, ``queue``) that is not in the store. ``what`` names the DAG."""
    pools: dict[str, list[str]] = defaultdict(list)
    queues: dict[str, list[str]] = defaultdict(list)
    for t in tasks:
        if t.pool != DEFAULT:
            pools[t.pool].append(t.task_id)
        if t.queue != DEFAULT:
            queues[t.queue].append(t.task_id)
    problems = []
    if pools:
        known = [r["name"] for r in await tx.fetch("pools_named", names=sorted(pools))]
        problems.append(
            unknown("pool", pools, known, "create it with slotless pools set NAME SLOTS")
        )
    if queues:
        known = [r["name"] for r in await tx.fetch("queues_named", names=sorted(queues))]
        problems.append(unknown("queue", queues, known, "declare it with slotless queues add NAME"))
    found = [p for p in problems if p]
    if found:
        raise DagError(f"{what}: {'; '.join(found)}")


async def _dags_naming(tx: Tx, kind: str, name: str) -> list[str]:
    """The catalogued DAGs some task of which names pool or queue (``kind``) ``name``."""
    pattern = "%" + json.dumps(name) + "%"
    users = []
    for r in await tx.fetch("dags_naming", pattern=pattern):
        tasks = RunShape.from_json(r["dag_id"], r["shape"]).tasks
        if any(getattr(t, kind) == name for t in tasks):
            users.append(str(r["dag_id"]))
    return users


# The statements a delete runs, by kind (named whole, so that each can be found by name).
_DELETE_QUERIES = {
    "pool": ("pools_named", "pool_unfinished", "pool_delete"),
    "queue": ("queues_named", "queue_unfinished", "queue_delete"),
}


class Pools(Part):
    """Pools and queues: their slots, who serves them, what they hold back."""

    # -- pools ---------------------------------------------------------------------------

    async def set_pool(self, name: str, slots: int | str) -> int:
        """Create pool ``name`` with ``slots`` slots, or resize it (tasks already RUNNING
        keep running; no new one starts while the pool is over its new size)."""
        check_name("pool", name)
        size = check_slots(slots)
        if name == DEFAULT:
            raise PoolError("the default pool is unlimited and cannot be sized")
        async with self.db.write() as tx:
            await tx.execute("pool_set", name=name, slots=size, now=self.clock())
        return size

    async def delete_pool(self, name: str, *, force: bool = False) -> None:
        """Delete a pool no unfinished task names (refused otherwise, naming how many) and
        no catalogued DAG names (refused otherwise, naming them, unless ``force``)."""
        await self._delete_named("pool", name, force=force)

    async def _delete_named(self, kind: str, name: str, *, force: bool = False) -> None:
        """Delete pool or queue ``name``, refused while an unfinished task names it, or a
        catalogued DAG does (its next run, its next parse, would be refused for want of it)
        unless ``force``."""
        check_name(kind, name)
        if name == DEFAULT:
            raise PoolError(f"the default {kind} cannot be deleted")
        named, unfinished, delete = _DELETE_QUERIES[kind]
        async with self.db.write() as tx:
            if not await tx.fetch(named, names=[name]):
                raise PoolError(f"no {kind} {name!r}")
            row = await tx.fetchone(unfinished, name=name)
            if row and row["n"]:
                raise PoolError(
                    f"{kind} {name!r} is named by {row['n']} unfinished task(s); "
                    "let them end (or cancel their runs) first"
                )
            users = [] if force else await _dags_naming(tx, kind, name)
            if users:
                shown = ", ".join(users[:10]) + (
                    f" and {len(users) - 10} more" if len(users) > 10 else ""
                )
                raise PoolError(
                    f"{kind} {name!r} is named by catalogued DAG(s) {shown}: their runs would "
                    f"be refused without it; change them first, or --force"
                )
            await tx.execute(delete, name=name)

    async def pools(self) -> list[PoolUse]:
        """``default`` (unlimited) and every stored pool: slots, slots in use, tasks ready."""
        async with self.db.read() as tx:
            return await read_pools(tx, self.clock())

    # -- queues --------------------------------------------------------------------------

    async def add_queue(self, name: str) -> bool:
        """Declare queue ``name``; False when it was already declared."""
        check_name("queue", name)
        if name == DEFAULT:
            raise PoolError("the default queue always exists")
        async with self.db.write() as tx:
            had = await tx.fetch("queues_named", names=[name])
            await tx.execute("queue_add", name=name, now=self.clock())
        return not had

    async def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete a queue as :meth:`delete_pool` deletes a pool."""
        await self._delete_named("queue", name, force=force)

    async def queues(self) -> list[QueueUse]:
        """Every queue declared, served by a live worker or with tasks ready in it."""
        async with self.db.read() as tx:
            return await read_queues(tx, self.clock())

    async def check_queues(self, names: Sequence[str]) -> None:
        """Refuse a worker's ``--queues`` naming a queue nobody declared (a typo would
        leave its tasks waiting for ever), naming it."""
        wanted = sorted(set(names) - {DEFAULT})
        if not wanted:
            return
        async with self.db.read() as tx:
            known = {r["name"] for r in await tx.fetch("queues_named", names=wanted)}
        missing = [q for q in wanted if q not in known]
        if missing:
            raise PoolError(
                f"unknown queue(s) {', '.join(missing)}: declare with slotless queues add NAME"
            )

    # -- why ready tasks do not run ------------------------------------------------------

    async def held_back_tasks(self, limit: int, run_id: str | None = None) -> list[tuple[Row, str]]:
        """Ready tasks that a full or missing pool, or a queue nobody serves, holds back,
        each with the reason ("waiting for pool warehouse (4/4 used)"): at most ``limit``,
        or every one of ``run_id``'s."""
        now = self.clock()
        async with self.db.snapshot() as tx:
            pools = await read_pools(tx, now)
            queues = await read_queues(tx, now)
            return await read_held_back(tx, now, pools, queues, limit, run_id)


# -- the same reads inside a caller's transaction (a page reads everything in one) ----------


async def read_pools(tx: Tx, now: float) -> list[PoolUse]:
    """``default`` (unlimited) and every stored pool: slots, slots in use, tasks ready."""
    d = await tx.fetchone("ops_default_pool", now=now)
    rows = await tx.fetch("ops_pools", now=now)
    out = [PoolUse(DEFAULT, None, int(d["used"]) if d else 0, int(d["ready"]) if d else 0)]
    out += [PoolUse(r["name"], r["slots"], int(r["used"]), int(r["ready"])) for r in rows]
    return out


async def read_queues(tx: Tx, now: float) -> list[QueueUse]:
    """Every queue declared, served by a live worker or with tasks ready in it."""
    return [
        QueueUse(
            r["name"],
            r["name"] == DEFAULT or bool(r["declared"]),
            int(r["workers"]),
            int(r["slots"]),
            int(r["ready"]),
        )
        for r in await tx.fetch("ops_queues", now=now)
    ]


async def read_held_back(
    tx: Tx,
    now: float,
    pools: Sequence[PoolUse],
    queues: Sequence[QueueUse],
    limit: int,
    run_id: str | None = None,
) -> list[tuple[Row, str]]:
    """:meth:`Pools.held_back_tasks`, judged by ``pools`` and ``queues`` read in ``tx``."""
    by_name = {p.name: p for p in pools}
    served = {q.name for q in queues if q.workers}
    if run_id is None:
        rows = await tx.fetch("ops_held_back", now=now, n=limit)
    else:
        rows = await tx.fetch("ops_run_held_back", now=now, run_id=run_id)
    out = []
    for r in rows:
        why = held_back(r, by_name, served)
        if why is not None:
            out.append((r, why))
    return out
