"""The triggerer: one asyncio process that holds every wait and checks each condition once.

:meth:`Triggerer.run` starts eight small loops over shared state (the check table, the
shards held, the outbox):

* leases    - renew this triggerer's shards, take its fair share, give back the excess;
* liveness  - free and take at once the shards of a peer whose process is gone (these two
              are :class:`~triggerer.leasing.Leases`);
* loading   - read new DEFERRED waits of its shards (a full reload when shards change),
              with :class:`~triggerer.loading.Loader`;
* listening - wake the loader when the database signals new trigger rows (PostgreSQL NOTIFY);
* checking  - start due checks with :class:`~triggerer.running.CheckRunner`: bounded
              concurrency, batched by trigger class where the class can check many at once;
              each result settled by :class:`~triggerer.settling.Settler`;
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
from collections.abc import Callable, Coroutine
from typing import Any

from executor.driver.db import TRIGGERS_CHANNEL
from executor.driver.faults import Backoff
from executor.store import Views
from triggers.checking import CheckContext

from .checks import Check, CheckTable
from .config import TriggererConfig
from .early import EarlyChecks
from .holding import Holder
from .leasing import Leases
from .loading import Loader
from .models import KeptModels
from .push import PushHub
from .repair import UNLOADABLE, Repair
from .running import CallHook, CallTimes, CheckRunner
from .sampling import Gauges, Sampler
from .settling import Settler
from .store import TriggererStore
from .sweeping import Sweep
from .watchdog import LoopWatch
from .writing import Outbox

log = logging.getLogger("slotless.triggerer")


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
        self.ctx = CheckContext(views.external_states, clock=clock, subscribe=views.db.subscribe)
        self.outbox = Outbox(self.ops, self.id)
        self.liveness = views.db.liveness()
        self._wake_checker = asyncio.Event()
        self._wake_loader = asyncio.Event()
        self._reload = True
        self._stopping = asyncio.Event()
        self._loaded_once = asyncio.Event()
        self.leases = Leases(
            self.ops,
            self.id,
            self.liveness,
            self.table,
            cfg,
            wake_checker=self._wake_checker,
            moved=self._shards_moved,
            lag=lambda: self.watch.percentile(0.99),
        )
        self.loader = Loader(
            self.ops,
            self.table,
            self.outbox,
            shards_per_query=cfg.load_shards_per_query,
            clock=clock,
            wake=self._wake_checker,
        )
        self.repair = Repair(self.ops)
        self.sweep = Sweep(
            self.ops,
            self.table,
            self.repair,
            cfg,
            shards=lambda: self.leases.shards,
            fenced=self.leases.fenced,
        )
        # A check's way, from the schedule to its result: a call (the runner; early too,
        # when pushed while in flight) or a held run() (the holder), settled by the settler.
        self.settler = Settler(self.table, self.outbox, KeptModels(), max_backoff=cfg.max_backoff)
        running: set[Check] = set()  # in flight; the watchdog blames them (CheckRunner.blame)
        self._call_times = CallTimes()
        # Held triggers (run() open for the whole wait, as Airflow's are): holding.py.
        self.holder = Holder(self.settler, self.ctx, running, wake=self._wake_checker, clock=clock)
        self.runner = CheckRunner(
            self.table,
            self.ctx,
            self.settler,
            wake=self._wake_checker,
            clock=clock,
            max_concurrency=cfg.max_concurrency,
            wave=cfg.wave,
            batch_size=cfg.batch_size,
            check_timeout=cfg.check_timeout,
            hold=self.holder.start,
            running=running,
            call_times=self._call_times,
            fenced=self.leases.fenced,
            renew=self.leases.wake.set,
            sync_every=cfg.sync_every,
            check_tick=cfg.check_tick,
        )
        self.watch = LoopWatch(on_block=self._on_block, blame=self.runner.blame)
        self.early = EarlyChecks(
            self.table,
            self.settler,
            self.ctx,
            running,
            clock=clock,
            batch_size=cfg.batch_size,
            check_timeout=cfg.check_timeout,
            fenced=self.leases.fenced,
            call_times=self._call_times,
        )
        # Push sources wake checks early; the table tells the hub what it holds.
        self.push = PushHub(
            self.table,
            self.ctx,
            wake_checker=self._wake_checker,
            clock=clock,
            safety_interval=cfg.push_safety_interval,
            retry_after=cfg.push_retry,
            enabled=cfg.push,
            early=self.early.check,
        )
        self.table.watcher = self.push
        self.table.on_forget = self.holder.forget
        # The waits page's sidebar: a sample at the heartbeat when one is due (sampling.py).
        self.ops.sampler = Sampler(
            Gauges(
                checks_done=lambda: self.settler.checks_done,
                lags=lambda: (self.watch.percentile(0.99), max(self.watch.lags, default=0.0)),
                waits=lambda: self.table.subscriptions,
                checks=lambda: len(self.table),
                shards=lambda: len(self.leases.shards),
            ),
            every=cfg.sample_every,
        )

    # What the metrics and the tests read; the settler and the leases keep them.

    @property
    def checks_done(self) -> int:
        return self.settler.checks_done

    @property
    def checks_failed(self) -> int:
        return self.settler.checks_failed

    @property
    def events_fired(self) -> int:
        return self.settler.events_fired

    @property
    def shards(self) -> set[int]:
        return self.leases.shards

    @property
    def takeovers(self) -> int:
        return self.leases.takeovers

    @property
    def shards_lost(self) -> int:
        return self.leases.shards_lost

    @property
    def on_check_call(self) -> CallHook | None:
        """Called after each check call with (trigger classpath, triggers checked, seconds)."""
        return self._call_times.hook

    @on_check_call.setter
    def on_check_call(self, hook: CallHook | None) -> None:
        self._call_times.hook = hook

    @property
    def repaired(self) -> dict[str, int]:
        """Orphans repaired so far, by kind (triggerer/repair.py); the metric reads it."""
        return {
            **self.repair.counts,
            UNLOADABLE: self.loader.unloadable + self.settler.unloadable,
        }

    # -- lifecycle --------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until :meth:`stop`; leaves its shards to the others on the way out."""
        self._loop = asyncio.get_running_loop()
        # Before anything is written under our id: the others judge it by this lock.
        await self.liveness.hold(self.id)
        # The loops of this module's docstring, named as there (in a stack dump, say).
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "leases": self.leases.renewing,
            "liveness": self.leases.watching_peers,
            "loading": self._loading,
            "checking": self.runner.checking,
            "writing": lambda: self.outbox.flushing(self.config.flush_every),
            "timeouts": self.sweep.run,
            "listening": self._listening,
            "watching": self.watch.run,
        }
        tasks = [asyncio.create_task(loop(), name=name) for name, loop in loops.items()]
        try:
            await self._stopping.wait()
        finally:
            calls = [*self.runner.tasks, *self.early.tasks]
            for task in [*tasks, *calls]:
                task.cancel()
            await asyncio.gather(*tasks, *calls, return_exceptions=True)
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

    def _shards_moved(self) -> None:
        """The leases changed the shards we hold: a full reload of them, now."""
        self._reload = True
        self._wake_loader.set()

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

    # -- watching -----------------------------------------------------------------------

    def _on_block(self, culprit: str, stalled: float, rows: list[int] | None) -> None:
        """Called from the watchdog's thread when a stall ended: its tasks hear of it."""
        line = f"event loop blocked for {stalled:.2f} s by trigger class {culprit}"
        # The outbox belongs to the loop's thread: hand the lines over there.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.outbox.log, rows or [], line)
