"""Operating runs: clear, mark, cancel, retry. What an operator does to a run, as store
operations the CLI and the web page both call.

Each is one transaction of compare-and-sets through :func:`executor.statemachine.transition`
(the operator's transitions are listed in :data:`executor.states.ALLOWED`), each moved row
leaving a ``task_event`` line that says who did it and why. A worker or a triggerer racing
an operation finds its row no longer in the state it expected and changes nothing: a late
report of a cleared or cancelled attempt is discarded (its owner token no longer matches).

* **clear**: the tasks go back to PENDING with fresh attempts (their attempt count starts
  again at 1; the log keeps the earlier attempts above the "cleared" line), their outputs
  and waits forgotten; a mapped task loses its instances and expands again from its
  upstream's output when it runs; the counters of the cleared tasks and of their children
  are counted again from their parents' states, so trigger rules decide again; an ended
  run goes back to RUNNING, and one that a stop ended (a cancel, a timeout, fail_fast) has
  what the stop ended cleared too, so its end follows its tasks, not the stop. A RUNNING
  task is refused unless ``force``.
* **mark**: a task's outcome set by hand (SUCCESS with an output, FAILED or SKIPPED); its
  children proceed as if it had ended so. An ended task is cleared first.
* **cancel**: the run ends CANCELLED; what has not ended is SKIPPED (a wait ends; its
  trigger row is dropped by the triggerer's sweep) and a RUNNING attempt FAILED (its
  result, when it comes, is discarded); the DAG's next queued run may start.
* **retry**: clear every FAILED and UPSTREAM_FAILED task of a run.
* **resume**: a run PAUSED by ``on_task_failure="pause"`` goes on, its failed tasks run
  again (or, without retrying them, their failures flow to their children). A clear or a
  mark on a paused run resumes it too. A cancel ends it CANCELLED.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo

from ..carried import Output
from ..driver.db import Row, Tx
from ..mapping import group_mates
from ..params import resolve
from ..rows import MovedTask, TaskRow
from ..runnames import RunType
from ..statemachine import (
    evaluate,
    release_waits,
    resume_run,
    start_queued,
    stop_run,
    transition,
    transition_run,
)
from ..states import RUN_TERMINAL, TERMINAL, RunState, State
from .backfills import BATCH, Backfilled, backfill_runs
from .part import Part
from .pools import check_known
from .runs import NewRun, RunShape, StartedRun, free_tokens, insert_run, manual_run_key, new_run_id
from .starts import StartSpec
from .values import forget_instance_values, forget_values, with_setups

if TYPE_CHECKING:
    from ..dag import DAG
    from ..schedules import Interval

Outcome = Literal["success", "failed", "skipped"]
_OUTCOME = {"success": State.SUCCESS, "failed": State.FAILED, "skipped": State.SKIPPED}
_FAILED = (State.FAILED.value, State.UPSTREAM_FAILED.value)
_ENDED = frozenset(s.value for s in TERMINAL)


class ControlError(ValueError):
    """An operation refused, with why (nothing was changed)."""


@dataclass(frozen=True, slots=True)
class Done:
    """What an operation did: the run, its state after, the task ids it changed."""

    run_id: str
    run_state: str
    tasks: list[str]


class Runs(Part):
    """Starting runs and an operator's control of them: clear, mark, cancel, resume."""

    async def create_run(
        self,
        dag: DAG,
        logical_date: date,
        *,
        run_key: str | None = None,
        conf: Mapping[str, Any] | None = None,
        dag_file: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """Insert a run with all its tasks and edges; the roots become claimable at once.

        Idempotent per ``(dag.dag_id, run_key)``: when a run with that key exists, nothing
        is created and its run_id is returned (:meth:`start_run` also says which happened).
        """
        return (
            await self.start_run(
                dag, logical_date, run_key=run_key, conf=conf, dag_file=dag_file, run_id=run_id
            )
        ).run_id

    async def start_run(
        self,
        dag: DAG,
        logical_date: date,
        *,
        run_key: str | None = None,
        conf: Mapping[str, Any] | None = None,
        dag_file: str | None = None,
        run_id: str | None = None,
        interval: Interval | None = None,
        max_active: int | None = None,
        run_type: RunType | str = RunType.MANUAL,
    ) -> StartedRun:
        """:meth:`create_run`, saying whether the run was created or already existed.

        ``run_key`` defaults to a manual run's key (:func:`manual_run_key`: the logical date
        and a random part, so that two manual runs of one date are two runs); a schedule
        passes :func:`scheduled_run_key`. ``conf`` is checked against ``dag.params`` first
        (:class:`executor.params.BadConf`, nothing stored) and stored with the run.
        ``interval`` is the run's data interval; with ``max_active`` the run is QUEUED while
        its DAG has that many runs going (``slotless trigger`` and ``backfill`` pass the
        DAG's ``max_active_runs``; the Python API sets no limit unless asked).
        ``run_type`` says how it started (:class:`~executor.runnames.RunType`): a run asked
        for here is a person's, ``manual``, unless the caller says otherwise.
        """
        kind = RunType(run_type)  # a type that is not one: ValueError, nothing stored
        dag.validate()
        resolve(dag.params, conf, dag.dag_id)
        asked = NewRun(
            logical_date,
            run_key or "",
            interval=interval,
            conf=conf,
            dag_file=dag_file,
            max_active=max_active,
            run_id=run_id,
            run_type=kind,
            zone=ZoneInfo(dag.timezone),
        )
        shape = RunShape.of(dag)
        async with self.db.write() as tx:
            # Unknown pools and queues are refused here, before any row (naming them).
            await check_known(tx, shape.tasks, f"DAG {dag.dag_id!r}")
            while True:
                # A manual run's key and id share a random part, drawn until both are free:
                # a drawn key that is taken is another run's, never this one's to return.
                [token] = await free_tokens(tx, [(dag.dag_id, logical_date)])
                new = replace(
                    asked,
                    run_key=run_key or manual_run_key(logical_date, token),
                    run_id=run_id or new_run_id(dag.dag_id, logical_date, token),
                )
                started = await insert_run(tx, shape, new, self.clock())
                if started.created or run_key is not None:
                    return started

    async def backfill(
        self,
        spec: StartSpec,
        intervals: Sequence[Interval],
        *,
        max_active: int,
        rerun_failed: bool = False,
    ) -> list[Backfilled]:
        """A run of ``spec``'s stored shape for each interval, keyed as its schedule keys it:
        :func:`~executor.store.backfills.backfill_runs`, :data:`BATCH` intervals per
        transaction (a rerun of the whole backfill finds what an interrupted one made)."""
        done: list[Backfilled] = []
        for i in range(0, len(intervals), BATCH):
            async with self.db.write() as tx:
                done += await backfill_runs(
                    tx,
                    spec,
                    intervals[i : i + BATCH],
                    max_active=max_active,
                    rerun_failed=rerun_failed,
                    now=self.clock(),
                )
        return done

    async def clear(
        self,
        run_id: str,
        task_ids: Sequence[str] = (),
        *,
        downstream: bool = False,
        upstream: bool = False,
        failed_only: bool = False,
        force: bool = False,
        who: str = "operator",
        reason: str = "",
    ) -> Done:
        """Clear ``task_ids`` (all tasks of the run if none) of ``run_id``; see the module."""
        async with self.db.write() as tx:
            now = self.clock()
            graph = await _Graph.read(tx, run_id)
            picked = graph.select(task_ids, downstream=downstream, upstream=upstream)
            if failed_only:
                picked = [t for t in picked if graph.tasks[t].state in _FAILED]
            # Their setups and those setups' teardowns come back with them (Airflow 3's).
            picked = graph.order(
                await with_setups(tx, run_id, picked, graph.parents, graph.children)
            )
            why = _why("cleared", who, reason)
            cleared = await _clear(tx, graph, picked, force=force, why=why, now=now)
            return Done(run_id, await _run_state(tx, run_id), cleared)

    async def retry(self, run_id: str, *, who: str = "operator", reason: str = "") -> Done:
        """Clear every FAILED and UPSTREAM_FAILED task of ``run_id``."""
        return await self.clear(run_id, failed_only=True, who=who, reason=reason or "retry")

    async def mark(
        self,
        run_id: str,
        task_id: str,
        outcome: Outcome,
        *,
        output: Any = None,
        downstream: bool = False,
        who: str = "operator",
        reason: str = "",
    ) -> Done:
        """Set ``task_id``'s outcome (and its downstream's, with ``downstream``)."""
        if outcome not in _OUTCOME:
            raise ControlError(f"unknown outcome {outcome!r}: success, failed or skipped")
        if output is not None and outcome != "success":
            raise ControlError("an output is given only with success")
        try:
            output_json = None if output is None else json.dumps(output)
        except (TypeError, ValueError) as exc:
            raise ControlError(f"the output is not JSON: {exc}") from None
        new = _OUTCOME[outcome]
        async with self.db.write() as tx:
            now = self.clock()
            graph = await _Graph.read(tx, run_id)
            picked = graph.select([task_id], downstream=downstream, upstream=False)
            why = _why(f"marked {new.value}", who, reason)
            changed: list[str] = []
            for t in picked:  # parents first: a child's rule sees its parent marked
                row = graph.tasks[t]
                if row.state == new.value:
                    continue
                if row.state == State.RUNNING.value:
                    raise ControlError(
                        f"task {t!r} is RUNNING: wait for its attempt, or clear it with --force"
                    )
                if row.state in _ENDED:
                    # Cleared first, so its children count it again, as marked; left
                    # undecided, or its rule would end it again (its parent failed) or
                    # expand it (a mapped task) before the mark.
                    changed += await _clear(tx, graph, [t], force=False, why=why, now=now,
                                            undecided=[t])  # fmt: skip
                    row = (await _Graph.read(tx, run_id)).tasks[t]
                await _drop_instances(tx, run_id, [t])
                carry = Output(output_json) if output_json and t == task_id else None
                moved = await transition(
                    tx, [row.id], State(row.state), new, now=now, message=why, carry=carry
                )
                if not moved:  # cannot happen in this transaction; never claim it did
                    raise ControlError(f"task {t!r} changed meanwhile: nothing was marked")
                graph = await _Graph.read(tx, run_id)  # what the transition settled
            # The downstream proceeds: tasks that ended UPSTREAM_FAILED (they never ran) are
            # cleared, so their rules decide again from what was marked.
            after = graph.select([task_id], downstream=True, upstream=False)
            stuck = [t for t in after if graph.tasks[t].state == State.UPSTREAM_FAILED.value]
            changed += await _clear(tx, graph, stuck, force=False, why=why, now=now)
            await resume_run(tx, run_id, now, why=why)  # a paused run goes on; else nothing
            return Done(run_id, await _run_state(tx, run_id), graph.order({*picked, *changed}))

    async def cancel(self, run_id: str, *, who: str = "operator", reason: str = "") -> Done:
        """End ``run_id`` CANCELLED; see the module. Again on a cancelled run: nothing to
        do; a run that ended otherwise is refused."""
        async with self.db.write() as tx:
            now = self.clock()
            run = await tx.fetchone("run_info", run_id=run_id)
            if run is None:
                raise ControlError(f"no run {run_id!r}")
            state = RunState(run["state"])
            if state is RunState.CANCELLED:  # again: nothing more to do
                return Done(run_id, state.value, [])
            if state in RUN_TERMINAL:
                raise ControlError(f"run {run_id} has ended {state.value}: nothing to cancel")
            moved = await cancel_run(tx, run, _why("cancelled", who, reason), now)
            return Done(run_id, RunState.CANCELLED.value, sorted({m.task_id for m in moved}))

    async def resume(
        self, run_id: str, *, retry_failed: bool = True, who: str = "operator", reason: str = ""
    ) -> Done:
        """Resume a run PAUSED by its failure policy: its FAILED tasks run again (cleared,
        fresh attempts) unless ``retry_failed`` is false, in which case the failures stand
        and flow to their children as under ``continue``. Refused for a run not PAUSED."""
        async with self.db.write() as tx:
            now = self.clock()
            graph = await _Graph.read(tx, run_id)
            state = graph.run["state"]
            if state != RunState.PAUSED.value:
                raise ControlError(f"run {run_id} is {state}, not PAUSED: nothing to resume")
            why = _why("resumed", who, reason)
            picked: list[str] = []
            if retry_failed:
                picked = [t for t, r in graph.tasks.items() if r.state == State.FAILED.value]
                # UPSTREAM_FAILED too: under pause none is, unless marked by hand.
                picked = graph.select(picked, downstream=True, upstream=False)
                picked = [t for t in picked if graph.tasks[t].state in _FAILED]
                await _clear(tx, graph, picked, force=False, why=why, now=now)
            # Resumed by the clear, or here (nothing to clear: a mapped task's instance
            # failed, which is rerun by clearing the mapped task).
            await resume_run(tx, run_id, now, why=why)
            return Done(run_id, await _run_state(tx, run_id), picked)


@dataclass(slots=True)
class _Graph:
    run: Row
    tasks: dict[str, TaskRow]  # task_id -> its template row (map_index -1)
    children: dict[str, list[str]]
    parents: dict[str, list[str]]

    @classmethod
    async def read(cls, tx: Tx, run_id: str) -> _Graph:
        run = await tx.fetchone("run_info", run_id=run_id)
        if run is None:
            raise ControlError(f"no run {run_id!r}")
        tasks = {r.task_id: r for r in TaskRow.all(await tx.fetch("run_tasks", run_id=run_id))}
        children: dict[str, list[str]] = defaultdict(list)
        parents: dict[str, list[str]] = defaultdict(list)
        for e in await tx.fetch("run_edges", run_id=run_id):
            children[e["parent"]].append(e["child"])
            parents[e["child"]].append(e["parent"])
        return cls(run, tasks, children, parents)

    def select(self, task_ids: Iterable[str], *, downstream: bool, upstream: bool) -> list[str]:
        """The named tasks (all if none), with their descendants and/or ancestors, in the
        run's task order (parents before children)."""
        task_ids = list(task_ids)
        unknown = [t for t in task_ids if t not in self.tasks]
        if unknown:
            known = ", ".join(self.tasks)
            raise ControlError(f"run {self.run['run_id']} has no task {unknown[0]!r} ({known})")
        picked = set(task_ids or self.tasks)
        while True:
            for edges, wanted in ((self.children, downstream), (self.parents, upstream)):
                todo = list(picked) if wanted else []
                while todo:
                    for nxt in edges[todo.pop()]:
                        if nxt not in picked:
                            picked.add(nxt)
                            todo.append(nxt)
            # A mapped group's instances run as units: a task of it is cleared with the
            # whole group, which expands again as one (executor/mapping.py).
            grown = picked | group_mates(self.tasks.values(), picked)
            if grown == picked:
                return self.order(picked)
            picked = grown

    def order(self, picked: Collection[str]) -> list[str]:
        """``picked`` in the run's task order (parents before children)."""
        order = _topological(list(self.tasks), self.parents)
        return [t for t in order if t in picked]


async def _clear(
    tx: Tx,
    graph: _Graph,
    picked: Sequence[str],
    *,
    force: bool,
    why: str,
    now: float,
    undecided: Collection[str] = (),
) -> list[str]:
    """Clear ``picked``; the tasks cleared (in the run's order). A run that ended stopped (a
    cancel, a timeout, fail_fast) is reopened whole: what its stop ended is cleared too, as
    nothing of the stop holds in a run that goes on. ``undecided`` are left PENDING, not
    decided by their rules (a mark sets them next)."""
    run_id = graph.run["run_id"]
    if not picked:
        return []
    picked = graph.order(set(picked) | set(await _stopped(tx, graph.run)))
    instances = await tx.fetch("instances_of", run_id=run_id, task_ids=list(picked))
    running = [graph.tasks[t] for t in picked if graph.tasks[t].state == State.RUNNING.value
               and graph.tasks[t].expand_from is None]  # fmt: skip
    running_instances = [r for r in instances if r["state"] == State.RUNNING.value]
    if (running or running_instances) and not force:
        names = [r.task_id for r in running] + [
            f"{r['task_id']}[{r['map_index']}]" for r in running_instances
        ]
        raise ControlError(
            f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} RUNNING: clearing would "
            "race its attempt; wait for it, or --force to take the attempt back"
        )
    await _release(tx, [r["id"] for r in instances if r["state"] == "DEFERRED"], instances, now)
    await _drop_instances(tx, run_id, picked)
    by_state: dict[State, list[int]] = defaultdict(list)
    for t in picked:
        row = graph.tasks[t]
        if row.state != State.PENDING.value:
            by_state[State(row.state)].append(row.id)
    for old, ids in by_state.items():
        moved = await transition(tx, ids, old, State.PENDING, now=now, message=why)
        if old is State.DEFERRED:
            held = [{"id": r.id, "trigger_id": r.trigger_id} for r in graph.tasks.values()]
            await _release(tx, [m.id for m in moved], held, now)
    ids = [graph.tasks[t].id for t in picked]
    await tx.execute("reset_cleared", ids=ids, now=now)
    await forget_values(tx, ids)  # ctx.push's, with the outputs
    # Counted again from the parents' states: the cleared tasks and their children.
    affected = set(picked) | {c for t in picked for c in graph.children[t]}
    recount = [graph.tasks[t].id for t in affected]
    await tx.execute("recount_parents", ids=recount)
    await tx.execute("recount_run", run_id=run_id)
    state = RunState(graph.run["state"])
    if state in RUN_TERMINAL:
        await transition_run(tx, run_id, state, RunState.RUNNING, now=now)
    elif state is RunState.PAUSED and not undecided:  # a clear is how it goes on (or resume;
        # a mark resumes it once its tasks are set)
        await resume_run(tx, run_id, now, why=why)
    rows = TaskRow.all(await tx.fetch("tasks_by_id", ids=recount))
    await evaluate(tx, [r for r in rows if r.task_id not in undecided], now)
    return list(picked)


