"""The sync worker: claim runnable tasks, run each in a slot, report back in batches.

One loop, read top to bottom in :meth:`Worker.run`: in one transaction, record every
attempt that finished meanwhile and claim as many tasks as there are free slots; start
each in a slot (:mod:`executor.attempt` turns a row into an outcome); sleep until a slot
frees, the database signals new work (PostgreSQL LISTEN/NOTIFY) or the poll interval
passes. Beside it, a housekeeper heartbeats in-flight rows and takes back the rows of
workers that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .attempt import Attempts
from .dag import DAG
from .outcomes import Deferred, Outcome, SlotInterval
from .rows import MovedTask
from .store import Store
from .store.db import TASKS_CHANNEL

log = logging.getLogger("slotless.worker")


class Worker:
    def __init__(
        self,
        store: Store,
        *,
        slots: int = 8,
        isolation: str = "thread",
        worker_id: str | None = None,
        dags: dict[str, DAG] | None = None,
        poll_interval: float = 0.5,
        heartbeat_interval: float = 5.0,
        stale_after: float = 30.0,
        rand: Callable[[], float] = random.random,
        on_defer: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.slots = slots
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self._attempts = Attempts(
            store, slots=slots, isolation=isolation, dags=dict(dags or {}), rand=rand
        )
        self._poll = poll_interval
        self._heartbeat_every = heartbeat_interval
        self._stale_after = stale_after
        self._on_defer = on_defer  # e.g. wake an in-process triggerer at once
        self._free = list(range(slots - 1, -1, -1))  # slot numbers, popped from the end
        self._in_flight: dict[int, str] = {}  # row id -> claim owner, until flushed
        self._done: list[Outcome] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._claims = 0
        self.completed = 0
        # Called after each exchange with (outcomes recorded, rows claimed): the metrics.
        self.on_exchange: Callable[[list[Outcome], list[MovedTask]], None] | None = None

    def stop(self) -> None:
        """Stop claiming; the worker finishes what it holds and returns from :meth:`run`."""
        self._stopping = True
        self._wake.set()

    @property
    def busy_slots(self) -> int:
        return self.slots - len(self._free)

    async def run(self, until: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Serve until :meth:`stop` is called (or ``until()`` returns true)."""
        tasks: set[asyncio.Task[Any]] = set()
        housekeeper = asyncio.create_task(self._housekeeper())
        listener = asyncio.create_task(self._listen())
        try:
            while True:
                if until is not None and not self._stopping and await until():
                    self._stopping = True
                # Cleared before the exchange, so a slot freed meanwhile wakes us at once.
                self._wake.clear()
                limit = 0 if self._stopping else len(self._free)
                if self._done or limit:
                    for row in await self._exchange(limit):
                        task = asyncio.create_task(self._run_one(row, self._free.pop()))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                # Every attempt claimed is reported (a thread past its execution timeout may
                # still hold its slot: it cannot be stopped, so do not wait for it).
                if self._stopping and not self._in_flight and not self._done:
                    break
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll):
                        await self._wake.wait()
        finally:
            housekeeper.cancel()
            listener.cancel()
            await asyncio.gather(housekeeper, listener, return_exceptions=True)
            self._attempts.shutdown()

    async def _exchange(self, limit: int) -> list[MovedTask]:
        """Report what finished and claim up to ``limit`` tasks, in one transaction."""
        batch, self._done = self._done, []
        owner = f"{self.worker_id}#{self._claims}"
        self._claims += 1
        try:
            claimed = await self.store.exchange(batch, owner, limit)
        except Exception:
            log.exception("could not record %d attempts / claim; will retry", len(batch))
            self._done[:0] = batch
            await asyncio.sleep(self._poll)
            return []
        for o in batch:
            self._in_flight.pop(o.row_id, None)
        if self._on_defer is not None and any(isinstance(o, Deferred) for o in batch):
            self._on_defer()
        for row in claimed:
            self._in_flight[row.id] = owner
        self.completed += len(batch)
        if self.on_exchange is not None:
            self.on_exchange(batch, claimed)
        return claimed

    async def _run_one(self, row: MovedTask, slot: int) -> None:
        owner = self._in_flight[row.id]
        release = asyncio.Event()
        started = time.time()
        try:
            outcome = await self._attempts.run(row, owner, release)
        except Exception as exc:  # a bug of ours must fail the attempt, not the worker
            log.exception("worker error on task row %s", row.id)
            release.set()
            outcome = self._attempts.failed(row, owner, f"worker error: {exc!r}")
        kind = outcome.slot_kind or ("resume" if row.next_method else "execute")
        outcome.slot = SlotInterval(self.worker_id, slot, kind, started, time.time())
        self._done.append(outcome)
        self._wake.set()
        await release.wait()
        self._free.append(slot)
        self._wake.set()

    async def _listen(self) -> None:
        """Cut the idle wait short when the database signals claimable tasks.

        PostgreSQL NOTIFYs ``slotless_tasks``; on SQLite ``wait`` only sleeps and the poll
        interval does the work.
        """
        wait = getattr(self.store.db, "wait", None)
        while wait is not None:
            try:
                if await wait(TASKS_CHANNEL, 60.0):
                    self._wake.set()
            except Exception:
                log.exception("waiting for notifications failed; polling meanwhile")
                await asyncio.sleep(self._poll)

    async def _housekeeper(self) -> None:
        last_reap = 0.0
        while True:
            await asyncio.sleep(self._heartbeat_every)
            by_owner: dict[str, list[int]] = {}
            for row_id, owner in list(self._in_flight.items()):
                by_owner.setdefault(owner, []).append(row_id)
            try:
                for owner, ids in by_owner.items():
                    held = set(await self.store.heartbeat(owner, ids))
                    # Taken back meanwhile (cancelled, cleared with force, reaped): stop
                    # the attempt where the slot can (a process); its report is discarded.
                    self._attempts.stop([i for i in ids if i not in held])
                if time.monotonic() - last_reap >= self._stale_after / 2:
                    last_reap = time.monotonic()
                    if await self.store.reap(self._stale_after):
                        self._wake.set()
            except Exception:
                log.exception("heartbeat failed; will try again")
