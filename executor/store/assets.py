"""Assets in the store: events recorded, and the runs they start, in one transaction.

An event (a task's SUCCESS for its outlets, ``slotless assets send``, ``POST
/api/v1/assets/events``, a watcher's fire) is inserted by :func:`record_asset_events`, in
the transaction of whatever records it (the worker's exchange, the triggerer's outbox, the
API's request). The same statement queues it for every DAG scheduled on its URI (the index
``asset_consumer_by_uri``); each of those DAGs is then locked (``lock_dags_runs``, the lock
its run creation takes anyway), its queue read back by its primary key, and its condition
evaluated over the URIs queued. When it holds, the queued events are deleted and one run is
created, keyed by a hash of their ids: whoever evaluates the same set (two writers, a
replay) finds the key taken. Nothing polls; no process but the event's writer is involved.

Why a queue of (DAG, event) rows rather than a cursor of the last event id per (DAG,
asset): on PostgreSQL an id is handed out when the row is inserted, not when it commits,
so an event with a smaller id can commit after a larger one was consumed; a cursor would
skip it for good. A queued row is consumed exactly once, whatever the commit order.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from ..assets import check_uri, holds, tree_uris
from ..context import ASSET_EVENTS
from ..driver.db import Row, Tx
from ..runnames import RunType
from .part import Part
from .runs import NewRun, RunShape, insert_runs, shape_parts

SOURCES = frozenset({"task", "cli", "api", "watcher"})
# A run's triggering_asset_events keeps at most this many events per asset (the newest):
# its start event is one JSON text, read by every task of the run.
MAX_EVENTS_SHOWN = 100
# How many events the listing shows per asset.
LAST_EVENTS = 5


@dataclass(frozen=True, slots=True)
class NewAssetEvent:
    """An event to record: its asset, where it comes from, its extra (JSON text)."""

    uri: str
    source: str  # task | cli | api | watcher
    extra: str | None = None
    run_id: str | None = None  # the producing task's run and task (source = task)
    task_id: str | None = None
    # Replays of one event share it (an API request's Idempotency-Key, a watcher's fire):
    # the second insert does nothing. None: never a replay (a task's SUCCESS moves once).
    dedup_key: str | None = None


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """What recording an event did: its id, whether it is new, the runs it started."""

    id: int
    uri: str
    created: bool
    runs: list[str] = field(default_factory=list)


def asset_run_key(event_ids: Sequence[int]) -> str:
    """The run key of the run a set of events starts: a hash of their ids, so that a set
    starts one run, whoever finds it satisfied and however often."""
    text = ",".join(str(i) for i in sorted(event_ids))
    return "asset~" + hashlib.sha256(text.encode()).hexdigest()[:24]


async def record_asset_events(
    tx: Tx, events: Sequence[NewAssetEvent], now: float
) -> list[RecordedEvent]:
    """Insert ``events`` in ``tx``, queue each for the DAGs scheduled on its URI, and
    start the runs whose conditions now hold (once per satisfied set)."""
    out: list[RecordedEvent] = []
    consumers: set[str] = set()
    for ev in events:
        if ev.source not in SOURCES:
            raise ValueError(f"unknown asset event source {ev.source!r}")
        await tx.execute("ensure_asset", uri=ev.uri, now=now)
        row = await tx.fetchone(
            "insert_asset_event",
            uri=ev.uri,
            now=now,
            source=ev.source,
            run_id=ev.run_id,
            task_id=ev.task_id,
            extra=ev.extra,
            dedup_key=ev.dedup_key,
        )
        if row is None:  # a replay: the first one queued it and did what it started
            first = await tx.fetchone("asset_event_by_dedup", dedup_key=ev.dedup_key)
            out.append(RecordedEvent(first["id"] if first else 0, ev.uri, False))
            continue
        queued = await tx.fetch("queue_asset_event", event_id=row["id"], uri=ev.uri)
        consumers.update(r["dag_id"] for r in queued)
        out.append(RecordedEvent(row["id"], ev.uri, True))
    if consumers:
        started = await _start_satisfied(tx, sorted(consumers), now)
        for rec in out:
            rec.runs.extend(started.get(rec.id, ()))
    return out


async def _start_satisfied(tx: Tx, dag_ids: list[str], now: float) -> dict[int, list[str]]:
    """Under the DAGs' locks: each whose condition holds over its queue gets one run.
    Returns event id -> the run ids its consumption created."""
    await tx.fetch("lock_dags_runs", dag_ids=dag_ids)
    dags = {r["dag_id"]: r for r in await tx.fetch("asset_consumer_dags", dag_ids=dag_ids)}
    queued: dict[str, list[Row]] = defaultdict(list)
    for r in await tx.fetch("asset_queued", dag_ids=dag_ids):
        queued[r["dag_id"]].append(r)
    requests: list[tuple[RunShape, NewRun]] = []
    consumed: list[list[int]] = []
    for dag_id in dag_ids:
        dag, events = dags.get(dag_id), queued.get(dag_id, [])
        # Paused or broken: the events stay queued and count at the next event after.
        if dag is None or not events or dag["paused"] or dag["parse_error"] or not dag["shape"]:
            continue
        tree = json.loads(dag["asset_schedule"])
        if not holds(tree, {e["uri"] for e in events}):
            continue
        ids = [e["id"] for e in events]
        await tx.execute("consume_asset_queue", dag_id=dag_id, ids=ids)
        tasks, hooks, policy = shape_parts(dag["shape"])
        zone = ZoneInfo(dag["timezone"])
        new = NewRun(
            logical_date=datetime.fromtimestamp(now, zone).date(),
            run_key=asset_run_key(ids),
            start_event={ASSET_EVENTS: _shown(events)},
            dag_file=dag["file"],
            max_active=dag["max_active_runs"],
            run_type=RunType.ASSET,
            zone=zone,
        )
        requests.append((RunShape(dag_id, tasks, hooks, policy), new))
        consumed.append(ids)
    by_event: dict[int, list[str]] = defaultdict(list)
    if requests:
        started = await insert_runs(tx, requests, now)
        for ids, run in zip(consumed, started, strict=True):
            if run.created:
                for i in ids:
                    by_event[i].append(run.run_id)
    return by_event


def _shown(events: list[Row]) -> dict[str, list[dict[str, Any]]]:
    """The events as ``ctx.triggering_asset_events`` shows them: URI -> oldest first."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        out[e["uri"]].append(event_dict(e))
    return {uri: evs[-MAX_EVENTS_SHOWN:] for uri, evs in out.items()}


