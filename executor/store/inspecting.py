"""Read-only views of the store for people: `slotless status` and `run`, the metrics, the web page.

The :class:`Views` part of the store. Nothing here writes; every statement is a named
query in ``schema/<backend>/queries.sql`` (the ``ops_*`` and ``progress_*`` sections).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from executor.rows import TaskRow
from executor.states import TERMINAL
from triggers.base import clip

from ..driver.db import Row, Tx
from ..pools import PoolUse
from .part import Part
from .pools import QueueUse, read_held_back, read_pools, read_queues
from .viewrows import (
    AttentionRow,
    BrokenFile,
    DagRow,
    DeferredRow,
    EventRow,
    InstanceRow,
    MappedRow,
    RetryingRow,
    RunRow,
    RunSquare,
    SensingRow,
    ShardLease,
    TriggererRow,
    TriggerRow,
    WaitingCount,
    WaitingRow,
)

# A mapped task's page lists at most this many instances (the counts cover them all).
INSTANCES_SHOWN = 500
# The DAGs page draws this many runs of each DAG, the newest (Airflow's grid shows 25).
RUNS_PER_DAG = 25
# `slotless run`'s live view lists at most this many waiting and retrying tasks (each).
PROGRESS_ROWS = 8


# Each web page renders one of these, read in ONE snapshot (``db.snapshot()``: every
# statement sees the same committed state), so that nothing on a page mixes two moments:
# a run's badge, its duration and its "cancel" button all come from the same row. Whether
# the page goes on refreshing (``live``) is decided here, from the same read.


@dataclass(slots=True)
class RunGraph:
    run: RunRow
    tasks: list[TaskRow]  # one row per task (a mapped task's template row)
    mapped: dict[str, dict[str, int]]  # mapped task -> its instances by state
    edges: list[tuple[str, str]]  # (parent, child)
    waits: dict[str, str] = field(default_factory=dict)  # DEFERRED task -> what it waits for
    now: float = 0.0  # the store's clock when it was read
    # Ready tasks a full pool or an unserved queue holds back, each with why.
    held: list[tuple[Row, str]] = field(default_factory=list)
    shape: str | None = None  # its DAG's catalogued shape (JSON): the graph's task groups

    @property
    def live(self) -> bool:
        return not self.run.finished


@dataclass(slots=True)
class TaskDetail:
    row: TaskRow
    now: float
    events: list[EventRow]
    trigger: TriggerRow | None = None  # while DEFERRED
    waiters: int = 0  # tasks waiting on the same check, this one included
    instances: list[InstanceRow] = field(default_factory=list)  # a mapped task's instances
    instance_counts: dict[str, int] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.row.state not in TERMINAL


@dataclass(slots=True)
class DagsPage:
    dags: list[DagRow]  # by dag_id
    runs: dict[str, list[RunSquare]]  # dag_id -> its newest runs, oldest first
    broken_files: list[BrokenFile]  # files whose last parse failed, with their error

    @property
    def live(self) -> bool:
        """A run of a catalogued DAG has not finished."""
        return any(not r.finished for runs in self.runs.values() for r in runs)


@dataclass(slots=True)
class StatusRows:
    """What ``slotless status`` and the web page's run list show, read in one snapshot
    (``slotless.status.collect`` types it)."""

    now: float
    waiting_counts: dict[str, WaitingCount]
    waiting: dict[str, list[WaitingRow]]  # by state, the longest wait first
    leases: list[ShardLease]
    triggerers: list[TriggererRow]
    runs_by_state: dict[str, int]
    runs: list[tuple[RunRow, dict[str, int]]]
    attention: list[AttentionRow]
    tasks_by_state: dict[str, int]
    pools: list[PoolUse]
    queues: list[QueueUse]
    held_back: list[tuple[Row, str]]


@dataclass(slots=True)
class RunProgress:
    """One run as `slotless run`'s live view shows it, read in one go."""

    run: RunRow
    now: float  # the store's clock when it was read
    counts: dict[str, int]  # task instances by state (a mapped task counts as its instances)
    mapped: list[MappedRow]  # mapped tasks' templates
    waits: list[DeferredRow | SensingRow]  # the longest wait first (at most n)
    retrying: list[RetryingRow]  # RETRYING tasks with their last failure (at most n)


_WAITING: dict[str, tuple[str, type[DeferredRow] | type[SensingRow] | type[RetryingRow]]] = {
    "DEFERRED": ("ops_deferred", DeferredRow),
    "SENSING": ("ops_sensing", SensingRow),
    "RETRYING": ("ops_retrying", RetryingRow),
}


