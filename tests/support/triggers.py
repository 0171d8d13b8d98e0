"""Tools for the deferral, sensor and triggerer tests.

* ``serving``: an in-process worker and triggerer with short intervals, on one store.
* Test trigger classes, registered with :func:`triggers.registry.register`, whose behaviour
  the test controls through module-level state (``FLAGS``) and which record every check
  (``POKES``, ``BATCHES``) so that tests can count them.
* Raw reads of the store: transitions, slot intervals, log messages.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from executor.dag import DAG
from executor.store import Store
from executor.worker import Worker
from support.helpers import sql
from triggerer.service import Triggerer, TriggererConfig
from triggers.base import SHARDS, BaseTrigger, TransientError, TriggerEvent
from triggers.context import TriggerContext
from triggers.registry import register

# --------------------------------------------------------------------------- raw reads


def task_rows(db_path: Path | str, run_id: str, task_id: str | None = None) -> list[dict]:
    """Task rows of a run (instances included), in id order."""
    if task_id is None:
        return sql(db_path, "SELECT * FROM task WHERE run_id = ? ORDER BY id", run_id)
    return sql(
        db_path, "SELECT * FROM task WHERE run_id = ? AND task_id = ? ORDER BY id", run_id, task_id
    )


def task_row(db_path: Path | str, run_id: str, task_id: str, map_index: int = -1) -> dict:
    rows = sql(
        db_path,
        "SELECT * FROM task WHERE run_id = ? AND task_id = ? AND map_index = ?",
        run_id,
        task_id,
        map_index,
    )
    assert rows, f"no task {task_id}[{map_index}] in {run_id}"
    return rows[0]


def state_of(db_path: Path | str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The task's state, or "" while the row does not exist (a mapped instance not yet made)."""
    rows = sql(
        db_path,
        "SELECT state FROM task WHERE run_id = ? AND task_id = ? AND map_index = ?",
        run_id,
        task_id,
        map_index,
    )
    return str(rows[0]["state"]) if rows else ""


def transitions(db_path: Path | str, row_id: int) -> list[tuple[str, str]]:
    return [
        (r["from_state"], r["to_state"])
        for r in sql(
            db_path,
            "SELECT from_state, to_state FROM task_event"
            " WHERE task_row = ? AND kind = 'transition' ORDER BY id",
            row_id,
        )
    ]


def transition_events(db_path: Path | str, row_id: int) -> list[dict]:
    return sql(
        db_path,
        "SELECT * FROM task_event WHERE task_row = ? AND kind = 'transition' ORDER BY id",
        row_id,
    )


def slot_intervals(db_path: Path | str, row_id: int) -> list[dict]:
    return sql(db_path, "SELECT * FROM slot_usage WHERE task_row = ? ORDER BY started_at", row_id)


async def log_text(store: Store, run_id: str, task_id: str, map_index: int = -1) -> str:
    """A task's whole log (transitions, log lines, checks, errors), one event per line."""
    events = await store.views.task_log(run_id, task_id, map_index)
    assert events is not None, f"no task {task_id} in {run_id}"
    return "\n".join(f"[{e['kind']}] {e['message']}" for e in events)


def shard_owners(db_path: Path | str) -> dict[str, int]:
    """Live leases per owner (a lease whose time ran out counts for nobody)."""
    out: dict[str, int] = {}
    for r in sql(
        db_path,
        "SELECT owner, count(*) AS n FROM shard_lease"
        " WHERE owner IS NOT NULL AND expires_at >= ? GROUP BY owner",
        time.time(),
    ):
        out[r["owner"]] = r["n"]
    return out


# --------------------------------------------------------------------------- serving


def spy_listings(monkeypatch: Any) -> list[list[str]]:
    """Record each directory listing FileTrigger's checks make (one list per call)."""
    from triggers import files

    listed: list[list[str]] = []
    real = files._list_dirs

    def spy(directories: list[str]) -> Any:
        listed.append(list(directories))
        return real(directories)

    monkeypatch.setattr(files, "_list_dirs", spy)
    return listed


def fast_config(**overrides: Any) -> TriggererConfig:
    """A triggerer whose every loop turns in tens of milliseconds."""
    values: dict[str, Any] = dict(
        lease_ttl=2.0,
        lease_every=0.2,
        sync_every=0.05,
        reload_every=60.0,
        timeouts_every=0.05,
        cleanup_every=0.2,
        flush_every=0.02,
        max_backoff=5.0,
    )
    values.update(overrides)
    return TriggererConfig(**values)


