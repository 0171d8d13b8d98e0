"""Where a task changes state: the one compare-and-set, and what follows from it.

:func:`transition` is the only code that writes ``task.state``. It moves a set of rows
from one expected state to a new one (rows no longer in the expected state are left
alone, so a replayed event or a racing process changes nothing the second time), logs
each change in ``task_event``, and, when rows reach a terminal state, settles their
consequences in the same transaction: run bookkeeping, children's readiness counters,
trigger rules, mapped-task expansion and aggregation.

:func:`transition_run` is the same for a run's state; a run that ends starts the oldest
QUEUED run of its DAG that fits under that run's ``max_active`` (executor/store/runs.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from . import carried, notifications, runwaits
from .carried import Carried
from .driver.db import Row, Tx
from .mapping import MapSpec, decode, items_of
from .mapping import expansion_problem as expansion_problem  # the worker's checks use it
from .notifications import after_run, after_transition
from .rows import MovedTask, TaskRow
from .rules import (
    LEAF_QUIET,
    Counts,
    Decision,
    TriggerRule,
    aggregate,
    decide,
    decides_run,
    has_children,
)
from .runpolicy import OnTaskFailure
from .states import RUN_TERMINAL, TERMINAL, RunState, State, check_transition

Message = str | Mapping[int, str]


async def transition(
    tx: Tx,
    ids: Sequence[int],
    expected: State,
    new: State,
    *,
    now: float,
    message: Message,
    ready_at: float | None = None,
    owner: str | None = None,
    expect_owner: str | None = None,
    attempt_delta: int = 0,
    carry: Carried | None = None,
) -> list[MovedTask]:
    """Move ``ids`` from ``expected`` to ``new``, writing ``carry`` (executor/carried.py) in
    the same statement; returns the rows that moved (a row no longer in ``expected``, or
    not ``expect_owner``'s, stays put)."""
    changed = await _cas(
        tx,
        ids,
        expected,
        new,
        now=now,
        message=message,
        ready_at=ready_at,
        owner=owner,
        expect_owner=expect_owner,
        attempt_delta=attempt_delta,
        carry=carry,
    )
    if changed and new in TERMINAL:
        await _settle(tx, [(row, new) for row in changed], now)
    return changed


async def transition_run(
    tx: Tx, run_id: str, expected: RunState, new: RunState, *, now: float, why: str | None = None
) -> bool:
    """Move a run from ``expected`` to ``new`` (compare-and-set); whether it moved. ``why``
    is kept on the run (``state_reason``: a pause, a fail_fast, a cancel, a timeout).

    The run's time waits follow its state (executor/runwaits.py): an ended run's are
    dropped; a run that starts RUNNING arms its dagrun_timeout, and one reopened after it
    ended also its deadline and late waits still ahead."""
    check_transition(expected, new)
    ended = now if new in RUN_TERMINAL else None
    moved = await tx.fetchone(
        "cas_run", new=new.value, ended_at=ended, run_id=run_id, expected=expected.value
    )
    if moved is None:
        return False
    if moved["hooks"]:
        await after_run(tx, run_id, new.value, moved["hooks"], now)  # on_run_* callbacks
    # A reason is kept until the run moves on: reopened or resumed, it says why (or nothing).
    if why is not None or (new is RunState.RUNNING and expected is not RunState.QUEUED):
        await tx.execute("set_run_reason", reason=why, run_id=run_id)
    timed = moved["deadline_at"] is not None or moved["timeout_s"] or moved["late_at"]
    if timed and new in RUN_TERMINAL:
        await runwaits.disarm_runs(tx, [run_id])
    elif timed and new is RunState.RUNNING and expected is not RunState.PAUSED:
        reopened = expected in RUN_TERMINAL  # its deadline and late waits were dropped
        await runwaits.arm(tx, runwaits.waits_of(moved, now, times=reopened, timeout=True), now)
    return True


async def retry_or_fail(
    tx: Tx,
    row_id: int,
    expected: State,
    *,
    attempt: int,
    max_attempts: int,
    now: float,
    why: str,
    delay: float | None = None,
    expect_owner: str | None = None,
    queued_since: float | None = None,
) -> list[MovedTask]:
    """A failed attempt: RETRYING (claimable after ``delay``) while attempts are left, else
    FAILED. Task errors, lost workers and broken triggers all end up here.

    ``queued_since`` (a lost worker's attempt, not the task's fault: its run's creation):
    claimable at once and ordered as if ready since then, so it goes back to the head of
    its run's queue instead of behind everything that became runnable since (claims are
    first come, first served by ``ready_at``)."""
    if attempt < max_attempts:
        suffix = "; will retry" if delay is None else f"; retrying in {delay:.1f} s"
        ready_at = now + (delay or 0.0)
        if queued_since is not None:
            ready_at = min(ready_at, queued_since)
        return await transition(
            tx, [row_id], expected, State.RETRYING, now=now, message=why + suffix,
            ready_at=ready_at, attempt_delta=1, expect_owner=expect_owner,
        )  # fmt: skip
    return await transition(
        tx, [row_id], expected, State.FAILED, now=now, message=why, expect_owner=expect_owner
    )


async def _cas(
    tx: Tx,
    ids: Sequence[int],
    expected: State,
    new: State,
    *,
    now: float,
    message: Message,
    ready_at: float | None = None,
    owner: str | None = None,
    expect_owner: str | None = None,
    attempt_delta: int = 0,
    carry: Carried | None = None,
) -> list[MovedTask]:
    check_transition(expected, new)
    if not ids:
        return []
    many = isinstance(message, Mapping)
    rows = await tx.fetch(
        "cas",
        new=new.value,
        ready_at=ready_at,
        owner=owner,
        heartbeat_at=now if owner else None,
        attempt_delta=attempt_delta,
        now=now,
        terminal=1 if new in TERMINAL else 0,
        expected=expected.value,
        ids=list(ids),
        expect_owner=expect_owner,
        message=None if many else message,
        messages=json.dumps(message) if many else None,
        **carried.params(carry, new),
    )
    changed = MovedTask.all(rows)
    if changed:
        if not rows[0]["logged"]:  # SQLite: the statement returned each row's message
            await tx.executemany(
                "insert_event",
                [
                    {
                        "task_row": r["id"],
                        "ts": now,
                        "kind": "transition",
                        "from_state": expected.value,
                        "to_state": new.value,
                        "attempt": r["attempt"],
                        "message": r["message"],
                    }
                    for r in rows
                ],
            )
        # on_failure / on_retry / ... : a callback row per event, in this transaction.
        await after_transition(tx, changed, new.value, message, now)
    return changed


async def evaluate(tx: Tx, rows: Sequence[TaskRow], now: float) -> None:
    """Apply trigger rules to rows whose counters changed (or to a new run's tasks)."""
    ended = await _decide(tx, rows, now)
    if ended:
        await _settle(tx, ended, now)


async def _settle(tx: Tx, ended: list[tuple[MovedTask, State]], now: float) -> None:
    # A worklist, not recursion: a skip can cascade down a chain of any length.
    while ended:
        ended = await _settle_batch(tx, ended, now)


async def _settle_batch(
    tx: Tx, ended: list[tuple[MovedTask, State]], now: float
) -> list[tuple[MovedTask, State]]:
    follow: list[tuple[MovedTask, State]] = []

    # 1. Run bookkeeping: a run ends when its last unmapped task does. Lock order: the run's
    # row here, before any child's counters (3.), in every completion of the run, so two
    # completions queue on it instead of deadlocking (tests/e2e/test_database_restarts.py).
    per_run: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    failed: dict[str, MovedTask] = {}  # run -> a task of it that FAILED (its policy acts)
    for row, state in ended:
        if state is State.FAILED and row.is_leaf != LEAF_QUIET:  # a quiet teardown: no
            failed.setdefault(row.run_id, row)
        if row.map_index < 0:
            acc = per_run[row.run_id]
            acc[0] += 1
            # A leaf's failure fails the run; a teardown's only if it says so, and the
            # tasks before a quiet teardown count as leaves (rules.leaf_kinds).
            if decides_run(row.is_leaf) and state in (State.FAILED, State.UPSTREAM_FAILED):
                acc[1] += 1
    freed: set[str] = set()  # DAGs a run of which ended: a queued run may start
    runs: dict[str, Row] = {}
    for run_id, (done, leaves_failed) in per_run.items():
        left = await tx.fetchone(
            "run_tasks_done", done=done, leaves_failed=leaves_failed, run_id=run_id
        )
        if left is not None:
            runs[run_id] = left
    # The run's failure policy, at a failed task of a RUNNING run (fail_fast's own stops,
    # a cancel's, come after the run left RUNNING: nothing again).
    paused: set[str] = {r for r, left in runs.items() if left["state"] == RunState.PAUSED}
    for run_id, row in failed.items():
        info = runs.get(run_id) or await tx.fetchone("run_policy", run_id=run_id)
        if info is None or info["state"] != RunState.RUNNING:
            continue
        policy = info["on_task_failure"]
        if policy == OnTaskFailure.FAIL_FAST:
            why = f"fail_fast: {_named(row)} failed"
            follow.extend(await _stop_run(tx, run_id, RunState.RUNNING, RunState.FAILED,
                                          why=why, now=now))  # fmt: skip
            freed.add(info["dag_id"])
        elif policy == OnTaskFailure.PAUSE:
            await _pause(tx, run_id, row, now)
            paused.add(run_id)
    for run_id, left in runs.items():
        if left["tasks_unfinished"] <= 0:
            ended_as = RunState.FAILED if left["leaves_failed"] else RunState.SUCCESS
            if await transition_run(tx, run_id, RunState.RUNNING, ended_as, now=now):
                freed.add(left["dag_id"])
    for dag_id in sorted(freed):
        follow.extend(await _start_queued(tx, dag_id, now))

    # 2. Mapped instances report to their template, summed per template.
    per_template: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for row, state in ended:
        if row.map_index >= 0:
            acc = per_template[(row.run_id, row.task_id)]
            acc[0] += 1
            acc[1:] = [a + b for a, b in zip(acc[1:], _state_flags(state).values(), strict=True)]
    for (run_id, task_id), (done, *flags) in per_template.items():
        found = await tx.fetchone(
            "bump_template",
            done=done,
            **dict(zip(_FLAGS, flags, strict=True)),
            run_id=run_id,
            task_id=task_id,
        )
        if found is None:
            continue
        tpl = TaskRow.of(found)
        if tpl.state != State.RUNNING or tpl.n_done < tpl.n_parents:
            continue
        final = State(aggregate(_counts(tpl)))
        summary = _describe_counts(_counts(tpl), "instances")
        for moved in await _cas(
            tx,
            [tpl.id],
            State.RUNNING,
            final,
            now=now,
            message=f"all {tpl.n_parents} instances ended: {summary}",
        ):
            follow.append((moved, final))

    # 2b. An instance of a mapped group's member reports to the same index's instances of
    # its children in the group (per_file.load[3] waits for per_file.extract[3]).
    for row, state in ended:
        if row.map_index < 0 or not row.expand_from or not row.expand_from.startswith("{"):
            continue
        before = decode(row.expand_from).before
        if not before:
            continue
        bumped = await tx.fetch(
            "bump_instances", **_state_flags(state), run_id=row.run_id,
            map_index=row.map_index, task_ids=list(before),
        )  # fmt: skip
        if row.run_id not in paused:  # a paused run decides them when it resumes
            follow.extend(await _decide(tx, TaskRow.all(bumped), now))

    # 3. Unmapped tasks report to their children, whose trigger rules then decide: one
    # statement per run and way of ending, each child bumped once by all its parents in
    # the batch, and decided on the sum. A leaf has no edge to follow (no statement).
    # A PAUSED run starts nothing: its endings are counted when it resumes (resume_run).
    parents: dict[tuple[str, State], list[str]] = defaultdict(list)
    for row, state in ended:
        if row.map_index < 0 and has_children(row.is_leaf) and row.run_id not in paused:
            parents[(row.run_id, state)].append(row.task_id)
    for (run_id, state), task_ids in parents.items():
        children = await tx.fetch(
            "bump_children", **_state_flags(state), run_id=run_id, parents=task_ids
        )
        follow.extend(await _decide(tx, TaskRow.all(children), now))
    return follow


def _named(row: MovedTask) -> str:
    return row.task_id if row.map_index < 0 else f"{row.task_id}[{row.map_index}]"


async def stop_run(
    tx: Tx, run_id: str, expected: RunState, new: RunState, *, why: str, now: float
) -> list[MovedTask]:
    """End a run ``new`` (CANCELLED by an operator or its dagrun_timeout, FAILED by
    fail_fast) and stop what it has not ended: waits and pending work SKIPPED (each wait
    released to the triggerers, which drop it within a second), a running attempt FAILED
    (its worker's heartbeat finds it taken back and stops it where it can; its report is
    discarded). Returns the tasks it moved; their consequences are settled."""
    ended = await _stop_run(tx, run_id, expected, new, why=why, now=now)
    await _settle(tx, ended, now)
    return [row for row, _ in ended]


async def _stop_run(
    tx: Tx, run_id: str, expected: RunState, new: RunState, *, why: str, now: float
) -> list[tuple[MovedTask, State]]:
    if not await transition_run(tx, run_id, expected, new, now=now, why=why):
        return []
    # Locked on PostgreSQL: a claim racing this is waited for, then stopped as RUNNING.
    rows = await tx.fetch("unfinished_tasks_locked", run_id=run_id)
    moves: dict[tuple[State, State], list[int]] = defaultdict(list)
    for r in rows:
        old = State(r["state"])
        # A running attempt FAILED; the rest (waits, pending work, and a mapped task's
        # template, which runs no attempt of its own) SKIPPED.
        attempt = old is State.RUNNING and not (r["map_index"] < 0 and r["expand_from"])
        moves[(old, State.FAILED if attempt else State.SKIPPED)].append(r["id"])
    ended: list[tuple[MovedTask, State]] = []
    trigger_of = {r["id"]: r["trigger_id"] for r in rows}
    # Each a compare-and-set: a row that ended meanwhile keeps how it ended. The skips
    # first: settled in this order, a failed attempt does not fail its children upstream.
    for (old, to), ids in sorted(moves.items(), key=lambda m: m[0][1] is State.FAILED):
        moved = await _cas(tx, ids, old, to, now=now, message=why)
        ended += [(m, to) for m in moved]
        if old is State.DEFERRED:
            await release_waits(tx, [(m.id, trigger_of[m.id]) for m in moved], now)
    return ended


async def release_waits(tx: Tx, waits: Sequence[tuple[int, int | None]], now: float) -> None:
    """Tell the triggerers that these waits ended ((task row, trigger id) pairs), so they
    drop them within a second instead of at their next full reload."""
    rows = [{"task_row": i, "trigger_id": t, "now": now} for i, t in waits if t is not None]
    await tx.executemany("release_waits", rows)


async def _pause(tx: Tx, run_id: str, row: MovedTask, now: float) -> None:
    """on_task_failure="pause": the run stops starting tasks and waits for a person. What
    runs, retries or waits goes on to its end; the endings are counted at resume."""
    why = f"paused: {_named(row)} failed (on_task_failure=pause); resume or clear it"
    if await transition_run(tx, run_id, RunState.RUNNING, RunState.PAUSED, now=now, why=why):
        await tx.execute("hold_ready", run_id=run_id)
        # Told once per pause: the compare-and-set above moved it once.
        await notifications.record(
            tx, notifications.RUN_PAUSED, run_id=run_id, now=now, task_row=row.id,
            task_id=row.task_id, attempt=row.attempt, message=why,
        )  # fmt: skip


async def resume_run(tx: Tx, run_id: str, now: float, *, why: str) -> bool:
    """A PAUSED run goes on: RUNNING again, its waiting tasks counted anew from their
    parents' states and decided by their rules; if nothing is left, it ends as its tasks
    did. Whether it was paused (a compare-and-set: two resumes resume once)."""
    if not await transition_run(tx, run_id, RunState.PAUSED, RunState.RUNNING, now=now, why=why):
        return False
    held = TaskRow.all(await tx.fetch("held_tasks", run_id=run_id))
    # An instance's rule is its template's; a mapped group's instance has its own, over its
    # parents in the group: decided anew like a template.
    instances = [r.id for r in held if r.map_index >= 0 and not _waits_in_group(r)]
    if instances:
        await tx.execute("mark_ready", now=now, ids=instances)
    waiting = [r.id for r in held if r.map_index < 0]
    if waiting:
        await tx.execute("recount_parents", ids=waiting)
    # A group's instance kept counting its parents while the run was paused (they have no
    # edge to recount from): its counters stand.
    waiting += [r.id for r in held if _waits_in_group(r)]
    if waiting:
        await evaluate(tx, TaskRow.all(await tx.fetch("tasks_by_id", ids=waiting)), now)
    await end_if_done(tx, run_id, now)
    return True


async def end_if_done(tx: Tx, run_id: str, now: float) -> None:
    """End a RUNNING run none of whose tasks is left (as its last task would have)."""
    await tx.execute("recount_run", run_id=run_id)
    left = await tx.fetchone("run_info", run_id=run_id)
    if left is None or left["state"] != RunState.RUNNING or left["tasks_unfinished"] > 0:
        return
    ended_as = RunState.FAILED if left["leaves_failed"] else RunState.SUCCESS
    if await transition_run(tx, run_id, RunState.RUNNING, ended_as, now=now):
        await start_queued(tx, left["dag_id"], now)


async def start_queued(tx: Tx, dag_id: str, now: float) -> None:
    """Start ``dag_id``'s queued runs that fit (a run of it ended, or was cancelled)."""
    ended = await _start_queued(tx, dag_id, now)
    if ended:
        await _settle(tx, ended, now)


async def _start_queued(tx: Tx, dag_id: str, now: float) -> list[tuple[MovedTask, State]]:
    """Start the oldest QUEUED runs of ``dag_id`` while they fit under their limit."""
    await tx.fetch("lock_dags_runs", dag_ids=[dag_id])
    ended: list[tuple[MovedTask, State]] = []
    while (nxt := await tx.fetchone("next_queued_run", dag_id=dag_id)) is not None:
        if nxt["running"] >= nxt["max_active"]:
            break
        if not await transition_run(tx, nxt["run_id"], RunState.QUEUED, RunState.RUNNING, now=now):
            break  # cannot happen under the lock; never loop on it
        tasks = TaskRow.all(await tx.fetch("run_tasks", run_id=nxt["run_id"]))
        ended.extend(await _decide(tx, tasks, now))
    return ended


async def _decide(tx: Tx, rows: Sequence[TaskRow], now: float) -> list[tuple[MovedTask, State]]:
    ready: list[int] = []
    ended: list[tuple[MovedTask, State]] = []
    for row in rows:
        if row.state != State.PENDING or row.ready_at is not None:
            continue  # already decided: running, ended, or queued
        counts = _counts(row)
        if row.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS and counts.all_done:
            counts = await _with_setups(tx, row, counts)
        decision = decide(row.trigger_rule, counts)
        if decision is Decision.WAIT:
            continue
        if decision is Decision.RUN:
            if row.expand_from and row.map_index < 0:
                ended.extend(await _expand(tx, row, now))
            else:
                if _waits_in_group(row):
                    await _give_group_inputs(tx, row)
                ready.append(row.id)
            continue
        new = State(decision.value)
        why = f"trigger rule {row.trigger_rule}: {_describe_counts(counts, 'parents')}"
        ended.extend(
            (moved, new)
            for moved in await _cas(tx, [row.id], State.PENDING, new, now=now, message=why)
        )
    if ready:
        await tx.execute("mark_ready", now=now, ids=ready)
    return ended


async def _with_setups(tx: Tx, row: TaskRow, counts: Counts) -> Counts:
    """A teardown's counts with how its setups ended: read once, when all its parents
    have ended (the counters do not tell a setup parent from another)."""
    states = [r["state"] for r in await tx.fetch("setup_parents", run_id=row.run_id,
                                                    task_id=row.task_id)]  # fmt: skip
    return dataclasses.replace(
        counts,
        setups=len(states),
        setups_succeeded=sum(s == State.SUCCESS for s in states),
        setups_skipped=sum(s == State.SKIPPED for s in states),
    )


async def _expand(tx: Tx, tpl: TaskRow, now: float) -> list[tuple[MovedTask, State]]:
    """Create one instance per item of what the template maps over (executor/mapping.py),
    in this transaction. Inserting an instance that exists inserts nothing: expanding again
    (after a takeover, a retry of the transaction) creates none twice."""
    assert tpl.expand_from is not None
    spec = decode(tpl.expand_from)
    lists: dict[str, Any] = {}
    for name, source in spec.over:
        if source.task is None:
            lists[name] = list(source.values or ())
            continue
        src = await tx.fetchone("task_result", run_id=tpl.run_id, task_id=source.task)
        if src is None or src["state"] != State.SUCCESS:
            return await _end_template(
                tx, tpl, State.SKIPPED, now,
                f"nothing to map over: {source.task} ended {src and src['state']}",
            )  # fmt: skip
        if src["map_total"] is not None:  # mapping over a mapped task: its outputs in order
            lists[name] = [
                _loads(r["output"])
                for r in await tx.fetch("mapped_outputs", run_id=tpl.run_id, task_id=source.task)
            ]
        else:
            lists[name] = _loads(src["output"])
    items, problem = items_of(spec, lists, tpl.map_cap)
    what = spec.describe()
    if problem or items is None:
        return await _end_template(tx, tpl, State.FAILED, now, problem or "no items")
    if not items:
        verb = "returned" if len(spec.over) == 1 and spec.over[0][1].task else "is"
        why = f"{what} {verb} an empty list: no instance to run"
        return await _end_template(tx, tpl, State.SKIPPED, now, why)
    common = {
        "run_id": tpl.run_id,
        "task_id": tpl.task_id,
        "priority": tpl.priority,
        "max_attempts": tpl.max_attempts,
        "map_total": len(items),
        "expand_from": spec.instance_tag(),
        "now": now,
        "pool": tpl.pool,
        "pool_slots": tpl.pool_slots,
        "queue": tpl.queue,
    }
    if spec.group is None:
        await tx.executemany(
            "insert_instance",
            [{**common, "map_index": i, "item": json.dumps(item)} for i, item in enumerate(items)],
        )
    else:
        # The group's item, wrapped: its parents' outputs are added when it becomes ready.
        after = len(spec.after)
        await tx.executemany(
            "insert_group_instance",
            [
                {
                    **common,
                    "map_index": i,
                    "item": json.dumps({"item": item}),
                    "trigger_rule": spec.rule or tpl.trigger_rule,
                    "n_parents": after,
                    "ready_at": None if after else now,
                }
                for i, item in enumerate(items)
            ],
        )
    await tx.execute("set_expanded", n=len(items), id=tpl.id)
    await _cas(
        tx,
        [tpl.id],
        State.PENDING,
        State.RUNNING,
        now=now,
        message=f"expanded over {what} into {len(items)} instances",
    )
    if spec.group is None or not spec.after:
        return []
    # Expanding anew while a parent in the group kept its instances (a clear of only the
    # group's failed tasks): theirs that ended will not report again, so they are counted.
    parents = list(spec.after)
    if await tx.fetchone("group_parents_ended", run_id=tpl.run_id, after=parents) is None:
        return []
    counted = await tx.fetch(
        "recount_group_instances", after=parents, run_id=tpl.run_id, task_id=tpl.task_id
    )
    return await _decide(tx, TaskRow.all(counted), now)


def _waits_in_group(row: TaskRow) -> bool:
    """Whether ``row`` is an instance of a mapped group's member with parents in the group."""
    return (
        row.map_index >= 0
        and row.expand_from is not None
        and row.expand_from.startswith("{")
        and bool(decode(row.expand_from).after)
    )


async def _give_group_inputs(tx: Tx, row: TaskRow) -> None:
    """Add the outputs of its parents' instances of the same index to a mapped group's
    instance as it becomes ready: its ``ctx.inputs`` (executor/dag.py shows them)."""
    assert row.expand_from is not None
    spec: MapSpec = decode(row.expand_from)
    outs = await tx.fetch(
        "instance_outputs", run_id=row.run_id, map_index=row.map_index, task_ids=list(spec.after)
    )
    stored = _loads(row.item)
    stored = stored if isinstance(stored, dict) else {"item": stored}
    stored["inputs"] = {r["task_id"]: _loads(r["output"]) for r in outs}
    await tx.execute("set_item", item=json.dumps(stored), id=row.id)


async def _end_template(
    tx: Tx, tpl: TaskRow, new: State, now: float, why: str
) -> list[tuple[MovedTask, State]]:
    return [
        (moved, new) for moved in await _cas(tx, [tpl.id], State.PENDING, new, now=now, message=why)
    ]


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


_FLAGS = ("success", "failed", "upstream_failed", "skipped")


def _state_flags(state: State) -> dict[str, int]:
    """How a parent ended, as the 0/1 increments of its children's counters."""
    return {
        "success": int(state is State.SUCCESS),
        "failed": int(state is State.FAILED),
        "upstream_failed": int(state is State.UPSTREAM_FAILED),
        "skipped": int(state is State.SKIPPED),
    }


def _counts(row: TaskRow) -> Counts:
    return Counts(
        total=row.n_parents,
        done=row.n_done,
        success=row.n_success,
        failed=row.n_failed,
        upstream_failed=row.n_upstream_failed,
        skipped=row.n_skipped,
    )


def _describe_counts(c: Counts, noun: str) -> str:
    parts = [
        f"{n} {label}"
        for n, label in (
            (c.success, "succeeded"),
            (c.failed, "failed"),
            (c.upstream_failed, "upstream failed"),
            (c.skipped, "skipped"),
        )
        if n
    ]
    pending = c.total - c.done
    if pending:
        parts.append(f"{pending} not done")
    return f"of {c.total} {noun}, " + ", ".join(parts) if parts else f"{c.total} {noun}"
