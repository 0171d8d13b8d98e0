"""Creating a run: a DAG's shape inserted as rows, at most once per run key, queued when
its DAG already has ``max_active_runs`` runs going.

Every way a run starts ends here: :meth:`Runs.start_run` (the Python API, ``slotless
run|trigger|backfill``) with a DAG it imported, and the triggerer firing a schedule or a
start condition with the shape the catalogue stored (:class:`RunShape` as JSON), so that
no service imports a DAG file to start a run.

A QUEUED run has all its rows, none of them claimable (trigger rules are not applied
yet). When a run ends, :func:`executor.statemachine` starts the oldest QUEUED run of its
DAG that fits under its limit, in the same transaction.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from ..driver.db import Tx
from ..mapping import decode
from ..notifications import run_mask, task_mask
from ..rows import TaskRow
from ..rules import Counts, Decision, Node, decide, leaf_kinds
from ..runnames import RunType, logical_time_text, midnight, offset_text, wall_text
from ..runpolicy import RunPolicy, anchor, late_json, moment
from ..runwaits import Wait, arm, waits_of
from ..schedules import Interval
from ..statemachine import evaluate, transition_run
from ..states import RunState

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
    # Pools and queues (executor/pools.py): shapes stored before these fields read as the defaults.
    pool: str = "default"
    pool_slots: int = 1
    queue: str = "default"
    hooks: int = 0  # which events write a callback row (executor.notifications.task_mask)
    expected_by: str | None = None  # a sensor's expected_by, HH:MM:SS (executor/runpolicy.py)
    # 'setup', 'teardown' or None, and whether a teardown's failure fails the run
    # (executor/rules.py: leaf_kinds); shapes stored before read as plain tasks.
    role: str | None = None
    fails_run: bool = False

    @property
    def node(self) -> Node:
        return Node(self.task_id, self.parents, self.role == "teardown" and not self.fails_run)


@dataclass(frozen=True, slots=True)
class GroupShape:
    """A task group (executor/dag.py): its full id, its own tasks (its subgroups' are
    theirs), and for a mapped group what it maps over (as people read it)."""

    group_id: str
    tasks: tuple[str, ...]
    over: str | None = None


@dataclass(frozen=True, slots=True)
class RunShape:
    """The rows a run of a DAG inserts: what run creation needs of a DAG, and no code.

    A task's ``parents`` are its edges in the DAG as declared; a member of a mapped group
    waits as a row for its group's parents outside it instead (:func:`row_parents`)."""

    dag_id: str
    tasks: tuple[TaskShape, ...]
    hooks: int = 0  # the run's own events with handlers (executor.notifications.run_mask)
    policy: RunPolicy = field(default_factory=RunPolicy)
    groups: tuple[GroupShape, ...] = ()  # for the page and `slotless status`

    @classmethod
    def of(cls, dag: DAG) -> RunShape:
        specs = dag.map_specs()
        return cls(
            dag.dag_id,
            tuple(
                TaskShape(
                    s.task_id,
                    tuple(s.parents),
                    # A mapped group's member starts (expands) with the group, when the
                    # group's parents succeeded; its own rule applies per instance.
                    "all_success" if (m := specs[s.task_id]) and m.group else s.trigger_rule.value,
                    s.priority,
                    None if m is None else m.encode(),
                    s.effective_map_cap(),
                    s.retries + 1,
                    s.pool,
                    s.pool_slots,
                    s.queue,
                    task_mask(s.hooks, dag.hooks),
                    s.sensor.expected_by if s.sensor is not None else None,
                    "setup" if s.setup else "teardown" if s.teardown else None,
                    s.on_failure_fail_run,
                )
                for s in dag.tasks.values()
            ),
            run_mask(dag.hooks),
            dag.policy,
            tuple(
                GroupShape(
                    g.group_id,
                    tuple(g.members),
                    None if g.over is None else g.over.describe(),
                )
                for g in dag.groups.values()
            ),
        )

    @property
    def has_times(self) -> bool:
        """Whether its runs have time waits: a deadline, a dagrun_timeout, an expected_by."""
        return (
            self.policy.deadline is not None
            or self.policy.dagrun_timeout is not None
            or any(t.expected_by for t in self.tasks)
        )

    def to_json(self) -> str:
        tasks = [[*_fields(t)] for t in self.tasks]
        # A list when the run has no hooks nor policy of its own: the form stored before.
        doc: Any = tasks
        if self.hooks or not self.policy.is_default or self.groups:
            doc = {"tasks": tasks, "hooks": self.hooks, "policy": self.policy.to_json()}
            if self.groups:
                doc["groups"] = [[g.group_id, g.tasks, g.over] for g in self.groups]
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, dag_id: str, text: str) -> RunShape:
        tasks, hooks, policy = shape_parts(text)
        return cls(dag_id, tasks, hooks, policy, shape_groups(text))


