"""The sync worker: claim runnable tasks, run each in a slot, report back in batches.

One loop, read top to bottom in :meth:`Worker.run`: in one transaction, record every
attempt that finished meanwhile and claim as many tasks as there are free slots; start
each in a slot; sleep until a slot frees, the database signals new work (PostgreSQL
LISTEN/NOTIFY) or the poll interval passes. Beside it, a housekeeper heartbeats in-flight
rows and takes back the rows of workers that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import date
from functools import partial
from typing import Any

from . import sensing
from .context import TaskContext, TaskDeferred
from .dag import DAG, SensorSpec, TaskSpec
from .loader import load_dag
from .outcomes import Kind, Outcome, SlotInterval
from .slots import ProcessSlots, Result, ThreadSlots
from .statemachine import expansion_problem
from .store import Row, Store
from .store.db import TASKS_CHANNEL

log = logging.getLogger("slotless.worker")


@dataclass(slots=True)
class _RunInfo:
    dag: DAG | None
    dag_id: str
    logical_date: date
    problem: str | None = None


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
        if isolation not in ("thread", "process"):
            raise ValueError(f"unknown isolation {isolation!r}: use thread or process")
        self.store = store
        self.slots = slots
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self._runner = ThreadSlots(slots) if isolation == "thread" else ProcessSlots(slots)
        # Sensor checks are async code on a short-lived loop: always in a thread.
        self._runner_for_sensors = (
            self._runner if isinstance(self._runner, ThreadSlots) else ThreadSlots(slots)
        )
        self._dags_by_id = dict(dags or {})
        self._runs: dict[str, _RunInfo] = {}
        self._poll = poll_interval
        self._heartbeat_every = heartbeat_interval
        self._stale_after = stale_after
        self._rand = rand
        self._on_defer = on_defer  # e.g. wake an in-process triggerer at once
        self._free = list(range(slots - 1, -1, -1))  # slot numbers, popped from the end
        self._in_flight: dict[int, str] = {}  # row id -> claim owner, until flushed
        self._done: list[Outcome] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._claims = 0
        self.completed = 0
        # Called after each exchange with (outcomes recorded, rows claimed): the metrics.
        self.on_exchange: Callable[[list[Outcome], list[Row]], None] | None = None

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
            for runner in {self._runner, self._runner_for_sensors}:
                runner.shutdown()

    async def _exchange(self, limit: int) -> list[Row]:
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
        if self._on_defer is not None and any(o.kind is Kind.DEFER for o in batch):
            self._on_defer()
        for row in claimed:
            self._in_flight[row["id"]] = owner
        self.completed += len(batch)
        if self.on_exchange is not None:
            self.on_exchange(batch, claimed)
        return claimed

    async def _run_one(self, row: Row, slot: int) -> None:
        owner = self._in_flight[row["id"]]
        release = asyncio.Event()
        started = time.time()
        try:
            outcome = await self._attempt(row, owner, release)
        except Exception as exc:  # a bug of ours must fail the attempt, not the worker
            log.exception("worker error on task row %s", row["id"])
            release.set()
            outcome = self._outcome(row, owner, Kind.ERROR, message=f"worker error: {exc!r}")
        kind = outcome.slot_kind or ("resume" if row["next_method"] else "execute")
        outcome.slot = SlotInterval(self.worker_id, slot, kind, started, time.time())
        self._done.append(outcome)
        self._wake.set()
        await release.wait()
        self._free.append(slot)
        self._wake.set()

    async def _attempt(self, row: Row, owner: str, release: asyncio.Event) -> Outcome:
        info = await self._run_info(row["run_id"])
        spec = info.dag.tasks.get(row["task_id"]) if info.dag else None
        if spec is None:
            why = info.problem or f"task {row['task_id']!r} is not in DAG {info.dag_id!r}"
            return self._refuse(row, owner, release, why)
        ctx = TaskContext(
            run_id=row["run_id"],
            dag_id=info.dag_id,
            task_id=row["task_id"],
            logical_date=info.logical_date,
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            inputs=await self._inputs(row, spec),
            map_index=row["map_index"],
            item=json.loads(row["item"]) if row["item"] is not None else None,
            total=row["map_total"] if row["map_index"] >= 0 else None,
            event=json.loads(row["event"]) if row["event"] is not None else None,
        )
        if spec.sensor is not None:
            return await self._sense(row, owner, spec, spec.sensor, ctx, release)
        job: Callable[[], Any] = partial(spec, ctx)
        method = row["next_method"]
        if method and method != "__call__":
            fn = spec.methods.get(method)
            if fn is None:
                return self._refuse(
                    row, owner, release, f"cannot resume: {spec.task_id} has no method "
                    f"{method!r} (register it with @task.method)",
                )  # fmt: skip
            job = partial(fn, ctx, **json.loads(row["next_kwargs"] or "{}"))
        result = await self._runner.run(job, ctx, spec.execution_timeout, release)
        if result.deferred is not None:
            return self._deferred(row, owner, spec, ctx, result.deferred)
        return self._judge(row, owner, spec, ctx, result)

    def _deferred(
        self, row: Row, owner: str, spec: TaskSpec, ctx: TaskContext, d: TaskDeferred
    ) -> Outcome:
        now = time.time()
        try:
            if d.method != "__call__" and d.method not in spec.methods:
                # Say so now, not after a wait of hours ends in "cannot resume".
                raise ValueError(
                    f"{spec.task_id} has no method {d.method!r} to resume at "
                    "(register it with @task.method)"
                )
            deferral = sensing.deferral(
                d.trigger,
                method=d.method,
                method_kwargs=d.kwargs,
                wait_started_at=now,
                timeout=d.timeout,
            )
        except Exception as exc:
            o = self._outcome(
                row,
                owner,
                Kind.ERROR,
                spec=spec,
                retry=False,
                message=f"cannot defer on {d.trigger.describe()}: {exc}",
            )
        else:
            o = self._outcome(row, owner, Kind.DEFER)
            o.deferral = deferral
        o.logs = ctx._logs
        return o

    def _refuse(self, row: Row, owner: str, release: asyncio.Event, why: str) -> Outcome:
        """Fail the attempt before it ran, without retrying: retrying cannot change ``why``."""
        release.set()
        return self._outcome(row, owner, Kind.ERROR, message=why, retry=False)

    async def _sense(
        self,
        row: Row,
        owner: str,
        spec: TaskSpec,
        sensor: SensorSpec,
        ctx: TaskContext,
        release: asyncio.Event,
    ) -> Outcome:
        """A sensor's turn: defer it, or check in the slot (poke / reschedule)."""
        now = time.time()
        started = row["wait_started_at"] or now
        deadline = started + sensor.timeout
        try:
            trigger = sensor.trigger.render(sensing.template_values(ctx))
        except Exception as exc:
            return self._refuse(row, owner, release, f"cannot render the sensor's trigger: {exc}")
        mode = sensor.mode
        if mode == "deferrable":
            try:
                deferral = sensing.deferral(
                    trigger,
                    method=None,
                    method_kwargs={},
                    wait_started_at=started,
                    timeout=sensor.timeout,
                    soft_fail=sensor.soft_fail,
                )
            except Exception as exc:
                mode = "reschedule"
                ctx.log(f"cannot defer ({exc}); falling back to reschedule mode")
            else:
                release.set()
                o = self._outcome(row, owner, Kind.DEFER)
                o.deferral = deferral
                o.logs = ctx._logs
                return o
        job = partial(
            sensing.sense,
            trigger,
            sensor,
            hold_slot=mode == "poke",
            deadline=deadline,
            main_loop=asyncio.get_running_loop(),
            store=self.store,
            log=ctx.log,
            check_timeout=spec.execution_timeout,
        )
        result = await self._runner_for_sensors.run(job, ctx, None, release)
        if not result.ok:
            o = self._outcome(row, owner, Kind.ERROR, message=result.message, spec=spec)
            o.traceback = result.traceback
        elif result.value.timed_out:
            o = self._outcome(row, owner, Kind.SENSOR_TIMEOUT)
            o.message = (
                f"sensor timeout: {trigger.describe()} did not hold within {sensor.timeout:g} s"
            )
            o.extra["soft_fail"] = sensor.soft_fail
        elif result.value.event is None:
            o = self._outcome(row, owner, Kind.RESCHEDULE)
            o.extra.update(
                ready_at=time.time() + sensor.interval, wait_started_at=started, timeout_at=deadline
            )
            o.message = f"checked {trigger.describe()}: not yet; next in {sensor.interval:g} s"
        elif result.value.event.error:
            o = self._outcome(row, owner, Kind.ERROR, message=result.value.event.error, spec=spec)
        else:
            o = self._outcome(row, owner, Kind.SUCCESS)
            o.output_json = json.dumps(result.value.event.payload)
            ctx.log(f"condition held: {trigger.describe()}")
        o.slot_kind = "poke" if mode == "poke" else "execute"
        o.logs = ctx._logs
        return o

    async def _inputs(self, row: Row, spec: TaskSpec) -> dict[str, Any]:
        source = spec.expand if row["map_index"] >= 0 else None
        if not any(p != source for p in spec.parents):
            return {}  # no query: the common case of a root or a mapped instance
        return await self.store.parent_outputs(row)

    def _judge(self, row: Row, owner: str, spec: TaskSpec, ctx: TaskContext, r: Result) -> Outcome:
        """Turn a callable's result into what the store records."""
        if not r.ok:
            o = self._outcome(row, owner, Kind.ERROR, message=r.message, spec=spec)
            o.traceback = r.traceback
            o.logs = ctx._logs
            return o
        try:
            value = json.loads(r.value) if r.value_is_json else r.value
            output_json = r.value if r.value_is_json else json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            o = self._outcome(
                row, owner, Kind.ERROR, spec=spec, message=f"output cannot be stored as JSON: {exc}"
            )
            o.logs = ctx._logs
            return o
        problem, skip = self._check_output(spec, value, row["map_index"] >= 0)
        if problem:
            o = self._outcome(row, owner, Kind.ERROR, message=problem, spec=spec)
        else:
            o = self._outcome(row, owner, Kind.SUCCESS)
            o.output_json = output_json
            o.skip_children = skip
        o.logs = ctx._logs
        return o

    def _check_output(
        self, spec: TaskSpec, value: Any, is_instance: bool
    ) -> tuple[str | None, list[str]]:
        """Problems that fail the task itself: a bad fan-out source, a bad branch choice."""
        # An instance's output is one item of what its consumer maps over, not the list.
        for consumer in [] if is_instance else spec.dag.mapped_consumers(spec.task_id):
            problem = expansion_problem(spec.task_id, value, consumer.effective_map_cap())
            if problem:
                return f"{problem} (mapped task {consumer.task_id})", []
        if not spec.branch:
            return None, []
        chosen = [value] if isinstance(value, str) else value
        children = spec.dag.children(spec.task_id)
        if not isinstance(chosen, list) or not all(isinstance(c, str) for c in chosen):
            return (
                f"branch {spec.task_id} must return a child id or a list of them, not {value!r}"
            ), []
        unknown = [c for c in chosen if c not in children]
        if unknown:
            return (
                f"branch {spec.task_id} chose {', '.join(unknown)}, which is not one of "
                f"its children ({', '.join(children) or 'none'})"
            ), []
        return None, [c for c in children if c not in chosen]

    def _outcome(
        self,
        row: Row,
        owner: str,
        kind: Kind,
        *,
        message: str = "",
        spec: TaskSpec | None = None,
        retry: bool = True,
    ) -> Outcome:
        attempt, max_attempts = row["attempt"], row["max_attempts"]
        delay = 0.0
        if kind is Kind.ERROR and spec is not None:
            delay = spec.retry_delay_for(attempt, self._rand())
        return Outcome(
            row_id=row["id"],
            owner=owner,
            attempt=attempt,
            max_attempts=max_attempts if retry else attempt,
            kind=kind,
            message=message,
            retry_delay=delay,
            run_id=row["run_id"],
        )

    async def _run_info(self, run_id: str) -> _RunInfo:
        info = self._runs.get(run_id)
        if info is not None:
            return info
        run = await self.store.run_info(run_id)
        if run is None:
            info = _RunInfo(None, "?", date.today(), problem=f"run {run_id} not found")
        else:
            logical = date.fromisoformat(run["logical_date"])
            dag = self._dags_by_id.get(run["dag_id"])
            problem = None
            if dag is None and run["dag_file"]:
                try:
                    dag = load_dag(run["dag_file"], run["dag_id"])
                except Exception as exc:
                    problem = f"cannot load DAG {run['dag_id']}: {exc}"
            elif dag is None:
                problem = f"DAG {run['dag_id']} is unknown to this worker and has no file"
            info = _RunInfo(dag, run["dag_id"], logical, problem)
        self._runs[run_id] = info
        return info

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
                    await self.store.heartbeat(owner, ids)
                if time.monotonic() - last_reap >= self._stale_after / 2:
                    last_reap = time.monotonic()
                    if await self.store.reap(self._stale_after):
                        self._wake.set()
            except Exception:
                log.exception("heartbeat failed; will try again")
