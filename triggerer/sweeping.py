"""The timeout sweep: ends the waits whose own timeout passed (read through the index on
the wait's timeout: only those due), and now and then deletes the trigger rows nobody
waits on and (the holder of shard 0) prunes old events. The trigger rows looked at are
those the change log names (a wait left them: repair.py), not every trigger row of its
shards: that sweep read every idle wait each minute."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from executor.driver.faults import Backoff

from .checks import CheckTable
from .config import TriggererConfig
from .repair import Repair
from .store import TriggererStore

log = logging.getLogger("slotless.triggerer")


class Sweep:
    def __init__(
        self,
        ops: TriggererStore,
        table: CheckTable,
        repair: Repair,
        config: TriggererConfig,
        *,
        shards: Callable[[], set[int]],
        fenced: Callable[[], bool],
    ) -> None:
        self._ops = ops
        self._table = table
        self._repair = repair
        self._shards = shards  # the shards held now
        self._fenced = fenced
        self._config = config  # read at each use: a test may change it while serving

    async def run(self) -> None:
        last_cleanup = time.monotonic()
        backoff = Backoff("triggerer: timeout sweep", log)
        while True:
            await asyncio.sleep(self._config.timeouts_every)
            # The shards are asked afresh at each step: a renewal may change them meanwhile.
            if not self._shards() or self._fenced():
                continue
            try:
                for row in await self._ops.expire_waits(self._shards()):
                    self._table.unsubscribe(row)
                if time.monotonic() - last_cleanup > self._config.cleanup_every:
                    last_cleanup = time.monotonic()
                    await self._repair.delete_unwaited_changed(self._shards())
                    if 0 in self._shards():  # one triggerer prunes events: shard 0's holder
                        await self._ops.prune_events(self._config.event_retention)
                backoff.succeeded()
            except Exception as exc:
                await asyncio.sleep(backoff.failed(exc))