@functools.lru_cache(maxsize=1024)
def shape_groups(text: str) -> tuple[GroupShape, ...]:
    """A stored shape's task groups (none in shapes stored before groups existed)."""
    doc = json.loads(text)
    if isinstance(doc, list):
        return ()
    return tuple(GroupShape(g, tuple(tasks), over) for g, tasks, over in doc.get("groups", ()))


def row_parents(t: TaskShape) -> tuple[str, ...]:
    """The parents ``t``'s row waits for (its edges in the ``edge`` table): its own, or a
    mapped group member's group parents (executor/mapping.py: ``needs``)."""
    if t.expand_from is None or not t.expand_from.startswith("{"):
        return t.parents
    needs = decode(t.expand_from).needs
    return t.parents if needs is None else needs


@functools.lru_cache(maxsize=4096)
def shape_parts(text: str) -> tuple[tuple[TaskShape, ...], int, RunPolicy]:
    """A stored shape's tasks, run hooks and policy (many DAGs store the same text: parsed
    once)."""
    doc = json.loads(text)
    if isinstance(doc, list):
        return tuple(_task(*fields) for fields in doc), 0, RunPolicy()
    tasks = tuple(_task(*fields) for fields in doc["tasks"])
    return tasks, doc.get("hooks", 0), RunPolicy.from_json(doc.get("policy"))


def _fields(t: TaskShape) -> tuple[Any, ...]:
    out = (t.task_id, t.parents, t.trigger_rule, t.priority, t.expand_from, t.map_cap,
           t.max_attempts, t.pool, t.pool_slots, t.queue, t.hooks)  # fmt: skip
    if t.role is not None:  # the fields after hooks are written only when set
        return (*out, t.expected_by, t.role, t.fails_run)
    return out if t.expected_by is None else (*out, t.expected_by)


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
    run_type: RunType = RunType.MANUAL  # how it started (executor/runnames.py)
    # The DAG's clock, on which logical_date is a date: the interval's zone when it has
    # one; else this (None: the zone of the shape's policy, the DAG's timezone).
    zone: ZoneInfo | None = None

    def clock(self, shape: RunShape) -> ZoneInfo:
        if self.interval is not None:
            return self.interval.zone
        return self.zone or _policy_zone(shape.policy.timezone)

    def logical_time(self, shape: RunShape) -> datetime:
        """Its logical instant: the interval's start, else midnight of its logical date."""
        if self.interval is not None:
            return self.interval.start
        return midnight(self.logical_date, self.clock(shape))


@functools.lru_cache(maxsize=256)
def _policy_zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def scheduled_run_key(interval: Interval) -> str:
    """A schedule's run key: its interval's start in UTC (``2026-04-25T06:00:00Z``), so one
    run per interval ever, whoever fires it and however often."""
    return interval.start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def interval_run_id(dag_id: str, interval: Interval, suffix: str = "") -> str:
    """The run id of a schedule's (or a backfill's) run of ``interval``: the DAG and the
    interval's start on its clock, ``hourly_metrics:2026-11-26T06:00`` (UTC) or
    ``etl:2026-11-26T06:00+01:00`` (another zone: the offset keeps the two passes of a
    repeated hour apart), then ``suffix`` (a rerun's ``~rerun-N``). One interval, one id,
    as one interval has one run key: whoever creates it (under the DAG's lock,
    ``lock_dags_runs``) finds the other's run by its key."""
    return f"{dag_id}:{_id_tail(interval.start, interval.zone)}{suffix}"


@functools.lru_cache(maxsize=1024)
def _id_tail(start: datetime, zone: ZoneInfo) -> str:
    """Runs of one tick on one clock share it: 10,000 DAGs due together format it once.
    Keyed by the zone too: an Interval's equality leaves its zone out."""
    at = start.astimezone(zone)
    return wall_text(at, "T") + ("" if zone.key == "UTC" else offset_text(at))


@functools.lru_cache(maxsize=1024)
def interval_text(iv: Interval) -> tuple[str, str]:
    """An interval's bounds as stored (ISO 8601, UTC); runs of one tick share them."""
    return iv.start.isoformat(), iv.end.isoformat()


def manual_run_key(logical_date: date, token: str) -> str:
    """A manual run's default key: the date and a random part (``2026-04-25~manual-3fa9c1``),
    so that manual runs of one date are distinct and never take a schedule's key."""
    return f"{logical_date.isoformat()}~manual-{token}"


def new_run_id(dag_id: str, logical_date: date, token: str) -> str:
    return f"{dag_id}:{logical_date.isoformat()}:{token}"


