"""Events: stored, and settling the waits they match in the same transaction.

Nothing polls for an event. Two writers meet here, and each looks for the other:

* **An event's writer** (:meth:`Events.send_events`: ``slotless events send``, ``POST
  /api/v1/events``, the Python API) stores the event, computes from its payload the key
  of every field set its name is waited on with (``event_shape``), finds the waits on those
  keys through an index (``trigger.event_key``) and moves them on through the state
  machine: a sensor to SUCCESS with the payload as its output, a task that deferred with a
  method to PENDING with the payload as its event. The cost of an event grows with the
  waits it wakes, not with the waits held.
* **A wait that begins** (:func:`register_waits` and :func:`look_back`, in the worker's
  transaction that makes the task DEFERRED) records its field set and looks for a matching
  event already stored within its lookback window (by default since its run started); if
  there is one, the wait ends in the same transaction.

Neither can miss the other. On SQLite every write transaction holds the file's lock, so
one of the two commits first and the other sees it. On PostgreSQL (READ COMMITTED) an
event's writer holds an advisory lock on the event's name, exclusive, until it commits; a
wait registering holds it shared: whichever comes second waits for the first to commit,
and its next statement sees the first's rows. Each wait moves once (the transition is a
compare-and-set), and ``event_woke`` records which event woke it. No triggerer takes
part, so waits work while none runs; their timeouts are the triggerer's, like every wait's.

Events are kept for :data:`RETENTION` seconds (the triggerer that holds shard 0 prunes
them in batches of :data:`PRUNE_BATCH`, on its minutely cleanup).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from triggers.events import EventError, EventWait, check_name, payload_json, payload_key
from triggers.limits import JsonLimitError, check_json_value, storable_text

from ..carried import Output, Resume
from ..driver.db import Database, Row, Tx
from ..statemachine import transition
from ..states import State
from .part import Part

RETENTION = 7 * 86400.0  # seconds an event is kept (``--event-retention``)
PRUNE_BATCH = 5000  # events deleted per transaction when pruning
MAX_BATCH = 1000  # events in one send (one transaction)
UNREADABLE = (
    "slotless.unreadable"  # the key of what a stored payload that cannot be served reads as
)


@dataclass(frozen=True, slots=True)
class SentEvent:
    """An event as stored, and the task rows it woke when it was sent."""

    id: int
    name: str
    sent_at: float
    woke: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Wake:
    """A wait an event woke."""

    task_row: int
    run_id: str
    task_id: str
    map_index: int
    state: str
    woke_at: float


@dataclass(frozen=True, slots=True)
class StoredEvent:
    id: int
    name: str
    payload: Any
    sent_at: float
    source: str
    woke: list[Wake]


class UnknownEvent(LookupError):
    """No event of that name or id is stored (and, for a name, no wait was ever on it)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def check_event(name: object, payload: Any, where: str = "") -> tuple[str, str, Any]:
    """(name, stored JSON, the payload as matched) or :class:`EventError` naming the field.

    The one check of an event, whichever way it came in (the CLI, the API, the Python API):
    a payload that passes is one every reader can load and serve back."""
    name = check_name(name, f"{where}name")
    try:
        check_json_value(payload, f"{where}payload")
    except JsonLimitError as exc:
        raise EventError(str(exc), exc.field) from None
    text = payload_json(payload, f"{where}payload")
    return name, text, json.loads(text)


def stored_payload(text: str) -> Any:
    """A stored payload as read back. Every payload the store wrote passes
    :func:`check_event`; a row written some other way (by hand, by an older version) may
    not, and one such row must not make every listing fail for the whole retention: it
    reads as a note saying so."""
    try:
        payload = json.loads(text)
        check_json_value(payload, "payload")
    except (ValueError, RecursionError) as exc:  # JsonLimitError is a ValueError
        return {UNREADABLE: f"the stored payload cannot be served: {str(exc)[:200]}"}
    return payload


