"""The sync worker: claim runnable tasks, run each in a slot, report back in batches.

One loop, read top to bottom in :meth:`Worker.run`: in one transaction, record every
attempt that finished meanwhile and claim as many tasks as there are free slots; start
each in a slot (:mod:`executor.attempt` turns a row into an outcome); sleep until a slot
frees, the database signals new work (PostgreSQL LISTEN/NOTIFY) or the poll interval
passes. Beside it, a housekeeper heartbeats in-flight rows and takes back the rows of
workers that died: at once when a worker's liveness lock is released (its process is
gone: executor/driver/liveness.py), after ``stale_after`` when it only stopped
heartbeating (hung, cut off). A worker that wakes from a pause heartbeats before anything
else and stops the attempts it lost (a forked child is killed; a thread is interrupted at
its next Python instruction). In process isolation a child does not wait for that: past
``FENCE_SHARE`` of ``stale_after`` since the heartbeat that last covered it, before any
other worker may take its attempt back, it stops by itself (executor/slots.py).
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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .attempt import Attempts
from .callbacks import Deliveries
from .catalogue import DEFAULT_PARSE_TIMEOUT
from .context import TaskContext
from .dag import DAG
from .driver.db import TASKS_CHANNEL
from .driver.faults import Backoff, is_transient, split_apart
from .outcomes import Deferred, Failed, Outcome, SlotInterval
from .pools import DEFAULT
from .rows import MovedTask
from .store import Store
from .store.callbacks import CallbackRow
from .store.loglines import LOG_FLUSH_EVERY, LogLine

log = logging.getLogger("slotless.worker")

HOUSEKEEPING_TICK = 0.25  # how soon a worker notices that it was paused
# A forked child runs on for this share of stale_after past the start of the heartbeat
# that last covered its attempt; the rest is a margin for the reaper's clock and polling.
FENCE_SHARE = 0.8


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
        liveness_every: float = 1.0,
        rand: Callable[[], float] = random.random,
        on_defer: Callable[[], None] | None = None,
        queues: Sequence[str] = (DEFAULT,),
        dag_import_timeout: float = DEFAULT_PARSE_TIMEOUT,
    ) -> None:
        self.store = store
        self.slots = slots
        # Only tasks of these queues are claimed (executor/pools.py).
        self.queues = tuple(queues)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self._attempts = Attempts(
            store.exchange, store.views, slots=slots, isolation=isolation,
            dags=dict(dags or {}), rand=rand, dag_import_timeout=dag_import_timeout,
        )  # fmt: skip
        self._poll = poll_interval
        self._heartbeat_every = heartbeat_interval
        if isolation == "process" and heartbeat_interval >= stale_after * FENCE_SHARE / 2:
            # A child stops FENCE_SHARE of stale_after after the heartbeat that covered it:
            # a heartbeat or two late, healthy attempts would stop too.
            log.warning(
                "heartbeat interval %g s is too close to stale_after %g s: a task process "
                "may stop by itself between two heartbeats (keep the interval under %g s)",
                heartbeat_interval, stale_after, stale_after * FENCE_SHARE / 2,
            )  # fmt: skip
        self._stale_after = stale_after
        self._liveness_every = liveness_every
        self.liveness = store.db.liveness()
        self.lost_workers = 0  # workers found dead whose attempts we took back (metrics)
        self.attempts_lost = 0  # our attempts found taken back (we were paused or cut off)
        self._on_defer = on_defer  # e.g. wake an in-process triggerer at once
        # Callback rows take the slots no task took (executor/callbacks.py).
        self._deliveries = Deliveries(store.callbacks, self._attempts)
        self._callbacks_in_flight: dict[int, str] = {}  # callback row id -> claim owner
        self._claimed_callbacks: list[CallbackRow] = []
        self._free = list(range(slots - 1, -1, -1))  # slot numbers, popped from the end
        self._in_flight: dict[int, str] = {}  # row id -> claim owner, until flushed
        self._running: set[int] = set()  # rows whose attempt is in a slot (no outcome yet)
        self._done: list[Outcome] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._claims = 0
        self._backoff = Backoff("worker: recording attempts and claiming", log)
        # When this worker last failed to reach the database. Nobody could heartbeat during
        # an outage, so right after one every heartbeat looks stale: reaping waits until
        # the other workers have had stale_after seconds to heartbeat again.
        self._db_failed_at = -float("inf")
        # A running attempt's lines are written every LOG_FLUSH_EVERY (a log grows while
        # its task runs), the rest with its outcome: per row, the attempt's context and how
        # many of its lines are written already (a row prepared again has a new context).
        # The lock keeps a flush and an outcome's taking of the rest apart, so that no line
        # is written twice nor left out, and the flushed ones commit first.
        self._flushed: dict[int, tuple[TaskContext, int]] = {}
        self._log_lock = asyncio.Lock()
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
        # Before the first claim under our id: the others judge it by this lock and row.
        await self.liveness.hold(self.worker_id)
        # A row claimed from now on has a heartbeat at least this fresh.
        self._attempts.fence(time.monotonic() + self._stale_after * FENCE_SHARE)
        await self._beat()
        housekeeper = asyncio.create_task(self._housekeeper())
        listener = asyncio.create_task(self._listen())
        watcher = asyncio.create_task(self._watch_workers())
        flusher = asyncio.create_task(self._flush_logs())
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
                    for cb in self._claimed_callbacks:
                        task = asyncio.create_task(self._deliver(cb, self._free.pop()))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    self._claimed_callbacks = []
                # Every attempt claimed is reported (a thread past its execution timeout may
                # still hold its slot: it cannot be stopped, so do not wait for it).
                if (
                    self._stopping
                    and not self._in_flight
                    and not self._done
                    and not self._callbacks_in_flight
                ):
                    break
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll):
                        await self._wake.wait()
        finally:
            housekeeper.cancel()
            listener.cancel()
            watcher.cancel()
            flusher.cancel()
            await asyncio.gather(housekeeper, listener, watcher, flusher, return_exceptions=True)
            self._attempts.shutdown()
            with contextlib.suppress(Exception):  # else its row expires by itself
                await self.store.exchange.worker_leave(self.worker_id)
            await self.liveness.close()

    async def _exchange(self, limit: int) -> list[MovedTask]:
        """Report what finished and claim up to ``limit`` tasks, in one transaction."""
        batch, self._done = self._done, []
        owner = f"{self.worker_id}#{self._claims}"
        self._claims += 1
        try:
            callbacks: list[CallbackRow] = []  # any worker delivers them, whatever its queues
            # Rows this worker still holds a copy of: one whose outcome is not in this
            # batch, or a taken-back attempt still in its slot (a thread blocked in C).
            # Claimed again here, two copies of one row would share its per-row state.
            reported = {o.row_id for o in batch}
            busy = sorted((set(self._in_flight) - reported) | self._running)
            claimed = await self.store.exchange.exchange(
                batch, owner, limit, self.queues, callbacks=callbacks, busy=busy
            )
        except Exception as exc:
            if is_transient(exc):
                self._db_failed_at = time.monotonic()
            if not batch or is_transient(exc) or not await self._record_apart(batch):
                # The database is away (restart, lost connection, a lock): nothing recorded,
                # keep the batch and retry it with backoff; no task fails for this.
                self._done[:0] = batch
                await asyncio.sleep(self._backoff.failed(exc))
                return []
            claimed, callbacks = [], []  # that exchange was rolled back: nothing claimed
        else:
            self._backoff.succeeded()
        for o in batch:
            if self._in_flight.get(o.row_id) == o.owner:
                del self._in_flight[o.row_id]
        if self._on_defer is not None and any(isinstance(o, Deferred) for o in batch):
            self._on_defer()
        for row in claimed:
            self._in_flight[row.id] = owner
        for cb in callbacks:
            self._callbacks_in_flight[cb.id] = owner
        self._claimed_callbacks = callbacks
        self.completed += len(batch)
        if self.on_exchange is not None:
            self.on_exchange(batch, claimed)
        return claimed

    async def _record_apart(self, batch: list[Outcome]) -> bool:
        """A batch failed with a deterministic error: record it in halves until the outcomes
        that fail alone are found, and fail their tasks with the error, so that one bad row
        does not hold back the others for ever. False if the database went away meanwhile
        (then the whole batch is retried: recording an outcome twice changes nothing)."""

        async def record(part: Sequence[Outcome]) -> None:
            await self.store.exchange.exchange(part, "", 0)

        try:
            bad = await split_apart(batch, record)
            for o, err in bad:
                why = f"could not record this attempt's outcome: {type(err).__name__}: {err}"
                log.error("task row %s: %s", o.row_id, why)
                failed = Failed(
                    row_id=o.row_id, owner=o.owner, attempt=o.attempt,
                    max_attempts=o.attempt, run_id=o.run_id, message=why, slot=o.slot,
                )  # fmt: skip
                try:
                    await self.store.exchange.exchange([failed], "", 0)
                except Exception:
                    # Dropped from in-flight below: no more heartbeats, so the reaper
                    # retries or fails it per its policy after stale_after.
                    log.exception("task row %s: cannot record its failure either", o.row_id)
        except Exception as exc:
            if is_transient(exc):
                return False
            raise
        return True

    async def _run_one(self, row: MovedTask, slot: int) -> None:
        owner = self._in_flight[row.id]
        self._running.add(row.id)
        release = asyncio.Event()
        started = time.time()
        backoff = Backoff(f"worker: preparing task row {row.id}", log)
        while True:
            try:
                outcome = await self._attempts.run(row, owner, release)
                break
            except Exception as exc:
                if is_transient(exc) and not self._stopping:
                    self._db_failed_at = time.monotonic()
                    # A read before the task's code ran (its run, its inputs) met a database
                    # restart: try again, never fail the task for it. (The task's own code
                    # reports its errors in its outcome, not here.)
                    await asyncio.sleep(backoff.failed(exc))
                    continue
                # A bug of ours must fail the attempt, not the worker.
                log.exception("worker error on task row %s", row.id)
                release.set()
                outcome = self._attempts.failed(row, owner, f"worker error: {exc!r}")
                break
        backoff.succeeded()
        async with self._log_lock:  # after a flush under way: its lines are not sent twice
            ctx = self._attempts.running.pop(row.id, None)
            flushed, done = self._flushed.pop(row.id, (None, 0))
            if ctx is not None and flushed is ctx and outcome.logs is ctx.lines:
                outcome.logs = outcome.logs[done:]
        kind = outcome.slot_kind or ("resume" if row.next_method else "execute")
        outcome.slot = SlotInterval(self.worker_id, slot, kind, started, time.time())
        self._running.discard(row.id)
        self._done.append(outcome)
        self._wake.set()
        await release.wait()
        self._free.append(slot)
        self._wake.set()

    async def _flush_logs(self) -> None:
        """Write the lines running attempts logged since the last flush, all in one
        transaction, every LOG_FLUSH_EVERY seconds. A flush that fails leaves its lines to
        the next one or to the outcome: a line is late then, never lost."""
        backoff = Backoff("worker: writing running tasks' log lines", log)
        while True:
            await asyncio.sleep(LOG_FLUSH_EVERY)
            async with self._log_lock:
                lines: list[LogLine] = []
                upto: dict[int, tuple[TaskContext, int]] = {}
                for row_id, ctx in list(self._attempts.running.items()):
                    logged = ctx.lines
                    flushed, done = self._flushed.get(row_id, (None, 0))
                    n, done = len(logged), done if flushed is ctx else 0
                    if n > done:
                        lines += [LogLine(row_id, ctx.attempt, ts, str(msg))
                                  for ts, msg in logged[done:n]]  # fmt: skip
                        upto[row_id] = (ctx, n)
                if not lines:
                    continue
                try:
                    await self.store.loglines.append(lines)
                except Exception as exc:
                    failed: Exception | None = exc
                else:
                    failed = None
                    self._flushed.update(upto)
            if failed is None:
                backoff.succeeded()
            else:  # waited out of the lock: outcomes are taken meanwhile, with these lines
                await asyncio.sleep(backoff.failed(failed))

    async def _deliver(self, row: CallbackRow, slot: int) -> None:
        """A callback row in a slot: its handlers run there, bounded by their timeout."""
        release = asyncio.Event()
        try:
            await self._deliveries.deliver(row, self._callbacks_in_flight[row.id], release)
        finally:
            self._callbacks_in_flight.pop(row.id, None)
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
        backoff = Backoff("worker: waiting for notifications (polling meanwhile)", log)
        while wait is not None:
            try:
                if await wait(TASKS_CHANNEL, 60.0):
                    self._wake.set()
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(max(self._poll, backoff.failed(exc)))

    async def _beat(self) -> None:
        """Keep this worker's row live for ``stale_after``, with the queues it serves."""
        await self.store.exchange.worker_beat(
            self.worker_id, self.queues, self.slots, self._stale_after
        )

    async def _housekeeper(self) -> None:
        last_reap = 0.0
        last_beat = last_tick = time.monotonic()
        backoff = Backoff("worker: heartbeating its tasks", log)
        while True:
            await asyncio.sleep(min(HOUSEKEEPING_TICK, self._heartbeat_every))
            now = time.monotonic()
            # A tick far later than asked: this process was paused (SIGSTOP, a long GC,
            # a frozen VM). Its attempts may have been taken back meanwhile: ask first.
            paused = now - last_tick > max(1.0, self._heartbeat_every)
            if paused:
                log.warning(
                    "worker %s was paused for %.1f s: checking which attempts are still its",
                    self.worker_id, now - last_tick,
                )  # fmt: skip
            last_tick = now
            if not paused and now - last_beat < self._heartbeat_every:
                continue
            last_beat = now
            by_owner: dict[str, list[int]] = {}
            for row_id, owner in list(self._in_flight.items()):
                by_owner.setdefault(owner, []).append(row_id)
            callbacks: dict[str, list[int]] = {}
            for cb_id, owner in list(self._callbacks_in_flight.items()):
                callbacks.setdefault(owner, []).append(cb_id)
            began = time.monotonic()
            try:
                for owner, ids in by_owner.items():
                    held = set(await self.store.exchange.heartbeat(owner, ids))
                    # Taken back meanwhile (cancelled, cleared with force, reaped): stop
                    # the attempt where the slot can (a process); its report is discarded.
                    # Not held and still in a slot: an attempt that ended meanwhile (its
                    # report may have committed before this heartbeat) is not lost.
                    # Only the claim heartbeated: its row may have been reported and
                    # claimed again while this heartbeat was under way.
                    lost = [
                        i for i in ids
                        if i not in held and i in self._running and self._in_flight.get(i) == owner
                    ]  # fmt: skip
                    if lost:
                        self.attempts_lost += len(lost)
                        log.warning(
                            "worker %s no longer holds %d attempts (taken back: reaped after "
                            "a pause, cancelled or cleared): stopping them", owner, len(lost)
                        )  # fmt: skip
                        self._attempts.stop(lost)
                        # Said once: no more heartbeats for them; what a thread that cannot
                        # stop at once reports later is refused (the row is not its owner's).
                        for i in lost:
                            self._in_flight.pop(i, None)
                for owner, ids in callbacks.items():
                    await self.store.callbacks.heartbeat_callbacks(owner, ids)
                # Every attempt still ours was heartbeated from ``began`` on.
                self._attempts.fence(began + self._stale_after * FENCE_SHARE)
                await self._beat()
                recovered = time.monotonic() - self._db_failed_at >= self._stale_after
                if recovered and time.monotonic() - last_reap >= self._stale_after / 2:
                    last_reap = time.monotonic()
                    reaped = await self.store.exchange.reap(self._stale_after)
                    if reaped:
                        log.warning(
                            "took back %d attempts of workers that stopped heartbeating "
                            "for %g s (hung, or cut off)", reaped, self._stale_after
                        )  # fmt: skip
                    if reaped + await self.store.callbacks.reap_callbacks(self._stale_after):
                        self._wake.set()
                backoff.succeeded()
            except Exception as exc:
                if is_transient(exc):
                    self._db_failed_at = time.monotonic()
                await asyncio.sleep(min(backoff.failed(exc), self._heartbeat_every))

    async def _watch_workers(self) -> None:
        """Take back at once the attempts of a worker whose liveness lock was released."""
        backoff = Backoff("worker: watching the other workers' liveness", log)
        while True:
            await asyncio.sleep(self._liveness_every)
            try:
                others = await self.store.exchange.other_workers(self.worker_id)
                dead = set(others) - await self.liveness.alive(others)
                for worker_id in sorted(dead):
                    taken = await self.store.exchange.reap_worker(
                        worker_id, "its process is gone (liveness lock released)"
                    )
                    self.lost_workers += 1
                    log.warning(
                        "worker %s is gone (its liveness lock was released): took back its "
                        "%d attempts without waiting for stale_after", worker_id, taken
                    )  # fmt: skip
                    if taken:
                        self._wake.set()
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(min(backoff.failed(exc), self._liveness_every))