def new_token() -> str:
    """The random part of a run's id (and of a manual run's key): six hex digits keep the
    id short to read and type. Among thousands of runs of one DAG and date two draws meet
    (one in 16.7 M per pair: 5,000 runs of one date meet with even odds), so a drawn name
    is always checked against the runs there before it is used (:func:`free_tokens`)."""
    return secrets.token_hex(3)


async def free_tokens(tx: Tx, wanted: Sequence[tuple[str, date]]) -> list[str]:
    """For each ``(dag_id, logical_date)``, a token whose :func:`new_run_id` no run in
    ``tx`` holds, nor another of the batch: a taken draw is drawn again (a run id is the
    runs' primary key, so inserting a taken one would fail the whole batch)."""
    tokens = [new_token() for _ in wanted]
    while True:
        ids = [new_run_id(d, day, t) for (d, day), t in zip(wanted, tokens, strict=True)]
        taken = {r["run_id"] for r in await tx.fetch("runs_by_id", ids=ids)} if ids else set()
        seen: set[str] = set()
        again = False
        for i, run_id in enumerate(ids):
            if run_id in taken or run_id in seen:
                tokens[i], again = new_token(), True
            seen.add(run_id)
        if not again:
            return tokens


async def insert_run(tx: Tx, shape: RunShape, new: NewRun, now: float) -> StartedRun:
    """Insert ``new`` as a run of ``shape`` in ``tx``; nothing when its key is taken.
    :func:`insert_runs` for one run."""
    [started] = await insert_runs(tx, [(shape, new)], now)
    return started


async def insert_runs(
    tx: Tx, requests: Sequence[tuple[RunShape, NewRun]], now: float
) -> list[StartedRun]:
    """Insert many runs in ``tx``, in a few statements whatever their number (a minute
    tick of 10,000 scheduled DAGs is one transaction); a run whose key is taken is not
    created, and the run holding the key is returned instead.

    With ``max_active``, a run is QUEUED if its DAG has that many RUNNING runs or any
    QUEUED one (first come, first started), counting the runs created before it in the
    batch. The DAGs' runs are locked for the check (on PostgreSQL an advisory lock per
    DAG, taken in dag_id order), so concurrent creators never overshoot.
    """
    states = [state.value for state in await _states(tx, requests)]
    unnamed = [(shape.dag_id, new.logical_date) for shape, new in requests if new.run_id is None]
    drawn = iter(await free_tokens(tx, unnamed))
    run_ids = [
        new.run_id or new_run_id(shape.dag_id, new.logical_date, next(drawn))
        for shape, new in requests
    ]
    # A schedule's run id is made of its interval (interval_run_id), so the run holding a
    # taken key may have the very id asked for: the ids there before are not inserted now.
    # Creators of a DAG's scheduled runs hold its lock (_states), so none commits between.
    given = [i for (_, new), i in zip(requests, run_ids, strict=True) if new.run_id is not None]
    before = {r["run_id"] for r in await tx.fetch("runs_by_id", ids=given)} if given else set()
    rows = []
    for (shape, new), state, run_id in zip(requests, states, run_ids, strict=True):
        start, end = (None, None) if new.interval is None else interval_text(new.interval)
        logical = start if start is not None else logical_time_text(new.logical_time(shape))
        rows.append(
            {
                **_policy_columns(shape, new),
                "run_id": run_id,
                "dag_id": shape.dag_id,
                "logical_date": new.logical_date.isoformat(),
                "state": state,
                "dag_file": new.dag_file,
                "now": now,
                "tasks": len(shape.tasks),
                "run_key": new.run_key,
                "conf": None if new.conf is None else json.dumps(dict(new.conf)),
                "data_interval_start": start,
                "data_interval_end": end,
                "start_event": None if new.start_event is None else json.dumps(new.start_event),
                "max_active": new.max_active,
                "hooks": shape.hooks,
                "logical_time": logical,
                "timezone": new.clock(shape).key,
                "run_type": new.run_type.value,
            }
        )
    await tx.executemany("insert_run", rows)
    # Which were inserted: the others' keys were taken (ON CONFLICT DO NOTHING). On
    # PostgreSQL an insert of a key being inserted concurrently waited for that commit.
    ours = {r["run_id"] for r in await tx.fetch("runs_by_id", ids=run_ids)} - before
    out: list[StartedRun] = []
    waits: list[Wait] = []
    tasks: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    to_expand: list[str] = []
    empty: list[str] = []
    for (shape, new), state, run_id, row in zip(requests, states, run_ids, rows, strict=True):
        if run_id not in ours:
            existing = await tx.fetchone("run_by_key", dag_id=shape.dag_id, run_key=new.run_key)
            assert existing is not None, f"run key {new.run_key!r} taken, yet no run has it"
            out.append(StartedRun(existing["run_id"], new.run_key, False, existing["state"]))
            continue
        out.append(StartedRun(run_id, new.run_key, True, state))
        if shape.has_times:
            going = state == RunState.RUNNING.value
            new_run = {**row, "deadline_missed_at": None}
            waits += waits_of(new_run, now, times=True, timeout=going)
        waits_for = {t.task_id: row_parents(t) for t in shape.tasks}
        kinds = _leaf_kinds(shape.tasks)
        going = state == RunState.RUNNING.value
        for t in shape.tasks:
            ready = going and _runs_at_once(t, len(waits_for[t.task_id]))
            if ready and t.expand_from:
                to_expand.append(run_id)  # expanding reads its upstream: the state machine's
                ready = False
            row = _task_row(run_id, t, kinds[t.task_id], ready, now)
            tasks.append({**row, "n_parents": len(waits_for[t.task_id])})
        edges += [
            {"run_id": run_id, "parent": parent, "child": t.task_id}
            for t in shape.tasks
            for parent in waits_for[t.task_id]
        ]
        if not shape.tasks:  # no task will ever end to finish it
            empty.append(run_id)
    await tx.executemany("insert_task", tasks)
    await tx.executemany("insert_edge", edges)
    await arm(tx, waits, now)
    for run_id in empty:
        await transition_run(tx, run_id, RunState.RUNNING, RunState.SUCCESS, now=now)
    if to_expand:
        await evaluate(tx, TaskRow.all(await tx.fetch("runs_tasks", ids=to_expand)), now)
    return out