class Events(Part):
    """Sending events (each wakes the waits it matches) and reading them back."""

    async def send_event(
        self, name: str, payload: Any = None, *, source: str = "python"
    ) -> SentEvent:
        """Store one event and wake the waits it matches; :class:`EventError` (nothing
        stored) for a bad name, a payload that is not JSON or is over 64 KiB.

        >>> sent = await events.send_event("export.ready", {"partner": "acme"})  # doctest: +SKIP
        """
        return (await self.send_events([(name, payload)], source=source))[0]

    async def send_events(
        self, events: Sequence[tuple[str, Any]], *, source: str = "python"
    ) -> list[SentEvent]:
        """Store a batch of events in one transaction, in order, each waking its waits.

        Every event is checked before anything is written: one bad event refuses the batch
        (:class:`EventError`, its ``field`` saying which, e.g. ``events[3].payload``).
        """
        if len(events) > MAX_BATCH:
            raise EventError(f"at most {MAX_BATCH} events at once, not {len(events)}", "events")
        many = len(events) > 1
        checked = [
            check_event(name, payload, f"events[{i}]." if many else "")
            for i, (name, payload) in enumerate(events)
        ]
        if not checked:
            return []
        now = self.clock()
        async with self.db.write() as tx:
            names = sorted({name for name, _, _ in checked})
            await tx.fetch("lock_event_names", names=names)
            shapes: dict[str, list[list[str]]] = defaultdict(list)
            for r in await tx.fetch("event_shapes", names=names):
                shapes[r["name"]].append(json.loads(r["fields"]))
            # One statement stores the batch, one looks up every key it has: the cost of
            # a batch is a few round trips, plus the waits it wakes.
            rows = await tx.fetch(
                "store_events",
                events=json.dumps([[name, text] for name, text, _ in checked]),
                now=now,
                source=source,
            )
            ids = sorted(r["id"] for r in rows)
            keys_of = [_keys(name, shapes[name], payload) for name, _, payload in checked]
            every = sorted(set[str]().union(*keys_of))
            by_key: dict[str, dict[int, int]] = defaultdict(dict)
            if every:
                key_of = {r["id"]: r["event_key"]
                          for r in await tx.fetch("event_key_triggers", keys=every)}  # fmt: skip
                if key_of:
                    for r in await tx.fetch("deferred_on_triggers", ids=sorted(key_of)):
                        by_key[key_of[r["trigger_id"]]][r["id"]] = r["trigger_id"]
            sent = []
            for event_id, (name, text, _), keys in zip(ids, checked, keys_of, strict=True):
                waits = {row: trigger for k in keys for row, trigger in by_key[k].items()}
                woke: list[int] = []
                if waits:
                    why = f"woken by event {name} #{event_id} (sent by {source})"
                    woke = await settle(tx, event_id, text, waits, now, why)
                    for k in keys:  # an earlier event of the batch has them: not again
                        by_key.pop(k, None)
                sent.append(SentEvent(event_id, name, now, woke))
        return sent

    async def list_events(self, name: str | None = None, limit: int = 50) -> list[StoredEvent]:
        """The newest events (of ``name``), each with the waits it woke. An unknown name
        (no event stored, no wait ever on it) is :class:`UnknownEvent`."""
        if name is not None and not storable_text(name):
            raise UnknownEvent(f"no event named {name[:200]!r} is stored", "name")
        async with self.db.read() as tx:
            if name is None:
                rows = await tx.fetch("recent_events", limit=limit)
            else:
                rows = await tx.fetch("recent_events_named", name=name, limit=limit)
                if not rows and await tx.fetchone("event_name_known", name=name) is None:
                    raise UnknownEvent(
                        f"no event named {name!r} is stored (within the retention) and no "
                        "wait was ever on it",
                        "name",
                    )
            return await _with_wakes(tx, rows)

    async def get_event(self, event_id: int) -> StoredEvent:
        async with self.db.read() as tx:
            row = await tx.fetchone("event_by_id", id=event_id)
            if row is None:
                raise UnknownEvent(f"no event #{event_id} is stored", "id")
            return (await _with_wakes(tx, [row]))[0]


def _keys(name: str, shapes: list[list[str]], payload: Any) -> set[str]:
    """The keys of the waits this event would match: one per field set of its name."""
    return {k for fields in shapes if (k := payload_key(name, fields, payload)) is not None}


