"""The triggerer: one asyncio process that holds every wait and checks each condition once.

:meth:`Triggerer.run` starts seven small loops over shared state (the check table, the
shards held, the outbox):

* leases    - renew this triggerer's shards, take its fair share, give back the excess;
* loading   - read new DEFERRED waits of its shards (a full reload when shards change),
              with :class:`~triggerer.loading.Loader`;
* listening - wake the loader when the database signals new trigger rows (PostgreSQL NOTIFY);
* checking  - start due checks with :class:`~triggerer.running.CheckRunner`: bounded
              concurrency, batched by trigger class where the class can check many at once;
* writing   - flush the :class:`~triggerer.writing.Outbox` (fired events, failures and
              sampled check logs), one transaction a batch;
* timeouts  - end waits whose own timeout passed, and delete trigger rows nobody needs;
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

from executor.store import Store
from executor.store.db import TRIGGERS_CHANNEL
from triggers.checking import CheckContext

from .checks import CheckTable
from .loading import Loader
from .running import CheckRunner
from .store import TriggererStore
from .watchdog import LoopWatch
from .writing import Outbox

log = logging.getLogger("slotless.triggerer")


@dataclass
class TriggererConfig:
    lease_ttl: float = 15.0  # a dead triggerer's shards are taken after this
    lease_every: float = 3.0
    sync_every: float = 1.0  # how often new waits are read (a wake-up shortens it)
    reload_every: float = 60.0  # full reconcile with the rows
    timeouts_every: float = 1.0
    cleanup_every: float = 60.0
    flush_every: float = 0.05
    max_concurrency: int = 256  # checks in flight at once
    wave: int = 32  # check calls started per round of the loop
    batch_size: int = 1000  # triggers per poke_many call
    load_shards_per_query: int = 4  # a full reload reads this many shards at a time
    check_timeout: float = 60.0  # a check that takes longer is cancelled and retried
    max_backoff: float = 300.0


class Triggerer:
    def __init__(
        self,
        store: Store,
        *,
        triggerer_id: str | None = None,
        config: TriggererConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.ops = TriggererStore(store.db, store.clock)
        self.id = triggerer_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.config = cfg = config or TriggererConfig()
        self.clock = clock
        self.table = CheckTable()
        self.shards: set[int] = set()
        self.ctx = CheckContext(store.external_states, clock=clock)
        self.watch = LoopWatch(on_block=self._on_block)
        self.outbox = Outbox(self.ops)
        self.loader = Loader(
            self.ops,
            self.table,
            self.outbox,
            shards_per_query=cfg.load_shards_per_query,
            clock=clock,
        )
        self._wake_checker = asyncio.Event()
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
        )
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

    # -- lifecycle --------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until :meth:`stop`; leaves its shards to the others on the way out."""
        self._loop = asyncio.get_running_loop()
        loops = [
            self._leases,
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
            with contextlib.suppress(Exception):
                await self.outbox.flush()
                await self.ops.triggerer_leave(self.id)
            await self.ctx.aclose()

    def stop(self) -> None:
        self._stopping.set()

    def poke(self) -> None:
        """New waits may exist: read them now instead of at the next sync tick."""
        self._wake_loader.set()

    async def loaded(self) -> None:
        """Wait until the first load of this triggerer's shards is done."""
        await self._loaded_once.wait()

    # -- leases -------------------------------------------------------------------------

    async def _leases(self) -> None:
        cfg = self.config
        while True:
            try:
                shards = await self.ops.lease_shards(self.id, cfg.lease_ttl, cfg.lease_ttl)
                if shards != self.shards:
                    lost = self.shards - shards
                    if lost:
                        for check in [c for c in self.table.by_hash.values() if c.shard in lost]:
                            self.table.drop(check)
                    log.info("triggerer %s holds %d shards", self.id, len(shards))
                    self.shards = shards
                    self._reload = True
                    self._wake_loader.set()
                await self.ops.triggerer_beat(
                    self.id, self.table.subscriptions, self.watch.percentile(0.99) * 1000
                )
            except Exception:
                log.exception("lease renewal failed; retrying")
            await asyncio.sleep(cfg.lease_every)

    # -- loading ------------------------------------------------------------------------

    async def _loading(self) -> None:
        last_reload = 0.0
        while True:
            try:
                full = self._reload or time.monotonic() - last_reload > self.config.reload_every
                if full:
                    self._reload = False
                    last_reload = time.monotonic()
                await self.loader.load(self.shards, full=full)
                if full:
                    self._loaded_once.set()
                self._wake_checker.set()  # new checks may be due at once
            except Exception:
                log.exception("loading waits failed; retrying")
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that races
                # the event being set, and stop() then waits for this loop forever.
                async with asyncio.timeout(self.config.sync_every):
                    await self._wake_loader.wait()
            self._wake_loader.clear()

    async def _listening(self) -> None:
        # On SQLite `wait` only sleeps: the loader's sync tick does the work there.
        while True:
            try:
                if await self.store.db.wait(TRIGGERS_CHANNEL, 60.0):
                    self._wake_loader.set()
            except Exception:
                log.exception("waiting for notifications failed; polling meanwhile")
                await asyncio.sleep(self.config.sync_every)

    # -- checking -----------------------------------------------------------------------

    async def _checking(self) -> None:
        runner = self.runner
        while True:
            # Cleared first, so that a call ending or a load meanwhile wakes the wait below.
            self._wake_checker.clear()
            if runner.dispatch(self.clock()):
                await asyncio.sleep(0)  # let the dispatched checks start
                continue
            if runner.full:
                wait = 1.0  # the next call to end wakes us
            else:
                nxt = self.table.next_due()
                wait = self.config.sync_every if nxt is None else max(0.0, nxt - self.clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(wait, 1.0)):  # not wait_for: see _loading
                    await self._wake_checker.wait()

    # -- writing ------------------------------------------------------------------------

    async def _writing(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_every)
            try:
                await self.outbox.flush()
            except Exception:
                log.exception("writing events failed; retrying")

    # -- timeouts and cleanup -----------------------------------------------------------

    async def _timeouts(self) -> None:
        last_cleanup = time.monotonic()
        while True:
            await asyncio.sleep(self.config.timeouts_every)
            if not self.shards:
                continue
            try:
                for row in await self.ops.expire_waits(self.shards):
                    self.table.unsubscribe(row)
                if time.monotonic() - last_cleanup > self.config.cleanup_every:
                    last_cleanup = time.monotonic()
                    await self.ops.delete_orphan_triggers(self.shards)
            except Exception:
                log.exception("timeout sweep failed; retrying")

    # -- watching -----------------------------------------------------------------------

    def _on_block(self, culprit: str, stalled: float) -> None:
        """Called from the watchdog's thread: the blocked checks' tasks hear of it."""
        line = f"event loop blocked for {stalled:.2f} s by trigger class {culprit}"
        rows = [
            row
            for c in list(self.runner.running)
            if type(c.trigger).classpath() == culprit
            for row in c.subscribers
        ]
        # The outbox belongs to the loop's thread: hand the lines over there.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.outbox.log, rows, line)
