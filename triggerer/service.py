"""The triggerer: one asyncio process that holds every wait and checks each condition once.

:meth:`Triggerer.run` starts eight small loops over shared state (the check table, the
shards held, the outbox):

* leases    - renew this triggerer's shards, take its fair share, give back the excess;
* liveness  - every ``liveness_every`` s, ask whether each other lease holder still holds
              its liveness lock (executor/driver/liveness.py); free a dead one's shards
              and take them at once, without waiting for the lease TTL;
* loading   - read new DEFERRED waits of its shards (a full reload when shards change),
              with :class:`~triggerer.loading.Loader`;
* listening - wake the loader when the database signals new trigger rows (PostgreSQL NOTIFY);
* checking  - start due checks with :class:`~triggerer.running.CheckRunner`: bounded
              concurrency, batched by trigger class where the class can check many at once;
* writing   - flush the :class:`~triggerer.writing.Outbox` (fired events, failures and
              sampled check logs), one transaction a batch;
* timeouts  - end waits whose own timeout passed, delete trigger rows nobody needs and
              (the holder of shard 0) prune events past their retention;
* watching  - measure loop lag and name the trigger class that blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from executor.driver.db import TRIGGERS_CHANNEL
from executor.driver.faults import Backoff
from executor.store import Views
from executor.store.events import RETENTION
from triggers.checking import CheckContext

from .checks import CheckTable
from .holding import Holder
from .loading import Loader
from .push import PushHub
from .repair import UNLOADABLE, Repair
from .running import CheckRunner
from .store import TriggererStore
from .watchdog import LoopWatch
from .writing import Outbox

log = logging.getLogger("slotless.triggerer")


@dataclass
class TriggererConfig:
    lease_ttl: float = 15.0  # a hung triggerer's shards are taken after this
    lease_every: float = 3.0
    liveness_every: float = 0.5  # a killed triggerer's shards are taken within about this
    sync_every: float = 1.0  # how often new waits are read (a wake-up shortens it)
    reload_every: float = 60.0  # full reconcile with the rows
    timeouts_every: float = 1.0
    cleanup_every: float = 60.0
    flush_every: float = 0.05
    check_tick: float = 0.01  # due checks are gathered this long (a check may be this late)
    max_concurrency: int = 256  # checks in flight at once
    wave: int = 32  # check calls started per round of the loop
    batch_size: int = 1000  # triggers per poke_many call
    load_shards_per_query: int = 4  # a full reload reads this many shards at a time
    check_timeout: float = 60.0  # a check that takes longer is cancelled and retried
    max_backoff: float = 300.0
    event_retention: float = RETENTION  # events older than this are pruned (seconds)
    # Wake checks from push sources (inotify, S3 event queues, NOTIFY); polled otherwise.
    push: bool = True
    push_safety_interval: float = 300.0  # how often a check whose source is live is polled
    push_retry: float = 30.0  # a source that failed is tried again after this (doubling)


class Triggerer:
    def __init__(
        self,
        views: Views,
        *,
        triggerer_id: str | None = None,
        config: TriggererConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # The read-only views answer cross-DAG questions; the triggerer's own writes go
        # through its TriggererStore, over the same driver.
        self.views = views
        self.ops = TriggererStore(views.db, views.clock)
        self.id = triggerer_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.config = cfg = config or TriggererConfig()
        self.clock = clock
        self.table = CheckTable()
        self.shards: set[int] = set()
        self.ctx = CheckContext(views.external_states, clock=clock, subscribe=views.db.subscribe)
        self.watch = LoopWatch(on_block=self._on_block, blame=self._blame)
        self.outbox = Outbox(self.ops, self.id)
        self.liveness = views.db.liveness()
        # Monotonic time until which the last renewal covers our shards: past it (we were
        # paused, or renewals fail) we check nothing and write no fire until renewed.
        self._valid_until = 0.0
        self._wake_leases = asyncio.Event()
        self._take_freed = False  # a dead peer's shards were freed: take them all at once
        self.takeovers = 0  # dead triggerers whose shards we freed (the metrics)
        self.shards_lost = 0  # shards found taken when we renewed
        self._wake_checker = asyncio.Event()
        # Push sources wake checks early; the table tells the hub what it holds.
        self.push = PushHub(
            self.table,
            self.ctx,
            wake_checker=self._wake_checker,
            clock=clock,
            safety_interval=cfg.push_safety_interval,
            retry_after=cfg.push_retry,
            enabled=cfg.push,
        )
        self.table.watcher = self.push
        self.loader = Loader(
            self.ops,
            self.table,
            self.outbox,
            shards_per_query=cfg.load_shards_per_query,
            clock=clock,
            wake=self._wake_checker,
        )
        self.repair = Repair(self.ops)
        self.runner = CheckRunner(
            self.table,
            self.ctx,
            self.outbox,
            wake=self._wake_checker,
            clock=clock,
            max_concurrency=cfg.max_concurrency,
            wave=cfg.wave,
            batch_size=cfg.batch_size,
            check_timeout=cfg.check_timeout,
            max_backoff=cfg.max_backoff,
            fenced=self.fenced,
        )
        # Held triggers (run() open for the whole wait, as Airflow's are): holding.py.
        self.holder = Holder(self.runner, self.ctx, wake=self._wake_checker, clock=clock)
        self.runner.hold = self.holder.start
        self.push.early = self.runner.check_early
        self.table.on_forget = self.holder.forget
        self._wake_loader = asyncio.Event()
        self._reload = True
        self._stopping = asyncio.Event()
        self._loaded_once = asyncio.Event()

    # What the metrics and the tests read; the runner keeps them.

    @property
    def checks_done(self) -> int:
        return self.runner.checks_done

    @property
    def checks_failed(self) -> int:
        return self.runner.checks_failed

    @property
    def events_fired(self) -> int:
        return self.runner.events_fired

    @property
    def on_check_call(self) -> Callable[[str, int, float], None] | None:
        """Called after each check call with (trigger classpath, triggers checked, seconds)."""
        return self.runner.on_check_call

    @on_check_call.setter
    def on_check_call(self, hook: Callable[[str, int, float], None] | None) -> None:
        self.runner.on_check_call = hook

    @property
    def repaired(self) -> dict[str, int]:
        """Orphans repaired so far, by kind (triggerer/repair.py); the metric reads it."""
        return {
            **self.repair.counts,
            UNLOADABLE: self.loader.unloadable + self.runner.unloadable,
        }

    # -- lifecycle --------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until :meth:`stop`; leaves its shards to the others on the way out."""
        self._loop = asyncio.get_running_loop()
        # Before anything is written under our id: the others judge it by this lock.
        await self.liveness.hold(self.id)
        loops = [
            self._leases,
            self._liveness,
            self._loading,
            self._checking,
            self._writing,
            self._timeouts,
            self._listening,
            self.watch.run,
        ]
        tasks = [asyncio.create_task(loop(), name=loop.__name__) for loop in loops]
        try:
            await self._stopping.wait()
        finally:
            for task in [*tasks, *self.runner.tasks]:
                task.cancel()
            await asyncio.gather(*tasks, *self.runner.tasks, return_exceptions=True)
            await self.holder.stop()  # their cleanup runs: the waits move to another triggerer
            with contextlib.suppress(Exception):
                await self.outbox.flush()
                await self.ops.triggerer_leave(self.id)
            await self.push.aclose()
            await self.ctx.aclose()
            await self.liveness.close()

    def stop(self) -> None:
        self._stopping.set()

    def poke(self) -> None:
        """New waits may exist: read them now instead of at the next sync tick."""
        self._wake_loader.set()

    async def loaded(self) -> None:
        """Wait until the first load of this triggerer's shards is done."""
        await self._loaded_once.wait()

    # -- leases -------------------------------------------------------------------------

    async def _drop_shards(self, gone: set[int]) -> None:
        """Forget the checks of shards no longer ours, a 64th of the table at a time: half
        of a million dropped at once held the loop 1.8 s. A check of theirs that runs
        meanwhile fires nothing (the outbox writes only for shards still leased); one
        dropped meanwhile is left as it is (``drop`` forgets only what is still held)."""
        table = self.table
        for checks in table.by_hash.value_chunks():
            for check in checks:
                if check.shard in gone:
                    table.drop(check)
            await asyncio.sleep(0)

    async def _leases(self) -> None:
        cfg = self.config
        backoff = Backoff("triggerer: renewing shard leases", log)
        while True:
            self._wake_leases.clear()
            try:
                began = time.monotonic()
                released: set[int] = set()  # given back to a newcomer, not lost
                take_free, self._take_freed = self._take_freed, False
                try:
                    shards = await self.ops.lease_shards(
                        self.id, cfg.lease_ttl, cfg.lease_ttl, released, take_free=take_free
                    )
                except BaseException:
                    self._take_freed |= take_free  # the next try takes them
                    raise
                # Our leases run from the transaction's start; keep a tenth in hand.
                self._valid_until = began + cfg.lease_ttl * 0.9
                if shards != self.shards:
                    gone = self.shards - shards
                    await self._drop_shards(gone)
                    if lost := gone - released:
                        self.shards_lost += len(lost)
                        log.warning(
                            "triggerer %s lost %d shards (its leases lapsed: paused, or cut "
                            "off from the database?): stopped checking them", self.id, len(lost)
                        )  # fmt: skip
                    log.info("triggerer %s holds %d shards", self.id, len(shards))
                    self.shards = shards
                    self._reload = True
                    self._wake_loader.set()
                self._wake_checker.set()  # fenced checks may go on
                await self.ops.triggerer_beat(
                    self.id, self.table.subscriptions, self.watch.percentile(0.99) * 1000
                )
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(min(backoff.failed(exc), cfg.lease_every))
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(cfg.lease_every):  # not wait_for: see _loading
                    await self._wake_leases.wait()

    def fenced(self) -> bool:
        """Whether our leases may have lapsed (a pause, failed renewals, our liveness lock
        lost): then nothing is checked until a renewal says which shards are still ours."""
        return time.monotonic() >= self._valid_until or not self.liveness.held

    async def _liveness(self) -> None:
        backoff = Backoff("triggerer: watching the other triggerers' liveness", log)
        while True:
            await asyncio.sleep(self.config.liveness_every)
            try:
                owners = await self.ops.other_triggerers(self.id)
                dead = set(owners) - await self.liveness.alive(owners)
                for owner in sorted(dead):
                    freed = await self.ops.forget_triggerer(owner)
                    if not freed:
                        log.info("triggerer %s is gone (it held no shards)", owner)
                        continue  # or another triggerer freed them first
                    self.takeovers += 1
                    log.warning(
                        "triggerer %s is gone (its liveness lock was released): took back "
                        "its %d shards without waiting for their leases", owner, freed
                    )  # fmt: skip
                if dead:
                    self._take_freed = True
                    self._wake_leases.set()
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(min(backoff.failed(exc), self.config.liveness_every))

    # -- loading ------------------------------------------------------------------------

    async def _loading(self) -> None:
        last_reload = 0.0
        backoff = Backoff("triggerer: loading waits", log)
        while True:
            try:
                full = self._reload or time.monotonic() - last_reload > self.config.reload_every
                if full:
                    self._reload = False
                    last_reload = time.monotonic()
                await self.loader.load(self.shards, full=full)
                if full:
                    self._loaded_once.set()
                    # What the reload could not hold (no trigger row, no owner) is ended here,
                    # so an orphan lasts one reconcile period at most (triggerer/repair.py).
                    await self.repair.run(self.shards, self.table.subscriptions)
                self._wake_checker.set()  # new checks may be due at once
                backoff.succeeded()
            except Exception as exc:
                self._reload = True  # what failed may have been a full reload: do it again
                await asyncio.sleep(backoff.failed(exc))
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that races
                # the event being set, and stop() then waits for this loop forever.
                async with asyncio.timeout(self.config.sync_every):
                    await self._wake_loader.wait()
            self._wake_loader.clear()

    async def _listening(self) -> None:
        # On SQLite `wait` only sleeps: the loader's sync tick does the work there.
        backoff = Backoff("triggerer: waiting for notifications (polling meanwhile)", log)
        while True:
            try:
                if await self.views.db.wait(TRIGGERS_CHANNEL, 60.0):
                    self._wake_loader.set()
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(max(self.config.sync_every, backoff.failed(exc)))

    # -- checking -----------------------------------------------------------------------

    async def _checking(self) -> None:
        runner = self.runner
        while True:
            # Cleared first, so that a call ending or a load meanwhile wakes the wait below.
            self._wake_checker.clear()
            if self.fenced():
                # Woken after a pause (or renewals fail): learn which shards are still ours
                # before checking anything; the lease loop wakes us when it knows.
                self._wake_leases.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._wake_checker.wait()
                continue
            if runner.dispatch(self.clock()):
                await asyncio.sleep(0)  # let the dispatched checks start
                continue
            if runner.full:
                wait = 1.0  # the next call to end wakes us
            else:
                nxt = self.table.next_due()
                wait = self.config.sync_every if nxt is None else max(0.0, nxt - self.clock())
                # Checks due within a tick are gathered: a wake-up serves dozens of them
                # (3,800 checks/s spread evenly would otherwise be 3,800 wake-ups, each
                # costing more than the checks it runs).
                wait = max(wait, self.config.check_tick)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(wait, 1.0)):  # not wait_for: see _loading
                    await self._wake_checker.wait()

    # -- writing ------------------------------------------------------------------------

    async def _writing(self) -> None:
        backoff = Backoff("triggerer: writing events", log)
        urgent = self.outbox.urgent
        while True:
            # A fire is written at once (what comes meanwhile joins the next commit); logs
            # wait for the tick.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.flush_every):  # not wait_for: _loading
                    await urgent.wait()
            urgent.clear()
            try:
                await self.outbox.flush()  # kept for the next try if it fails
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(backoff.failed(exc))

    # -- timeouts and cleanup -----------------------------------------------------------

    async def _timeouts(self) -> None:
        last_cleanup = time.monotonic()
        backoff = Backoff("triggerer: timeout sweep", log)
        while True:
            await asyncio.sleep(self.config.timeouts_every)
            if not self.shards or self.fenced():
                continue
            try:
                for row in await self.ops.expire_waits(self.shards):
                    self.table.unsubscribe(row)
                if time.monotonic() - last_cleanup > self.config.cleanup_every:
                    last_cleanup = time.monotonic()
                    await self.repair.delete_unwaited(self.shards, self.table.subscriptions)
                    if 0 in self.shards:  # one triggerer prunes events: whoever holds shard 0
                        await self.ops.prune_events(self.config.event_retention)
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(backoff.failed(exc))

    # -- watching -----------------------------------------------------------------------

    def _blame(self, culprit: str) -> list[int]:
        """Called from the watchdog's thread when a stall is seen: the waits of the checks
        of that class running now (they will have ended when the stall is measured)."""
        current = self.runner.current
        checks = [*list(self.runner.running), *([current] if current is not None else [])]
        return [row for c in checks if c.trigger.blame() == culprit for row in list(c.subscribers)]

    def _on_block(self, culprit: str, stalled: float, rows: list[int] | None) -> None:
        """Called from the watchdog's thread when a stall ended: its tasks hear of it."""
        line = f"event loop blocked for {stalled:.2f} s by trigger class {culprit}"
        # The outbox belongs to the loop's thread: hand the lines over there.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.outbox.log, rows or [], line)
