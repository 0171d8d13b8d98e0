"""Recording what attempts did: each outcome a worker reports becomes, in the exchange's
transaction, a compare-and-set of its row (and the rows it carries along: trigger rows,
skipped branches, log lines, slot usage)."""

from __future__ import annotations

import json
from collections import defaultdict

from triggers.people import PersonWait
from triggers.registry import load_trigger

from ..carried import Defer, Defers, Outputs, Wait
from ..driver.db import Tx
from ..outcomes import (
    Deferral,
    Deferred,
    Failed,
    Outcome,
    Rescheduled,
    SensorTimedOut,
    Succeeded,
)
from ..statemachine import retry_or_fail, transition
from ..states import State
from .assets import NewAssetEvent, record_asset_events
from .events import look_back, register_waits
from .people import PERSON_KEY, request_made
from .values import write_values


async def record_outcomes(tx: Tx, outcomes: list[Outcome], now: float) -> None:
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
        # ctx.push's values with the SUCCESS that keeps them: a stale report moved nothing.
        await write_values(
            tx, {o.row_id: o.values for o in group if o.values and o.row_id in recorded}
        )
        for o in group:
            if o.skip_children and o.row_id in recorded:
                await _skip_branches(tx, o, now)
        # Its outlets' events, with the SUCCESS that records them (a stale report moved
        # nothing, so it records none): they may start the DAGs scheduled on them.
        produced = [
            NewAssetEvent(uri, "task", extra, run_id=o.run_id, task_id=task_id)
            for o in group
            if o.row_id in recorded
            for task_id, uri, extra in o.asset_events
        ]
        if produced:
            await record_asset_events(tx, produced, now)
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