async def _stopped(tx: Tx, run: Row) -> list[str]:
    """The tasks of an ended ``run`` that its stop ended and that are still so."""
    if run["state"] not in (RunState.CANCELLED, RunState.FAILED) or not run["state_reason"]:
        return []
    rows = await tx.fetch(
        "stopped_tasks", run_id=run["run_id"], ended_at=run["ended_at"], reason=run["state_reason"]
    )
    return [r["task_id"] for r in rows]


async def cancel_run(tx: Tx, run: Row, why: str, now: float) -> list[MovedTask]:
    """End ``run`` (its dag_run row, not ended) CANCELLED in ``tx``, saying ``why`` (an
    operator's cancel, a dagrun_timeout): see the module. The tasks it stopped."""
    state = RunState(run["state"])
    moved = await stop_run(tx, run["run_id"], state, RunState.CANCELLED, why=why, now=now)
    await start_queued(tx, run["dag_id"], now)
    return moved


async def _release(tx: Tx, ids: Sequence[int], rows: Sequence[Row], now: float) -> None:
    """Tell the triggerers that these waits ended (their rows: id -> trigger_id)."""
    trigger_of = {r["id"]: r["trigger_id"] for r in rows}
    await release_waits(tx, [(i, trigger_of.get(i)) for i in ids], now)