def event_dict(e: Row) -> dict[str, Any]:
    return {
        "id": e["id"],
        "uri": e["uri"],
        "ts": e["ts"],
        "source": e["source"],
        "run_id": e["run_id"],
        "task_id": e["task_id"],
        "extra": json.loads(e["extra"]) if e["extra"] else {},
    }


# The migration that made the asset tables (schema/*/025_assets.sql).
SCHEMA = 25


async def has_assets(tx: Tx) -> bool:
    """Whether the store's schema has the asset tables. It always has once this code opened
    it (opening migrates); a store of an older schema that this code writes catalogue rows
    to (the migrations' own tests do) stores no assets rather than failing."""
    row = await tx.fetchone("schema_version_current")
    return row is not None and int(row["version"]) >= SCHEMA


async def catalogue_assets(tx: Tx, dag_id: str, declared: str | None, now: float) -> bool:
    """Store what a DAG declares of assets (:func:`executor.assets.declared` as JSON):
    its condition, the URIs it consumes and produces, the assets' names and watchers.
    Returns whether its watchers changed (its start waits are armed again then)."""
    if not await has_assets(tx):
        return False
    before = await tx.fetchone("dag_assets_before", dag_id=dag_id)
    if before is None:
        return False
    if declared is None and not (
        before["asset_schedule"] or before["asset_watchers"] or before["produces"]
    ):
        return False  # the common DAG: no asset, no write
    await tx.execute("delete_asset_links", dag_ids=[dag_id])
    await tx.execute("delete_asset_producers", dag_ids=[dag_id])
    doc = json.loads(declared) if declared else {}
    schedule = doc.get("schedule")
    watchers = [
        [uri, w[0], json.dumps(w[1], sort_keys=True)]
        for uri, a in sorted(doc.get("assets", {}).items())
        for w in a.get("watchers", [])
    ]
    await tx.execute(
        "set_dag_assets",
        dag_id=dag_id,
        asset_schedule=None if schedule is None else json.dumps(schedule),
        asset_watchers=json.dumps(watchers) if watchers else None,
    )
    if schedule is None:  # no longer a consumer: what was queued for it goes
        await tx.execute("delete_asset_queues", dag_ids=[dag_id])
    for uri, a in sorted(doc.get("assets", {}).items()):
        await tx.execute("name_asset", uri=uri, name=a.get("name"), now=now)
    if schedule is not None:
        for uri in sorted(tree_uris(schedule)):
            await tx.execute("insert_asset_consumer", dag_id=dag_id, uri=uri)
    for task_id, uris in sorted(doc.get("outlets", {}).items()):
        for uri in uris:
            await tx.execute("insert_asset_producer", dag_id=dag_id, task_id=task_id, uri=uri)
    return before["asset_watchers"] != (json.dumps(watchers) if watchers else None)


