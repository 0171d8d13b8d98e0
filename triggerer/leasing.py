"""A triggerer's shards: leased, renewed, given back, and taken from a dead peer.

Two loops of the triggerer (triggerer/service.py) run here:

* leases   - renew this triggerer's shards, take its fair share, give back the excess;
             forget the checks of shards no longer ours;
* liveness - every ``liveness_every`` s, ask whether each other lease holder still holds
             its liveness lock (executor/driver/liveness.py); free a dead one's shards
             and take them at once, without waiting for the lease TTL.

While the last renewal may have lapsed (a pause, failed renewals, our liveness lock lost)
the triggerer is *fenced*: it checks nothing until a renewal says which shards are still
its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from executor.driver.faults import Backoff
from executor.driver.liveness import Liveness

from .checks import CheckTable
from .config import TriggererConfig
from .store import TriggererStore

log = logging.getLogger("slotless.triggerer")


class LeasedShards(set[int]):
    """The shards a triggerer leases: one set, changed in place by the leases and read live
    by the loader during a load. ``taken_at`` numbers each shard's latest taking (a shard
    lost and taken back between two looks is taken again): a reconcile or a repair reads
    in full only the shards taken since it last looked (:meth:`taken_since`), the others
    by the change log alone."""

    def __init__(self) -> None:
        super().__init__()
        self.takings = 0
        self.taken_at: dict[int, int] = {}

    def take(self, shards: set[int]) -> None:
        for shard in sorted(shards - self):
            self.takings += 1
            self.taken_at[shard] = self.takings
            self.add(shard)

    def give(self, shards: set[int]) -> None:
        self -= shards

    def taken_since(self, takings: int) -> set[int]:
        """The shards held now that were taken after ``takings`` (a past ``self.takings``)."""
        return {s for s in self if self.taken_at.get(s, 0) > takings}


class Leases:
    def __init__(
        self,
        ops: TriggererStore,
        owner: str,
        liveness: Liveness,
        table: CheckTable,
        config: TriggererConfig,
        *,
        wake_checker: asyncio.Event,
        moved: Callable[[], None],
        lag: Callable[[], float],
    ) -> None:
        self._ops = ops
        self._owner = owner
        self._liveness = liveness
        self._table = table
        self._config = config  # read at each use: a test may change it while serving
        self._wake_checker = wake_checker  # fenced checks may go on after a renewal
        self._moved = moved  # the shards held changed: reload them
        self._lag = lag  # the loop's lag (seconds), announced with each renewal
        # The shards leased, changed in place (the loader reads it live during a load).
        self.shards = LeasedShards()
        # Monotonic time until which the last renewal covers our shards: past it (we were
        # paused, or renewals fail) we check nothing and write no fire until renewed.
        self._valid_until = 0.0
        self.wake = asyncio.Event()  # renew now (a fenced checker asks)
        self._take_freed = False  # a dead peer's shards were freed: take them all at once
        self.takeovers = 0  # dead triggerers whose shards we freed (the metrics)
        self.shards_lost = 0  # shards found taken when we renewed

    def fenced(self) -> bool:
        """Whether our leases may have lapsed (a pause, failed renewals, our liveness lock
        lost): then nothing is checked until a renewal says which shards are still ours."""
        return time.monotonic() >= self._valid_until or not self._liveness.held

    async def renewing(self) -> None:
        backoff = Backoff("triggerer: renewing shard leases", log)
        while True:
            self.wake.clear()
            try:
                await self._renew()
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(min(backoff.failed(exc), self._config.lease_every))
                continue
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that
                # races the event being set, and stop() then waits for this loop forever.
                async with asyncio.timeout(self._config.lease_every):
                    await self.wake.wait()

    async def _renew(self) -> None:
        began = time.monotonic()
        released: set[int] = set()  # given back to a newcomer, not lost
        take_free, self._take_freed = self._take_freed, False
        ttl = self._config.lease_ttl
        try:
            shards = await self._ops.lease_shards(
                self._owner, ttl, ttl, released, take_free=take_free
            )
        except BaseException:
            self._take_freed |= take_free  # the next try takes them
            raise
        if shards != self.shards:
            if gone := self.shards - shards:
                # Out of the live set first: a load in flight (it awaits between its pages)
                # takes no row of theirs from now on (loading.py reads this very set).
                self.shards.give(gone)
                # Fenced until their checks are forgotten (the drop yields to the loop): no
                # check of a shard given away or lost starts after the renewal that found
                # it gone, so no wait is checked by two triggerers past one renewal.
                self._valid_until = 0.0
                await self._drop_shards(gone)
            if lost := gone - released:
                self.shards_lost += len(lost)
                log.warning(
                    "triggerer %s lost %d shards (its leases lapsed: paused, or cut "
                    "off from the database?): stopped checking them", self._owner, len(lost)
                )  # fmt: skip
            log.info("triggerer %s holds %d shards", self._owner, len(shards))
            # Changed in place, never replaced: the loader holds this set while it loads.
            self.shards.take(shards)
            self._moved()
        # Our leases run from the transaction's start; keep a tenth in hand.
        self._valid_until = began + ttl * 0.9
        self._wake_checker.set()  # fenced checks may go on
        await self._ops.triggerer_beat(self._owner, self._table.subscriptions, self._lag() * 1000)

    async def _drop_shards(self, gone: set[int]) -> None:
        """Forget the checks of shards no longer ours, a 64th of the table at a time: half
        of a million dropped at once held the loop 1.8 s. Meanwhile we are fenced, so none
        of theirs starts; one already running fires nothing (the outbox writes only for
        shards still leased); one dropped meanwhile is left as it is (``drop`` forgets
        only what is still held)."""
        table = self._table
        for checks in table.by_hash.value_chunks():
            for check in checks:
                if check.shard in gone:
                    table.drop(check)
            await asyncio.sleep(0)

    async def watching_peers(self) -> None:
        backoff = Backoff("triggerer: watching the other triggerers' liveness", log)
        while True:
            await asyncio.sleep(self._config.liveness_every)
            try:
                owners = await self._ops.other_triggerers(self._owner)
                dead = set(owners) - await self._liveness.alive(owners)
                for owner in sorted(dead):
                    freed = await self._ops.forget_triggerer(owner)
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
                    self.wake.set()
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(min(backoff.failed(exc), self._config.liveness_every))
