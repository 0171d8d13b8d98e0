"""The triggerer: one asyncio process that holds every wait and checks each condition once.

:meth:`Triggerer.run` starts seven small loops over shared state:

* leases   - renew this triggerer's shards, take its fair share, give back the excess;
* loading  - read new DEFERRED waits of its shards (a full reload when shards change);
* listening- wake the loader when the database signals new trigger rows (PostgreSQL NOTIFY);
* checking - pop due checks off the heap, run them with bounded concurrency, batched by
             trigger class where the class can check many at once;
* writing  - flush fired events, failures and sampled check logs, one transaction a batch;
* timeouts - end waits whose own timeout passed, and delete trigger rows nobody needs;
* watching - measure loop lag and name the trigger class that blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from executor.store import Store
from executor.store.db import TRIGGERS_CHANNEL
from triggers.base import BaseTrigger, TransientError, TriggerEvent, shard_of
from triggers.checking import CheckContext, check_once
from triggers.registry import TriggerLoadError, load_trigger

from .checks import Check, CheckTable, Subscriber
from .store import Fire, TriggererBatch, TriggererStore
from .watchdog import LoopWatch

log = logging.getLogger("slotless.triggerer")

TRANSIENT = (TransientError, OSError, TimeoutError, ConnectionError)


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
        self.config = config or TriggererConfig()
        self.clock = clock
        self.table = CheckTable()
        self.shards: set[int] = set()
        self.ctx = CheckContext(store.external_states, clock=clock)
        self.watch = LoopWatch(on_block=self._on_block)
        self.checks_done = 0
        self.checks_failed = 0
        self.events_fired = 0
        # Called after each check call with (trigger classpath, triggers checked, seconds).
        self.on_check_call: Callable[[str, int, float], None] | None = None
        self._batch = TriggererBatch()
        self._max_trigger_id = 0
        self._loaded_beyond: set[int] = set()  # trigger ids above a full reload's `newest`
        self._wake_checker = asyncio.Event()
        self._wake_loader = asyncio.Event()
        self._reload = True
        self._sem = asyncio.Semaphore(self.config.max_concurrency)
        self._running: set[Check] = set()
        self._check_tasks: set[asyncio.Task[None]] = set()
        self._calls = 0  # check calls in flight (one call may check a batch)
        self._stopping = asyncio.Event()
        self._loaded_once = asyncio.Event()

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
            for task in [*tasks, *self._check_tasks]:
                task.cancel()
            await asyncio.gather(*tasks, *self._check_tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._flush()
                await self.ops.triggerer_leave(self.id)
            await self.ctx.aclose()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._check_tasks.add(task)
        task.add_done_callback(self._check_tasks.discard)

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
                    await self._load(full=True)
                    self._loaded_once.set()
                else:
                    await self._load(full=False)
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

    async def _load(self, *, full: bool) -> None:
        shards = sorted(self.shards)
        if not shards:
            return
        # A full reload reads a few shards per query, so that 100,000 rows never sit in
        # memory at once (their pages would stay in the RSS) nor hold the connection for
        # half a second. Rows written meanwhile get ids above `newest`, where the next
        # incremental load starts; it skips those the reload already took.
        newest = await self.ops.max_trigger_id() if full else 0
        if full:
            self._loaded_beyond.clear()
        step = self.config.load_shards_per_query if full else len(shards)
        seen: set[int] = set()
        for first in range(0, len(shards), step):
            after = 0 if full else self._max_trigger_id
            rows = await self.ops.load_triggers(shards[first : first + step], after)
            now = self.clock()
            parsed: dict[tuple[str, str], BaseTrigger | TriggerLoadError] = {}
            for i, row in enumerate(rows):
                if i % 2000 == 1999:
                    await asyncio.sleep(0)  # 100,000 rows must not stall the loop for a second
                task_row = row["task_row"]
                seen.add(task_row)
                if full:
                    if row["trigger_id"] > newest:
                        self._loaded_beyond.add(row["trigger_id"])
                else:
                    self._max_trigger_id = max(self._max_trigger_id, row["trigger_id"])
                    if row["trigger_id"] in self._loaded_beyond:
                        continue  # this full reload's, held or already fired: not again
                held = self.table.by_row.get(task_row)
                if held is not None:
                    sub_held = held.subscribers.get(task_row)
                    if sub_held is not None and sub_held.trigger_id == row["trigger_id"]:
                        continue
                    self.table.unsubscribe(task_row)  # it deferred again, on a new trigger
                key = (row["classpath"], row["kwargs"])
                if key not in parsed:
                    try:
                        parsed[key] = load_trigger(row["classpath"], row["kwargs"])
                    except TriggerLoadError as exc:
                        parsed[key] = exc
                    except Exception as exc:  # a module that fails to import: this row only
                        parsed[key] = TriggerLoadError(f"{type(exc).__name__}: {exc}")
                trigger = parsed[key]
                waits = {task_row: row["trigger_id"]}
                if isinstance(trigger, TriggerLoadError):
                    self._batch.failures.append((waits, f"cannot load trigger: {trigger}"))
                    continue
                sub = Subscriber(
                    task_row,
                    row["trigger_id"],
                    trigger.poke_interval,
                    row["next_method"] is not None,
                )
                try:  # first_check_at is the trigger's code
                    self.table.subscribe(
                        row["poke_hash"], trigger, shard_of(row["poke_hash"]), sub, now
                    )
                except Exception as exc:
                    self.table.unsubscribe(task_row)
                    self._batch.failures.append(
                        (waits, f"cannot schedule {trigger.describe()}: {exc!r}")
                    )
        if full:
            self._max_trigger_id = max(self._max_trigger_id, newest)
            for task_row in [r for r in self.table.by_row if r not in seen]:
                self.table.unsubscribe(task_row)  # resumed, timed out or failed elsewhere
        self._wake_checker.set()

    # -- checking -----------------------------------------------------------------------

    async def _checking(self) -> None:
        while True:
            # Cleared first, so that a call ending or a load meanwhile wakes the wait below.
            self._wake_checker.clear()
            if self._dispatch(self.clock()):
                await asyncio.sleep(0)  # let the dispatched checks start
                continue
            if self._calls >= self.config.max_concurrency:
                wait = 1.0  # full: the next call to end wakes us
            else:
                nxt = self.table.next_due()
                wait = self.config.sync_every if nxt is None else max(0.0, nxt - self.clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(wait, 1.0)):  # not wait_for: see _loading
                    await self._wake_checker.wait()

    def _dispatch(self, now: float) -> bool:
        """Start due checks while fewer than ``max_concurrency`` calls are in flight.

        The heap is the queue: a due check stays there until a call can take it, instead
        of waiting as a Task of its own (100,000 waiting Tasks would cost memory and stall
        the loop in garbage collection). A batched class takes up to ``batch_size`` checks
        per call. Returns whether any check was started.
        """
        # At most `wave` calls per round: Tasks alive at a collection of the young
        # generations are promoted to the old one, and the more are promoted, the
        # sooner a full collection (a stall at 100,000 waits) comes.
        room = min(self.config.max_concurrency - self._calls, self.config.wave)
        if room <= 0:
            return False
        size = self.config.batch_size
        groups: dict[type[BaseTrigger], list[Check]] = {}
        started = False
        for check in self.table.pop_due(now, 10 * size):
            started = True
            check.running = True
            self._running.add(check)
            cls = type(check.trigger)
            if cls.is_batched() and not cls.is_push():
                group = groups.setdefault(cls, [])
                if not group:
                    room -= 1  # a new call
                group.append(check)
                if len(group) == size:
                    self._start_call(cls, group)
                    groups[cls] = []
            else:
                room -= 1
                self._start_call(cls, [check])
            if room <= 0:
                break
        for cls, group in groups.items():
            if group:
                self._start_call(cls, group)
        return started

    def _start_call(self, cls: type[BaseTrigger], checks: list[Check]) -> None:
        self._calls += 1
        self._spawn(self._run_checks(cls, checks))

    async def _run_checks(self, cls: type[BaseTrigger], checks: list[Check]) -> None:
        async with self._sem:
            results: list[Any]
            began = time.perf_counter()
            try:
                # asyncio.timeout: unlike wait_for on 3.11, no extra Task per call.
                async with asyncio.timeout(self.config.check_timeout):
                    results = list(await self._call(cls, checks))
                if len(results) != len(checks):
                    raise RuntimeError(
                        f"{cls.classpath()}.poke_many returned {len(results)} "
                        f"results for {len(checks)} triggers"
                    )
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                results = [
                    TimeoutError(f"check took longer than {self.config.check_timeout:g} s")
                ] * len(checks)
            except Exception as exc:
                results = [exc] * len(checks)
            if self.on_check_call is not None:
                self.on_check_call(cls.classpath(), len(checks), time.perf_counter() - began)
        self._calls -= 1
        now = self.clock()
        for check, result in zip(checks, results, strict=True):
            check.running = False
            self._running.discard(check)
            self._settle(check, result, now)
        self._wake_checker.set()

    async def _call(self, cls: type[BaseTrigger], checks: list[Check]) -> Any:
        if len(checks) > 1 or (cls.is_batched() and not cls.is_push()):
            return await cls.poke_many([c.trigger for c in checks], self.ctx)
        # No push_wait: the call is already bounded by check_timeout.
        return [await check_once(checks[0].trigger, self.ctx)]

    def _settle(self, check: Check, result: Any, now: float) -> None:
        if self.table.by_hash.get(check.poke_hash) is not check:
            return  # dropped meanwhile (shard lost, every subscriber gone)
        try:
            self._settle_result(check, result, now)
        except Exception as exc:  # the trigger's own code (payload, next_check_at) failed
            self.checks_failed += 1
            self.table.drop(check)
            self._batch.failures.append(
                (_waits(check), f"cannot handle the result of {check.trigger.describe()}: "
                                f"{type(exc).__name__}: {exc}")
            )  # fmt: skip

    def _settle_result(self, check: Check, result: Any, now: float) -> None:
        check.checks += 1
        self.checks_done += 1
        where = check.trigger.describe()
        if isinstance(result, TriggerEvent):
            if result.error:
                msg = f"trigger {where} reported an error: {result.error}"
            else:
                msg = f"trigger fired: {where} (after {check.checks} checks)"
            payload = json.dumps(result.payload)  # before anything is dropped: it may fail
            self.table.drop(check)
            self.events_fired += 1
            self._batch.fires.append(
                Fire(_waits(check), payload, msg, error=msg if result.error else None)
            )
            return
        if isinstance(result, BaseException) and not isinstance(result, TRANSIENT):
            self.checks_failed += 1
            self.table.drop(check)
            tb = "".join(traceback.format_exception(result)).rstrip()
            self._batch.failures.append(
                (_waits(check), f"trigger {where} raised {type(result).__name__}: {result}\n{tb}")
            )
            return
        if isinstance(result, BaseException):
            self.checks_failed += 1
            check.failures += 1
            delay = min(self.config.max_backoff, check.interval * 2 ** min(check.failures, 10))
            line = (
                f"check of {where} failed ({type(result).__name__}: {result}); "
                f"retry {check.failures} in {delay:g} s"
            )
            self._log_check(check, line, force=check.failures == 1)
            self.table.schedule(check, now + delay)
            return
        check.failures = 0
        line = f"checked {where}: not yet; next in {check.interval:g} s"
        self._log_check(check, line)
        self.table.schedule(check, check.trigger.next_check_at(now, check.interval))

    def _log_check(self, check: Check, line: str, force: bool = False) -> None:
        # Sampled so that a six-hour wait stays readable: checks 1, 2, 4, 8, 16, ...
        n = check.checks
        if force or n & (n - 1) == 0 or line != check.last_result:
            self._batch.logs.extend((row, line) for row in check.subscribers)
        check.last_result = line

    def _on_block(self, culprit: str, stalled: float) -> None:
        line = f"event loop blocked for {stalled:.2f} s by trigger class {culprit}"
        rows = [
            row
            for c in list(self._running)
            if type(c.trigger).classpath() == culprit
            for row in c.subscribers
        ]
        # Called from the watchdog thread: hand the log lines to the loop thread.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._batch.logs.extend, [(row, line) for row in rows])

    # -- writing ------------------------------------------------------------------------

    async def _writing(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_every)
            try:
                await self._flush()
            except Exception:
                log.exception("writing events failed; retrying")

    async def _flush(self) -> None:
        batch, self._batch = self._batch, TriggererBatch()
        if not batch:
            return
        try:
            await self.ops.triggerer_commit(batch)
        except Exception:
            # Keep them: a fire written twice is harmless (compare-and-set), one lost is not.
            self._batch.fires[:0] = batch.fires
            self._batch.failures[:0] = batch.failures
            self._batch.logs[:0] = batch.logs
            raise

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


def _waits(check: Check) -> dict[int, int]:
    """The tasks a check answers, each with the trigger row it waits on."""
    return {row: sub.trigger_id for row, sub in check.subscribers.items()}