@dataclass
class Harness:
    store: Store
    worker: Worker | None
    triggerer: Triggerer | None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def start_triggerer(self, **config: Any) -> Triggerer:
        assert self.triggerer is None
        self.triggerer = Triggerer(self.store.views, config=fast_config(**config))
        self.tasks.append(asyncio.create_task(self.triggerer.run()))
        if self.worker is not None:
            self.worker._on_defer = self.triggerer.poke
        return self.triggerer

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.triggerer is not None:
            self.triggerer.stop()
        done, pending = await asyncio.wait(self.tasks, timeout=30)
        if pending:
            stacks = []
            for task in asyncio.all_tasks():
                out = io.StringIO()
                task.print_stack(file=out)
                stacks.append(out.getvalue())
            for task in pending:
                task.cancel()
            raise AssertionError("worker/triggerer did not stop:\n" + "\n".join(stacks))
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]


@asynccontextmanager
async def serving(
    store: Store,
    *dags: DAG,
    slots: int = 4,
    isolation: str = "thread",
    triggerer: bool = True,
    worker: bool = True,
    config: dict[str, Any] | None = None,
) -> AsyncIterator[Harness]:
    """An in-process worker (knowing ``dags``) and triggerer on ``store``, until exit."""
    trig = Triggerer(store.views, config=fast_config(**(config or {}))) if triggerer else None
    work = (
        Worker(
            store,
            slots=slots,
            isolation=isolation,
            dags={d.dag_id: d for d in dags},
            poll_interval=0.02,
            on_defer=trig.poke if trig else None,
        )
        if worker
        else None
    )
    h = Harness(store, work, trig)
    if trig is not None:
        h.tasks.append(asyncio.create_task(trig.run()))
    if work is not None:
        h.tasks.append(asyncio.create_task(work.run()))
    try:
        yield h
    finally:
        await h.stop()


# --------------------------------------------------------------------------- test triggers

# What the test controls: a name in FLAGS makes every trigger of that name fire.
FLAGS: set[str] = set()
# What the triggers record: (time, name) per poke, and the names checked by each batch call.
POKES: list[tuple[float, str]] = []
BATCHES: list[list[str]] = []
_lock = threading.Lock()


def reset() -> None:
    with _lock:
        FLAGS.clear()
        POKES.clear()
        BATCHES.clear()
        _FAILURES.clear()


def pokes_of(name: str) -> list[float]:
    with _lock:
        return [t for t, n in POKES if n == name]


def _record(name: str) -> None:
    with _lock:
        POKES.append((time.time(), name))


@register
class FlagTrigger(BaseTrigger):
    """Fires when ``name`` is in FLAGS; every poke is recorded in POKES."""

    name: str

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        _record(self.name)
        return TriggerEvent(payload={"name": self.name}) if self.name in FLAGS else None


@register
class BatchFlagTrigger(BaseTrigger):
    """Like FlagTrigger, but checked only in batches (``poke`` must never be called)."""

    name: str

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        raise AssertionError("a batched trigger class was checked one by one")

    @classmethod
    async def poke_many(
        cls, triggers: Sequence[BaseTrigger], ctx: TriggerContext
    ) -> Sequence[TriggerEvent | BaseException | None]:
        names = [t.name for t in triggers]  # type: ignore[attr-defined]
        with _lock:
            BATCHES.append(names)
        for n in names:
            _record(n)
        return [TriggerEvent(payload={"name": n}) if n in FLAGS else None for n in names]


class TriggerBug(Exception):
    """What RaisingTrigger raises: not transient, so its tasks fail."""


@register
class RaisingTrigger(BaseTrigger):
    name: str

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        _record(self.name)
        raise TriggerBug(f"bucket {self.name} exploded")


_FAILURES: dict[str, int] = {}


@register
class HangingTrigger(BaseTrigger):
    """A check that never returns (awaits for an hour)."""

    name: str

    async def poke(self, ctx: Any) -> TriggerEvent | None:
        await asyncio.sleep(3600)
        return None