def _policy_columns(shape: RunShape, new: NewRun) -> dict[str, Any]:
    """The run's copy of its DAG's policy, its times made moments (executor/runpolicy.py)."""
    policy = shape.policy
    deadline_at = None
    late: dict[str, float] = {}
    if shape.has_times:
        zone = ZoneInfo(policy.timezone)
        start = anchor(new.logical_date, None if new.interval is None else new.interval.end, zone)
        if policy.deadline is not None:
            deadline_at = moment(policy.deadline, start)
        late = {t.task_id: moment(t.expected_by, start) for t in shape.tasks if t.expected_by}
    return {
        "on_task_failure": policy.on_task_failure.value,
        "deadline_at": deadline_at,
        "timeout_s": policy.dagrun_timeout,
        "late_at": late_json(late),
    }


def _runs_at_once(t: TaskShape, parents: int) -> bool:
    """Whether a new run's trigger rules start this task at once (no parent has ended):
    decided here, as :func:`executor.statemachine.evaluate` would, so that inserting
    10,000 runs reads none of their rows back."""
    return _starts_at_once(t.trigger_rule, parents)


@functools.lru_cache(maxsize=64)
def _starts_at_once(rule: str, parents: int) -> bool:
    return decide(rule, Counts(total=parents)) is Decision.RUN


async def _states(tx: Tx, requests: Sequence[tuple[RunShape, NewRun]]) -> list[RunState]:
    """RUNNING or QUEUED for each request, per its DAG's runs going and its limit."""
    limited = sorted({shape.dag_id for shape, new in requests if new.max_active is not None})
    going: dict[str, list[int]] = {d: [0, 0] for d in limited}  # dag_id -> [running, queued]
    if limited:
        await tx.fetch("lock_dags_runs", dag_ids=limited)
        for r in await tx.fetch("dags_runs_going", dag_ids=limited):
            going[r["dag_id"]] = [r["running"], r["queued"]]
    states = []
    for shape, new in requests:
        state = RunState.RUNNING
        if new.max_active is not None and shape.tasks:
            counts = going[shape.dag_id]
            if counts[0] >= new.max_active or counts[1] > 0:
                state = RunState.QUEUED
            counts[0 if state is RunState.RUNNING else 1] += 1
        states.append(state)
    return states


@functools.lru_cache(maxsize=1024)
def _leaf_kinds(tasks: tuple[TaskShape, ...]) -> Mapping[str, int]:
    """Each task's is_leaf (executor/rules.py): the runs of one shape share it. Leaves
    as the rows see them: a mapped group's task is a parent of its children in the group
    per index, not as a row (:func:`row_parents`)."""
    return leaf_kinds(Node(t.task_id, row_parents(t), t.node.quiet) for t in tasks)


def _task_row(run_id: str, t: TaskShape, is_leaf: int, ready: bool, now: float) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "task_id": t.task_id,
        "trigger_rule": t.trigger_rule,
        "priority": t.priority,
        "is_leaf": is_leaf,
        "expand_from": t.expand_from,
        "map_cap": t.map_cap,
        "max_attempts": t.max_attempts,
        "n_parents": len(t.parents),
        "ready_at": now if ready else None,
        "now": now,
        "pool": t.pool,
        "pool_slots": t.pool_slots,
        "queue": t.queue,
        "hooks": t.hooks,
        "role": t.role,
    }
