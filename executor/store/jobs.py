"""Every database operation the executor needs, backend-agnostic (cf. procrastinate's JobManager).

The worker, the CLI and the triggerer talk to the store only through :class:`Store`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date
from typing import TYPE_CHECKING, Any

from triggers.people import PersonWait
from triggers.registry import load_trigger

from ..carried import Defer, Defers, Outputs, Wait
from ..outcomes import (
    Deferral,
    Deferred,
    Failed,
    Outcome,
    Rescheduled,
    SensorTimedOut,
    Succeeded,
)
from ..params import resolve
from ..pools import DEFAULT, claim_rounds
from ..rows import MovedTask
from ..schedules import Interval
from ..statemachine import retry_or_fail, transition
from ..states import State
from .backfills import BATCH, Backfilled, backfill_runs
from .callbacks import CallbackOps, CallbackRow, claim_callbacks, reclaim_callbacks_of
from .catalogue import CatalogueOps
from .control import ControlOps
from .db import Database, Row, Tx
from .events import EventOps, look_back, register_waits
from .inspecting import InspectOps
from .people import PERSON_KEY, PeopleOps, request_made
from .pools import PoolOps, check_known
from .runs import NewRun, RunShape, StartedRun, insert_run, manual_run_key, new_run_id
from .starts import StartSpec

if TYPE_CHECKING:
    from ..dag import DAG

Clock = Callable[[], float]
DEFAULT_QUEUES = (DEFAULT,)


class Store(InspectOps, CatalogueOps, ControlOps, PoolOps, CallbackOps, EventOps, PeopleOps):
    def __init__(self, db: Database, clock: Clock = time.time) -> None:
        self.db = db
        self.clock = clock

    @property
    def url(self) -> str:
        return self.db.url

    async def close(self) -> None:
        await self.db.close()

    # -- runs ---------------------------------------------------------------------------

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
    ) -> StartedRun:
        """:meth:`create_run`, saying whether the run was created or already existed.

        ``run_key`` defaults to a manual run's key (:func:`manual_run_key`: the logical date
        and a random part, so that two manual runs of one date are two runs); a schedule
        passes :func:`scheduled_run_key`. ``conf`` is checked against ``dag.params`` first
        (:class:`executor.params.BadConf`, nothing stored) and stored with the run.
        ``interval`` is the run's data interval; with ``max_active`` the run is QUEUED while
        its DAG has that many runs going (``slotless trigger`` and ``backfill`` pass the
        DAG's ``max_active_runs``; the Python API sets no limit unless asked).
        """
        dag.validate()
        resolve(dag.params, conf, dag.dag_id)
        token = secrets.token_hex(3)
        new = NewRun(
            logical_date,
            run_key or manual_run_key(logical_date, token),
            interval=interval,
            conf=conf,
            dag_file=dag_file,
            max_active=max_active,
            run_id=run_id or new_run_id(dag.dag_id, logical_date, token),
        )
        shape = RunShape.of(dag)
        async with self.db.write() as tx:
            # Unknown pools and queues are refused here, before any row (naming them).
            await check_known(tx, shape.tasks, f"DAG {dag.dag_id!r}")
            return await insert_run(tx, shape, new, self.clock())

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

    async def runs_states(self, run_ids: Sequence[str]) -> dict[str, str]:
        """run_id -> state, for the runs that exist."""
        async with self.db.read() as tx:
            rows = await tx.fetch("runs_states", run_ids=list(run_ids))
        return {r["run_id"]: r["state"] for r in rows}

    async def run_info(self, run_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await tx.fetchone("run_info", run_id=run_id)

    async def run_counts(self, run_id: str) -> dict[str, int]:
        """Task instances by state (a mapped task counts as its instances)."""
        counts: dict[str, int] = defaultdict(int)
        async with self.db.read() as tx:
            for row in await tx.fetch("run_counts", run_id=run_id):
                counts[row["state"]] += row["n"]
        return dict(counts)

    async def list_runs(self, limit: int = 20) -> list[tuple[Row, dict[str, int]]]:
        async with self.db.read() as tx:
            runs = await tx.fetch("list_runs", n=limit)
            per_run: dict[str, dict[str, int]] = defaultdict(dict)
            for row in await tx.fetch("run_state_counts", n=limit):
                per_run[row["run_id"]][row["state"]] = row["n"]
        return [(run, per_run[run["run_id"]]) for run in runs]

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

    # -- workers -------------------------------------------------------------------------

    async def claim(
        self, owner: str, limit: int, queues: Sequence[str] = DEFAULT_QUEUES
    ) -> list[MovedTask]:
        """Take up to ``limit`` claimable tasks of ``queues`` for ``owner``, highest
        priority first, within their pools' slots."""
        return await self.exchange([], owner, limit, queues)

    async def complete(self, outcomes: Iterable[Outcome]) -> None:
        """Record a batch of finished attempts in one transaction."""
        await self.exchange(outcomes, "", 0)

    async def exchange(
        self,
        outcomes: Iterable[Outcome],
        owner: str,
        limit: int,
        queues: Sequence[str] = DEFAULT_QUEUES,
        callbacks: list[CallbackRow] | None = None,
    ) -> list[MovedTask]:
        """Record finished attempts and claim up to ``limit`` new tasks, in one transaction.

        A worker's steady state is one transaction per batch in each direction at once:
        what finished goes in, what is now runnable (often its children) comes out. Only
        tasks of ``queues`` are claimed, and only as many of a pool as its free slots
        (:func:`executor.pools.claim_rounds`: the check and the claim in this transaction).
        Given a ``callbacks`` list, the slots no task took claim due callback rows into it.
        """
        outcomes = list(outcomes)
        if not outcomes and limit <= 0:
            return []
        now = self.clock()

        async def body(tx: Tx) -> list[MovedTask]:
            if outcomes:
                await _record(tx, outcomes, now)
            if limit <= 0:
                return []
            claimed: list[MovedTask] = []
            async for batch in claim_rounds(tx, now, queues, limit):
                by_state: dict[str, list[int]] = defaultdict(list)
                for c in batch:
                    by_state[c.state].append(c.id)
                for state, ids in by_state.items():
                    claimed += await transition(
                        tx,
                        ids,
                        State(state),
                        State.RUNNING,
                        now=now,
                        message=f"claimed by {owner}",
                        owner=owner,
                    )
            for row in claimed:
                # A chain's next task: its parents' outputs read here, not in a second
                # transaction before it runs. A mapped instance's row does not say whether
                # it has parents besides its source: its attempt reads them.
                if row.n_parents and row.map_index < 0:
                    row.inputs = await _parent_outputs(tx, row)
            if callbacks is not None:
                callbacks.extend(await claim_callbacks(tx, owner, limit - len(claimed), now))
            return claimed

        # One call into SQLite's driver thread for the whole transaction (the worker's
        # hot path: a round trip per statement was most of a no-op task's cost).
        return await self.db.transact(body)

    async def parent_outputs(self, row: MovedTask) -> dict[str, Any]:
        """``ctx.inputs`` for a claimed task: each parent's output, a mapped one as a list."""
        async with self.db.read() as tx:
            return await _parent_outputs(tx, row)

    async def heartbeat(self, owner: str, ids: Sequence[int]) -> list[int]:
        """Heartbeat ``owner``'s rows; returns those it still holds (the others were taken
        back: reaped, cleared with force, cancelled)."""
        async with self.db.write() as tx:
            rows = await tx.fetch("heartbeat", now=self.clock(), ids=list(ids), owner=owner)
        return [r["id"] for r in rows]

    # -- liveness (issue 16): the workers that run, and taking back a dead one's attempts --

    async def worker_beat(
        self, worker_id: str, queues: Sequence[str], slots: int, ttl: float
    ) -> None:
        """List this worker, live for the next ``ttl`` seconds unless its liveness lock is
        released first, with the queues it serves (read by the others' liveness checks and
        by status, to find queues nobody serves)."""
        now = self.clock()
        async with self.db.write() as tx:
            await tx.execute("worker_beat", id=worker_id, now=now, expires_at=now + ttl)
            await tx.executemany(
                "worker_serves",
                [{"worker_id": worker_id, "queue": q, "slots": slots} for q in queues],
            )

    async def worker_leave(self, worker_id: str) -> None:
        async with self.db.write() as tx:
            await _forget_worker(tx, worker_id)

    async def other_workers(self, me: str) -> list[str]:
        async with self.db.read() as tx:
            return [r["id"] for r in await tx.fetch("other_workers", me=me)]

    async def reap_worker(self, worker_id: str, why: str) -> int:
        """Take back every attempt of a worker whose process is gone (its liveness lock was
        released), retrying or failing each per its policy, make the callbacks it was
        delivering claimable again, and forget the worker. Returns how many rows moved."""
        now = self.clock()
        taken = 0
        async with self.db.write() as tx:
            for row in await tx.fetch("running_of_worker", prefix=f"{worker_id}#"):
                moved = await retry_or_fail(
                    tx, row["id"], State.RUNNING, attempt=row["attempt"],
                    max_attempts=row["max_attempts"], now=now,
                    why=f"worker {row['owner']} lost: {why}", expect_owner=row["owner"],
                    queued_since=row["run_created_at"],
                )  # fmt: skip
                taken += len(moved)
            taken += await reclaim_callbacks_of(tx, worker_id, now, why)
            await _forget_worker(tx, worker_id)
        return taken

    async def reap(self, stale_after: float) -> int:
        """Take back tasks whose worker stopped heartbeating; retry or fail them per policy."""
        now = self.clock()
        taken = 0
        async with self.db.write() as tx:
            await tx.execute("forget_stale_workers", before=now - stale_after)
            await tx.execute("worker_queues_forget")
            for row in await tx.fetch("stale_running", before=now - stale_after):
                why = (
                    f"worker {row['owner']} lost: no heartbeat for "
                    f"{now - row['heartbeat_at']:.1f} s"
                )
                moved = await retry_or_fail(
                    tx, row["id"], State.RUNNING, attempt=row["attempt"],
                    max_attempts=row["max_attempts"], now=now, why=why,
                    expect_owner=row["owner"], queued_since=row["run_created_at"],
                )  # fmt: skip
                taken += len(moved)
        return taken


async def _parent_outputs(tx: Tx, row: MovedTask) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    rows = await tx.fetch(
        "parent_outputs",
        run_id=row.run_id,
        task_id=row.task_id,
        leave_out=row.expand_from if row.map_index >= 0 else None,
    )
    for r in rows:
        value = None if r["output"] is None else json.loads(r["output"])
        if r["map_index"] < 0:
            inputs[r["task_id"]] = [] if r["expand_from"] is not None else value
        else:
            inputs[r["task_id"]].append(value)
    return inputs


async def _forget_worker(tx: Tx, worker_id: str) -> None:
    await tx.execute("worker_leave", id=worker_id)
    await tx.execute("worker_queues_leave", id=worker_id)


async def _record(tx: Tx, outcomes: list[Outcome], now: float) -> None:
    # Event waits first: their names' locks come before any other this transaction takes.
    await register_waits(
        tx,
        (o.deferral.event for o in outcomes
         if isinstance(o, Deferred) and o.deferral.event is not None),
        now,
    )  # fmt: skip
    await _write_logs(tx, outcomes)
    successes: dict[str, list[Succeeded]] = defaultdict(list)
    for o in outcomes:
        if isinstance(o, Succeeded):
            successes[o.owner].append(o)
    for owner, group in successes.items():
        # Only the attempt's owner may record it (and route its branch): a stale report
        # moves nothing, so it skips nothing either.
        moved = await transition(
            tx,
            [o.row_id for o in group],
            State.RUNNING,
            State.SUCCESS,
            now=now,
            message="succeeded",
            expect_owner=owner,
            carry=Outputs({o.row_id: o.output_json for o in group}),
        )
        recorded = {row.id for row in moved}
        for o in group:
            if o.skip_children and o.row_id in recorded:
                await _skip_branches(tx, o, now)
    for o in outcomes:
        if isinstance(o, Failed):
            await retry_or_fail(
                tx, o.row_id, State.RUNNING, attempt=o.attempt, max_attempts=o.max_attempts,
                now=now, why=f"attempt {o.attempt} of {o.max_attempts} failed: {o.message}",
                delay=o.retry_delay, expect_owner=o.owner,
            )  # fmt: skip
        elif isinstance(o, Deferred) and not _plain(o):
            await _defer(tx, o, now)
        elif isinstance(o, Rescheduled):
            await transition(
                tx,
                [o.row_id],
                State.RUNNING,
                State.SENSING,
                now=now,
                message=o.message,
                ready_at=o.ready_at,
                expect_owner=o.owner,
                carry=Wait(o.wait_started_at, o.timeout_at),
            )
        elif isinstance(o, SensorTimedOut):
            new = State.SKIPPED if o.soft_fail else State.FAILED
            await transition(
                tx, [o.row_id], State.RUNNING, new, now=now, message=o.message, expect_owner=o.owner
            )
    plain = [o for o in outcomes if isinstance(o, Deferred) and _plain(o)]
    if plain:
        await _defer_many(tx, plain, now)


def _plain(o: Deferred) -> bool:
    """A wait a triggerer checks (not a person's, not an event's): deferred in a batch."""
    return o.deferral.event is None and not o.deferral.person


def _defer_message(d: Deferral) -> str:
    limit = (
        "" if d.timeout_at is None else f"; gives up after {d.timeout_at - d.wait_started_at:g} s"
    )
    return f"deferred: waiting for {d.description}{limit}"


async def _defer_many(tx: Tx, group: list[Deferred], now: float) -> None:
    """Plain deferrals of one exchange: their trigger rows in one statement, then one
    compare-and-set per claim owner (usually one), whatever the batch's size."""
    rows = [
        [d.classpath, d.kwargs_json, d.poke_hash, d.shard, d.description]
        for d in (o.deferral for o in group)
    ]
    found = await tx.fetch("insert_triggers", rows=json.dumps(rows), now=now)
    ids = sorted(r["id"] for r in found)  # handed out in the order of `rows`
    # The same report twice (a retried exchange): the last one's trigger row is kept.
    trigger_of = dict(zip(((o.owner, o.row_id) for o in group), ids, strict=True))
    by_owner: dict[str, dict[int, Deferred]] = defaultdict(dict)
    for o in group:
        by_owner[o.owner][o.row_id] = o
    kept: set[int] = set()
    for owner, reports in by_owner.items():
        deferrals = {i: Defer.of(o.deferral, trigger_of[(owner, i)]) for i, o in reports.items()}
        moved = await transition(
            tx,
            list(reports),
            State.RUNNING,
            State.DEFERRED,
            now=now,
            message={i: _defer_message(o.deferral) for i, o in reports.items()},
            expect_owner=owner,
            carry=Defers(deferrals),
        )
        kept |= {trigger_of[(owner, m.id)] for m in moved}
    # Stale reports (the attempt is no longer ours) and a report repeated: their rows go.
    if stale := [t for t in ids if t not in kept]:
        await tx.execute("delete_triggers", ids=stale)


async def _defer(tx: Tx, o: Deferred, now: float) -> None:
    d = o.deferral
    trigger_row = {
        "classpath": d.classpath,
        "kwargs": d.kwargs_json,
        "poke_hash": d.poke_hash,
        "shard": d.shard,
        "now": now,
        "description": d.description,
    }
    # A person's wait is settled by the answer (store/people.py) and an event wait by its
    # events (store/events.py): their rows carry a key and are never loaded by a triggerer.
    key = f"{PERSON_KEY}{o.row_id}" if d.person else d.event.key if d.event else None
    if key is not None:
        row = await tx.fetchone("insert_event_trigger", **trigger_row, event_key=key)
    else:
        row = await tx.fetchone("insert_trigger", **trigger_row, not_before=None)
    assert row is not None
    moved = await transition(
        tx,
        [o.row_id],
        State.RUNNING,
        State.DEFERRED,
        now=now,
        message=_defer_message(d),
        expect_owner=o.owner,
        carry=Defers({o.row_id: Defer.of(d, row["id"])}),
    )
    if not moved:  # a stale report: the attempt is no longer ours, nor is the trigger
        await tx.execute("delete_trigger", id=row["id"])
    elif d.event is not None:  # an event sent before the wait began counts (its lookback)
        await look_back(tx, o.row_id, row["id"], d.event, d.wait_started_at, now)
    elif d.person:  # tell the respondents (notify=), in this transaction
        wait = load_trigger(d.classpath, d.kwargs_json)
        if isinstance(wait, PersonWait):
            await request_made(tx, o.run_id, o.row_id, wait, now)


async def _write_logs(tx: Tx, outcomes: list[Outcome]) -> None:
    events = [
        {
            "task_row": o.row_id,
            "ts": ts,
            "kind": "log",
            "from_state": None,
            "to_state": None,
            "attempt": o.attempt,
            "message": msg,
        }
        for o in outcomes
        for ts, msg in o.logs
    ]
    events += [
        {
            "task_row": o.row_id,
            "ts": o.slot.ended_at if o.slot else 0.0,
            "kind": "error",
            "from_state": None,
            "to_state": None,
            "attempt": o.attempt,
            "message": o.traceback,
        }
        for o in outcomes
        if o.traceback
    ]
    if events:
        await tx.executemany("insert_event", events)
    slots = [
        {
            "worker_id": o.slot.worker_id,
            "slot": o.slot.slot,
            "task_row": o.row_id,
            "kind": o.slot.kind,
            "started_at": o.slot.started_at,
            "ended_at": o.slot.ended_at,
        }
        for o in outcomes
        if o.slot
    ]
    if slots:
        await tx.executemany("insert_slot_usage", slots)


async def _skip_branches(tx: Tx, o: Succeeded, now: float) -> None:
    rows = await tx.fetch("ids_by_task_id", run_id=o.run_id, task_ids=o.skip_children)
    await transition(
        tx,
        [r["id"] for r in rows],
        State.PENDING,
        State.SKIPPED,
        now=now,
        message="branch not taken",
    )