class Views(Part):
    """What people and the triggerer read: nothing here writes."""

    async def run_states(self) -> dict[str, int]:
        """Every run by state."""
        async with self.db.read() as tx:
            return {r["state"]: r["n"] for r in await tx.fetch("ops_run_states")}

    async def live_task_states(self) -> dict[str, int]:
        """Task instances of unfinished runs by state."""
        async with self.db.read() as tx:
            return {r["state"]: r["n"] for r in await tx.fetch("ops_live_task_states")}

    async def waiting_summary(self, now: float) -> dict[str, WaitingCount]:
        """DEFERRED / SENSING / RETRYING: count, oldest start, largest timeout share used."""
        async with self.db.read() as tx:
            rows = WaitingCount.all(await tx.fetch("ops_waiting_summary", now=now))
        return {r.state: r for r in rows}

    async def retrying_since(self) -> float | None:
        """When the longest retry episode still going began (None: nothing retries)."""
        async with self.db.read() as tx:
            row = await tx.fetchone("ops_retrying_since")
        return None if row is None else row["since"]

    async def list_triggerers(self) -> list[TriggererRow]:
        """Live and recently seen triggerers, each with the number of shards it holds."""
        async with self.db.read() as tx:
            return TriggererRow.all(await tx.fetch("list_triggerers"))

    async def shard_leases(self) -> list[ShardLease]:
        async with self.db.read() as tx:
            return ShardLease.all(await tx.fetch("ops_shard_leases"))

    async def recent_runs(self, limit: int) -> list[tuple[RunRow, dict[str, int]]]:
        """The newest runs, each with its task instances by state."""
        async with self.db.snapshot() as tx:
            return await _recent_runs(tx, limit)

    async def status(self, limit: int, now: float) -> StatusRows:
        """Everything the run list shows, in one snapshot: at most ``limit`` runs, tasks
        per waiting state and held-back tasks."""
        async with self.db.snapshot() as tx:
            counts = {
                r.state: r for r in WaitingCount.all(await tx.fetch("ops_waiting_summary", now=now))
            }
            waiting: dict[str, list[WaitingRow]] = {}
            for state, (query, typed) in _WAITING.items():
                c = counts.get(state)
                waiting[state] = (
                    list(typed.all(await tx.fetch(query, n=limit))) if c and c.n else []
                )
            pools = await read_pools(tx, now)
            queues = await read_queues(tx, now)
            return StatusRows(
                now=now,
                waiting_counts=counts,
                waiting=waiting,
                leases=ShardLease.all(await tx.fetch("ops_shard_leases")),
                triggerers=TriggererRow.all(await tx.fetch("list_triggerers")),
                runs_by_state={r["state"]: r["n"] for r in await tx.fetch("ops_run_states")},
                runs=await _recent_runs(tx, limit),
                attention=AttentionRow.all(await tx.fetch("ops_runs_needing_attention", n=limit)),
                tasks_by_state={r["state"]: r["n"] for r in await tx.fetch("ops_live_task_states")},
                pools=pools,
                queues=queues,
                held_back=await read_held_back(tx, now, pools, queues, limit),
            )

    async def dags_page(self, runs_per_dag: int = RUNS_PER_DAG) -> DagsPage:
        """Every catalogued DAG with its newest runs, and the files whose parse failed."""
        async with self.db.snapshot() as tx:
            dags = DagRow.all(await tx.fetch("catalogue_dags"))
            runs: dict[str, list[RunSquare]] = defaultdict(list)
            for r in RunSquare.all(await tx.fetch("dags_page_runs", n=runs_per_dag)):
                runs[r.dag_id].append(r)
            broken = BrokenFile.all(await tx.fetch("catalogue_broken_files"))
        return DagsPage(dags, dict(runs), broken)

    async def run_graph(self, run_id: str) -> RunGraph | None:
        """A run, its tasks, edges and waits, and the ready tasks held back: one snapshot."""
        now = self.clock()
        async with self.db.snapshot() as tx:
            run = await tx.fetchone("run_info", run_id=run_id)
            if run is None:
                return None
            tasks = TaskRow.all(await tx.fetch("run_tasks", run_id=run_id))
            mapped: dict[str, dict[str, int]] = defaultdict(dict)
            for r in await tx.fetch("mapped_counts", run_id=run_id):
                mapped[r["task_id"]][r["state"]] = r["n"]
            edges = [
                (r["parent"], r["child"]) for r in await tx.fetch("ops_run_edges", run_id=run_id)
            ]
            waits = {
                r["task_id"] if r["map_index"] < 0 else f"{r['task_id']}[{r['map_index']}]": (
                    clip(r["description"] or r["classpath"])
                )
                for r in await tx.fetch("ops_run_waits", run_id=run_id)
            }
            pools = await read_pools(tx, now)
            queues = await read_queues(tx, now)
            held = await read_held_back(tx, now, pools, queues, 0, run_id)
            spec = await tx.fetchone("dag_start_specs", dag_ids=[run["dag_id"]])
        return RunGraph(
            RunRow.of(run), tasks, dict(mapped), edges, waits, now, held,
            None if spec is None else spec["shape"],
        )  # fmt: skip

    async def run_progress(self, run_id: str, n: int = PROGRESS_ROWS) -> RunProgress | None:
        """What `slotless run` shows while the run goes: reads of this run's rows only."""
        counts: dict[str, int] = defaultdict(int)
        async with self.db.read() as tx:
            run = await tx.fetchone("run_info", run_id=run_id)
            if run is None:
                return None
            for r in await tx.fetch("run_counts", run_id=run_id):
                counts[r["state"]] += r["n"]
            mapped = MappedRow.all(await tx.fetch("progress_mapped", run_id=run_id))
            waits = (
                await tx.fetch("progress_waits", run_id=run_id, n=n)
                if (counts.get("DEFERRED") or counts.get("SENSING"))
                else []
            )
            retrying = (
                RetryingRow.all(await tx.fetch("progress_retrying", run_id=run_id, n=n))
                if counts.get("RETRYING")
                else []
            )
        # progress_waits reads both kinds' columns in one query; each row keeps its own.
        typed: list[DeferredRow | SensingRow] = [
            DeferredRow.of(w) if w["state"] == "DEFERRED" else SensingRow.of(w) for w in waits
        ]
        return RunProgress(RunRow.of(run), self.clock(), dict(counts), mapped, typed, retrying)

    async def task_detail(
        self, run_id: str, task_id: str, map_index: int = -1
    ) -> TaskDetail | None:
        """A task, its log, its trigger, its instances and their counts: one snapshot."""
        now = self.clock()
        async with self.db.snapshot() as tx:
            found = await tx.fetchone(
                "task_row", run_id=run_id, task_id=task_id, map_index=map_index
            )
            if found is None:
                return None
            row = TaskRow.of(found)
            events = EventRow.all(await tx.fetch("task_events", task_row=row.id))
            detail = TaskDetail(row, now, events)
            if row.state == "DEFERRED" and row.trigger_id is not None:
                trigger = await tx.fetchone("ops_trigger", id=row.trigger_id)
                if trigger is not None:
                    detail.trigger = TriggerRow.of(trigger)
                    waiters = await tx.fetchone(
                        "ops_check_waiters",
                        poke_hash=detail.trigger.poke_hash,
                        shard=detail.trigger.shard,
                    )
                    detail.waiters = waiters["n"] if waiters else 0
            if map_index < 0 and row.map_total is not None:
                detail.instances = InstanceRow.all(
                    await tx.fetch(
                        "ops_task_instances", run_id=run_id, task_id=task_id, n=INSTANCES_SHOWN
                    )
                )
                for r in await tx.fetch("mapped_counts", run_id=run_id):
                    if r["task_id"] == task_id:
                        detail.instance_counts[r["state"]] = r["n"]
        return detail

    async def runs_states(self, run_ids: Sequence[str]) -> dict[str, str]:
        """run_id -> state, for the runs that exist."""
        async with self.db.read() as tx:
            rows = await tx.fetch("runs_states", run_ids=list(run_ids))
        return {r["run_id"]: r["state"] for r in rows}

    async def run_info(self, run_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await tx.fetchone("run_info", run_id=run_id)

    async def run_tasks(self, run_id: str) -> list[Row]:
        """A run's task rows as stored (a mapped task's template row), for people."""
        async with self.db.read() as tx:
            return await tx.fetch("run_tasks", run_id=run_id)

    async def mapped_counts(self, run_id: str) -> dict[str, dict[str, int]]:
        """For each mapped task of a run, its instances by state."""
        out: dict[str, dict[str, int]] = defaultdict(dict)
        async with self.db.read() as tx:
            for row in await tx.fetch("mapped_counts", run_id=run_id):
                out[row["task_id"]][row["state"]] = row["n"]
        return dict(out)

    async def failed_tasks(self, run_id: str, n: int, task_id: str = "") -> list[Row]:
        """At most ``n`` FAILED tasks and mapped instances of a run (of one task: ``task_id``),
        in row order, each with ``error``: the message that failed it."""
        async with self.db.read() as tx:
            return await tx.fetch("failed_tasks", run_id=run_id, task_id=task_id, n=n)

    async def task_log(self, run_id: str, task_id: str, map_index: int = -1) -> list[Row] | None:
        async with self.db.read() as tx:
            row = await tx.fetchone("task_row", run_id=run_id, task_id=task_id, map_index=map_index)
            if row is None:
                return None
            return await tx.fetch("task_events", task_row=row["id"])

    async def external_states(self, questions: Sequence[dict[str, Any]]) -> list[Row]:
        """Answer many cross-DAG questions in one query.

        Each question is ``{"dag_id", "logical_date", "task_id" (or None)}``; the answer rows
        carry ``q`` (the question's index), ``state`` (None if no such run) and ``run_id``.
        """
        payload = json.dumps([{**q, "q": i} for i, q in enumerate(questions)])
        async with self.db.read() as tx:
            return await tx.fetch("external_states", questions=payload)


async def _recent_runs(tx: Tx, limit: int) -> list[tuple[RunRow, dict[str, int]]]:
    runs = await tx.fetch("list_runs", n=limit)
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for r in await tx.fetch("ops_run_counts", n=limit):
        counts[r["run_id"]][r["state"]] = r["n"]
    return [(run, counts[run.run_id]) for run in RunRow.all(runs)]