@register
class NotJsonTrigger(BaseTrigger):
    """Fires at once with a payload JSON cannot hold (a datetime)."""

    name: str

    async def poke(self, ctx: Any) -> TriggerEvent | None:
        return TriggerEvent(payload={"at": datetime.now()})


@register
class ScriptedTrigger(BaseTrigger):
    """Its n-th check does ``script[n]``: "wait" (None), "raise" (TriggerBug) or "fire"."""

    name: str
    script: list[str]

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        _record(self.name)
        with _lock:
            seen = _FAILURES.get(self.name, 0)
            _FAILURES[self.name] = seen + 1
        step = self.script[min(seen, len(self.script) - 1)]
        if step == "raise":
            raise TriggerBug(f"{self.name} failed on check {seen + 1}")
        return TriggerEvent(payload={"checks": seen + 1}) if step == "fire" else None


@register
class FlakyTrigger(BaseTrigger):
    """Raises ``error`` (transient / oserror / timeout) for its first ``failures`` checks,
    then fires."""

    name: str
    failures: int
    error: str = "transient"

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        _record(self.name)
        with _lock:
            seen = _FAILURES.get(self.name, 0)
            _FAILURES[self.name] = seen + 1
        if seen < self.failures:
            if self.error == "oserror":
                raise ConnectionRefusedError(f"server for {self.name} refused (try {seen + 1})")
            if self.error == "timeout":  # the trigger's own, e.g. a client's read timeout
                raise TimeoutError(f"{self.name} read timed out (try {seen + 1})")
            raise TransientError(f"{self.name} throttled (try {seen + 1})")
        return TriggerEvent(payload={"name": self.name, "tries": seen + 1})


@register
class BlockingTrigger(BaseTrigger):
    """A badly written trigger: blocks the event loop with a sync sleep on every check."""

    name: str
    block: float = 0.6

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        _record(self.name)
        time.sleep(self.block)  # the mistake under test
        return TriggerEvent(payload={"name": self.name}) if self.name in FLAGS else None


@register
class PushFlagTrigger(BaseTrigger):
    """Push style: ``run`` yields once ``name`` is in FLAGS (watching, not being polled)."""

    name: str

    async def run(self, ctx: TriggerContext) -> AsyncIterator[TriggerEvent]:
        _record(self.name)
        while self.name not in FLAGS:
            await asyncio.sleep(0.02)
        yield TriggerEvent(payload={"name": self.name, "style": "push"})


class UnlistedTrigger(FlagTrigger):
    """Same check as FlagTrigger, but never allow-listed (deferring it must be refused)."""


def flag_path_trigger(directory: Path, name: str, interval: float = 0.1) -> BaseTrigger:
    from triggers.files import FileTrigger

    return FileTrigger(path=str(directory / name), poke_interval=interval)


async def write_flag_waits(
    store: Store, run_id: str, n: int, *, polled: int | None = None, timeout_at: float | None = None
) -> None:
    """``n`` DEFERRED tasks of a new run ``run_id``, each on its own never-true FlagTrigger
    row (shard ``i % SHARDS``), written in three statements behind the store's back: a
    load-sized set in a second. Rows above ``polled`` are event waits (event key ``ev<i>``);
    ``timeout_at`` is each wait's timeout (none if None)."""
    cp = FlagTrigger.classpath()
    event_key = "NULL" if polled is None else f"CASE WHEN i > {polled} THEN 'ev' || i END"
    timeout = "NULL" if timeout_at is None else repr(float(timeout_at))
    async with store.db.write() as tx:
        await tx.script(
            "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at, "
            f"tasks_unfinished) VALUES ('{run_id}', '{run_id}', '2026-01-01', 'RUNNING', 0, {n})"
        )
        await tx.script(
            "INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, event_key) "
            f"WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < {n}) "
            f"SELECT '{cp}', '{{\"name\": \"w' || i || '\", \"poke_interval\": 600}}', "
            f"'h' || i, i % {SHARDS}, 0, {event_key} FROM k"
        )
        await tx.script(
            "INSERT INTO task (run_id, task_id, state, trigger_rule, updated_at, trigger_id, "
            f"wait_timeout_at) SELECT '{run_id}', 'w' || g.id, 'DEFERRED', 'all_success', 0, "
            f"g.id, {timeout} FROM trigger g"
        )