async def _drop_instances(tx: Tx, run_id: str, task_ids: Sequence[str]) -> None:
    """Forget a mapped task's instances (their logs, their values): it expands again
    when it runs."""
    await forget_instance_values(tx, run_id, task_ids)
    await tx.execute("delete_instance_events", run_id=run_id, task_ids=list(task_ids))
    await tx.execute("delete_instances", run_id=run_id, task_ids=list(task_ids))


async def _run_state(tx: Tx, run_id: str) -> str:
    run = await tx.fetchone("run_info", run_id=run_id)
    assert run is not None
    return str(run["state"])


def _why(what: str, who: str, reason: str) -> str:
    return f"{what} by {who}" + (f": {reason}" if reason else "")


def _topological(order: list[str], parents: dict[str, list[str]]) -> list[str]:
    """``order`` (the run's rows in declaration order) with every parent before its
    children (Kahn's algorithm: iterative, so a chain of any length is fine)."""
    waiting = {t: len(parents[t]) for t in order}
    children: dict[str, list[str]] = defaultdict(list)
    for t in order:
        for p in parents[t]:
            children[p].append(t)
    ready = [t for t in order if waiting[t] == 0]
    out: list[str] = []
    while ready:
        t = ready.pop(0)
        out.append(t)
        for c in children[t]:
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    return out