async def forget_asset_dags(tx: Tx, dag_ids: list[str]) -> None:
    """DAGs removed from the catalogue: they consume and produce nothing any more."""
    if dag_ids:
        await tx.execute("delete_asset_links", dag_ids=dag_ids)
        await tx.execute("delete_asset_producers", dag_ids=dag_ids)
        await tx.execute("delete_asset_queues", dag_ids=dag_ids)


@dataclass(frozen=True, slots=True)
class AssetListed:
    uri: str
    name: str | None
    events: int
    last_ts: float | None
    last_events: list[dict[str, Any]]
    producers: list[tuple[str, str]]  # (dag_id, task_id)
    consumers: list[str]  # dag_ids


class Assets(Part):
    """Asset events from outside (the CLI, the API) and the assets' listing."""

    async def send_event(
        self, uri: str, extra: str | None, *, source: str, dedup_key: str | None = None
    ) -> RecordedEvent:
        """Record one event of ``uri`` (checked) and start what it completes."""
        check_uri(uri)
        async with self.db.write() as tx:
            [rec] = await record_asset_events(
                tx, [NewAssetEvent(uri, source, extra, dedup_key=dedup_key)], self.clock()
            )
        return rec

    async def list_assets(self, last: int = LAST_EVENTS) -> list[AssetListed]:
        """Every asset, its newest ``last`` events, its producers and consumers."""
        async with self.db.read() as tx:
            rows = await tx.fetch("assets_listed")
            uris = [r["uri"] for r in rows]
            events = await tx.fetch("asset_last_events", uris=uris, n=last) if uris else []
            links = await tx.fetch("asset_links")
        by_uri: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            by_uri[e["uri"]].append(event_dict(e))
        producers: dict[str, list[tuple[str, str]]] = defaultdict(list)
        consumers: dict[str, list[str]] = defaultdict(list)
        for link in links:
            if link["role"] == "producer":
                producers[link["uri"]].append((link["dag_id"], link["task_id"]))
            else:
                consumers[link["uri"]].append(link["dag_id"])
        return [
            AssetListed(
                r["uri"],
                r["name"],
                r["events"],
                r["last_ts"],
                by_uri.get(r["uri"], []),
                producers.get(r["uri"], []),
                consumers.get(r["uri"], []),
            )
            for r in rows
        ]