async def _with_wakes(tx: Tx, rows: Sequence[Row]) -> list[StoredEvent]:
    wakes: dict[int, list[Wake]] = defaultdict(list)
    if rows:
        for w in await tx.fetch("event_wakes", ids=[r["id"] for r in rows]):
            wakes[w["event_id"]].append(
                Wake(
                    w["task_row"],
                    w["run_id"],
                    w["task_id"],
                    w["map_index"],
                    w["state"],
                    w["woke_at"],
                )
            )
    return [
        StoredEvent(
            r["id"],
            r["name"],
            stored_payload(r["payload"]),
            r["sent_at"],
            r["source"],
            wakes[r["id"]],
        )
        for r in rows
    ]


async def settle(
    tx: Tx, event_id: int, payload_text: str, waits: dict[int, int], now: float, why: str
) -> list[int]:
    """End these waits (task row -> the trigger row it waits on) with the event, once:
    only rows still DEFERRED on that very trigger move (locked on PostgreSQL)."""
    if not waits:
        return []
    rows = [r for r in await tx.fetch("deferred_rows", ids=list(waits))
            if r["trigger_id"] == waits[r["id"]]]  # fmt: skip
    sensors = [r["id"] for r in rows if r["next_method"] is None]
    resumable = [r["id"] for r in rows if r["next_method"] is not None]
    moved = await transition(
        tx, sensors, State.DEFERRED, State.SUCCESS, now=now, message=why,
        carry=Output(payload_text),
    )  # fmt: skip
    moved += await transition(
        tx, resumable, State.DEFERRED, State.PENDING, now=now, message=why, ready_at=now,
        carry=Resume(payload_text),
    )  # fmt: skip
    ids = [m.id for m in moved]
    if ids:
        await tx.executemany(
            "insert_event_woke", [{"event_id": event_id, "task_row": i, "now": now} for i in ids]
        )
        # Never loaded by a triggerer: nothing holds them once their wait has ended.
        await tx.execute("delete_triggers", ids=sorted({waits[i] for i in ids}))
    return ids


async def register_waits(tx: Tx, waits: Iterable[EventWait], now: float) -> None:
    """Before waits begin in this transaction: hold their names (shared, on PostgreSQL) and
    record their field sets, both in one sorted order so that two workers cannot deadlock.
    Called first in the transaction, before it takes any other lock."""
    waits = list(waits)
    if not waits:
        return
    await tx.fetch("lock_event_names_shared", names=sorted({w.name for w in waits}))
    for name, fields in sorted({(w.name, w.fields) for w in waits}):
        await tx.execute("insert_event_shape", name=name, fields=fields, now=now)


async def look_back(
    tx: Tx, task_row: int, trigger_id: int, wait: EventWait, wait_started_at: float, now: float
) -> bool:
    """A wait that has just begun: end it with the newest matching event stored within its
    lookback window, if there is one (True). After :func:`register_waits`."""
    since = None if wait.lookback is None else wait_started_at - wait.lookback
    for e in await tx.fetch("events_since", name=wait.name, since=since, task_row=task_row):
        if wait.matches(stored_payload(e["payload"])):
            ago = max(0.0, wait_started_at - e["sent_at"])
            why = (f"woken by event {wait.name} #{e['id']} (sent by {e['source']}, "
                   f"{ago:.1f} s before the wait began)")  # fmt: skip
            return bool(await settle(tx, e["id"], e["payload"], {task_row: trigger_id}, now, why))
    return False


async def prune_events(db: Database, before: float, batch: int = PRUNE_BATCH) -> int:
    """Delete events sent before ``before`` (and their wake records), ``batch`` per
    transaction so that no write holds the lock for long. Returns how many went."""
    total = 0
    while True:
        async with db.write() as tx:
            ids = [r["id"] for r in await tx.fetch("prune_events", before=before, n=batch)]
            if ids:
                await tx.execute("prune_event_wakes", ids=ids)
        total += len(ids)
        if len(ids) < batch:
            return total


__all__ = [
    "MAX_BATCH",
    "RETENTION",
    "UNREADABLE",
    "EventError",
    "Events",
    "SentEvent",
    "StoredEvent",
    "UnknownEvent",
    "Wake",
    "check_event",
    "look_back",
    "prune_events",
    "register_waits",
    "settle",
    "stored_payload",
]
