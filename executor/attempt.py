"""One attempt of a claimed task: from its row to the outcome the worker reports.

:meth:`Attempts.run` finds the task's DAG (cached per run), builds ``ctx``, and either
runs the callable (or the method a deferral named) in a slot, defers a deferrable sensor
at once, or checks a poke / reschedule sensor in a slot; then judges the result: the
output must be storable JSON, a fan-out source must return a list within its cap, a
branch must name its own children. Nothing here touches the database but reading the
run and the task's inputs; the worker records what this returns.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import pulling, sensing
from .catalogue import DEFAULT_PARSE_TIMEOUT, parse_file
from .context import TaskContext, TaskDeferred
from .dag import DAG, SensorSpec, TaskSpec
from .loader import DagImportError, is_loaded, load_dag
from .outcomes import (
    Deferred,
    Failed,
    Outcome,
    Rescheduled,
    SensorTimedOut,
    Succeeded,
)
from .params import BadConf, resolve
from .rows import MovedTask
from .runnames import logical_shown, midnight
from .slots import ProcessSlots, Result, ThreadSlots
from .statemachine import expansion_problem
from .store import Exchange, Views
from .store.values import Values
from .templating import Scope, TemplateFailed, render_value, utc


@dataclass(slots=True)
class _RunInfo:
    dag: DAG | None
    dag_id: str
    logical_date: date
    problem: str | None = None
    params: Any = None  # the DAG's params with the run's conf (executor.params.resolve)
    data_interval: tuple[datetime, datetime] | None = None
    start_event: Any = None
    shown: str | None = None  # its logical time for people (executor.runnames)
    # What its templates see beyond the above (executor/templating.py: Scope)
    logical_time: datetime | None = None  # aware
    zone: ZoneInfo = field(
        default_factory=lambda: ZoneInfo("UTC")
    )  # the DAG's clock, on which logical_date is the date
    conf: dict[str, Any] | None = None  # as triggered
    run_type: str = "manual"

    def scope(self, run_id: str, task_id: str, params: Any) -> Scope:
        """What a task's templates are rendered for."""
        return Scope(
            dag_id=self.dag_id,
            logical_time=self.logical_time or midnight(self.logical_date, self.zone),
            zone=self.zone,
            run_id=run_id,
            task_id=task_id,
            params=params,
            conf=self.conf,
            run_type=self.run_type,
            data_interval=self.data_interval,
        )


class Attempts:
    """Runs claimed rows in slots and says how each attempt ended."""

    def __init__(
        self,
        exchange: Exchange,
        views: Views,
        *,
        slots: int,
        isolation: str,
        dags: dict[str, DAG],
        rand: Callable[[], float],
        dag_import_timeout: float = DEFAULT_PARSE_TIMEOUT,
    ) -> None:
        if isolation not in ("thread", "process"):
            raise ValueError(f"unknown isolation {isolation!r}: use thread or process")
        self.exchange = exchange
        self.views = views
        self.values = Values(exchange.db, exchange.clock)  # ctx.pull's reads
        self.runner = ThreadSlots(slots) if isolation == "thread" else ProcessSlots(slots)
        # Sensor checks are async code on a short-lived loop: always in a thread.
        self.sensor_runner = (
            self.runner if isinstance(self.runner, ThreadSlots) else ThreadSlots(slots)
        )
        self._dags_by_id = dags
        self._runs: dict[str, _RunInfo] = {}
        self._run_locks: dict[str, asyncio.Lock] = {}
        self._rand = rand
        self._dag_import_timeout = dag_import_timeout
        # Each running attempt's context by task row, so that its worker can write the
        # lines it logs while it runs (ctx.lines grows in the slot); the worker forgets it.
        self.running: dict[int, TaskContext] = {}

    def shutdown(self) -> None:
        for runner in {self.runner, self.sensor_runner}:
            runner.shutdown()

    def stop(self, row_ids: list[int]) -> None:
        """Stop these rows' attempts: process isolation kills the child; a thread is
        interrupted at its next Python instruction (a call blocked in C returns first)."""
        for row_id in row_ids:
            self.runner.stop(row_id)

    def fence(self, until: float) -> None:
        """The worker's heartbeats cover its attempts until ``until`` (monotonic): a
        forked child still running past it stops by itself (executor/slots.py)."""
        self.runner.fence(until)

    async def run(self, row: MovedTask, owner: str, release: asyncio.Event) -> Outcome:
        """Run ``row``'s attempt; ``release`` is set when its slot may take another task."""
        info = await self._run_info(row.run_id)
        spec = info.dag.tasks.get(row.task_id) if info.dag else None
        if spec is None:
            why = info.problem or f"task {row.task_id!r} is not in DAG {info.dag_id!r}"
            return refuse(row, owner, release, why)
        ctx = TaskContext(
            run_id=row.run_id,
            dag_id=info.dag_id,
            task_id=row.task_id,
            logical_date=info.logical_date,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            inputs=await self._inputs(row, spec),
            map_index=row.map_index,
            item=json.loads(row.item) if row.item is not None else None,
            total=row.map_total if row.map_index >= 0 else None,
            event=json.loads(row.event) if row.event is not None else None,
            # Its own copy: a task that changes ctx.params changes nothing for another.
            params=copy.deepcopy(info.params),
            data_interval_start=info.data_interval[0] if info.data_interval else None,
            data_interval_end=info.data_interval[1] if info.data_interval else None,
            start_event=copy.deepcopy(info.start_event),
        )
        ctx._reader = await pulling.reader(
            spec, row.run_id, self.values, in_process=isinstance(self.runner, ProcessSlots)
        )
        self.running[row.id] = ctx
        scope = info.scope(row.run_id, row.task_id, ctx.params)
        if spec.sensor is not None:
            if row.next_method == sensing.SENSED:
                return self._sensed(row, owner, spec, ctx, release)
            return await self._sense(row, owner, spec, spec.sensor, ctx, scope, release)
        if spec.templates:
            # In a thread: a template is its author's code (and a first use compiles it).
            try:
                ctx.templates = await asyncio.to_thread(
                    render_value, spec.templates, scope, "templates"
                )
            except TemplateFailed as exc:
                return refuse(row, owner, release, f"cannot render the task's templates: {exc}")
        job: Callable[[], Any] = partial(spec, ctx)
        method = row.next_method
        if method and method != "__call__":
            fn = spec.methods.get(method)
            if fn is None:
                return refuse(
                    row, owner, release, f"cannot resume: {spec.task_id} has no method "
                    f"{method!r} (register it with @task.method)",
                )  # fmt: skip
            job = partial(fn, ctx, **json.loads(row.next_kwargs or "{}"))
        result = await self.runner.run(job, ctx, spec.execution_timeout, release, key=row.id)
        if result.deferred is not None:
            return self._deferred(row, owner, spec, ctx, result.deferred)
        return self._judge(row, owner, spec, ctx, result)

    def failed(
        self, row: MovedTask, owner: str, message: str, spec: TaskSpec | None = None
    ) -> Failed:
        """A failed attempt, retried per ``spec``'s policy (None: no delay)."""
        delay = spec.retry_delay_for(row.attempt, self._rand()) if spec is not None else 0.0
        return Failed(**_base(row, owner), message=message, retry_delay=delay)

    def _deferred(
        self, row: MovedTask, owner: str, spec: TaskSpec, ctx: TaskContext, d: TaskDeferred
    ) -> Outcome:
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
                wait_started_at=time.time(),
                timeout=d.timeout,
            )
        except Exception as exc:
            why = f"cannot defer on {d.trigger.describe()}: {exc}"
            return Failed(**_base(row, owner, final=True), message=why, logs=ctx.lines)
        return Deferred(**_base(row, owner), deferral=deferral, logs=ctx.lines)

    async def _sense(
        self,
        row: MovedTask,
        owner: str,
        spec: TaskSpec,
        sensor: SensorSpec,
        ctx: TaskContext,
        scope: Scope,
        release: asyncio.Event,
    ) -> Outcome:
        """A sensor's turn: defer it, or check in the slot (poke / reschedule)."""
        now = time.time()
        started = row.wait_started_at or now
        deadline = started + sensor.timeout
        try:
            trigger = await sensing.rendered(sensor.trigger, scope)
        except Exception as exc:
            return refuse(row, owner, release, f"cannot render the sensor's trigger: {exc}")
        mode = sensor.mode
        if mode == "deferrable":
            try:
                deferral = sensing.deferral(
                    trigger,
                    # A sensor with outlets comes back to a worker when its condition
                    # holds: its SUCCESS and its asset events are written together, from
                    # the DAG's own outlets, which only a process holding the DAG knows.
                    method=sensing.SENSED if spec.outlets else None,
                    method_kwargs={},
                    wait_started_at=started,
                    timeout=sensor.timeout,
                    soft_fail=sensor.soft_fail,
                )
            except sensing.TriggerTooLarge as exc:
                # Checking it in the slot instead would copy it into every log line.
                return refuse(row, owner, release, f"cannot defer: {exc}")
            except Exception as exc:
                mode = "reschedule"
                ctx.log(f"cannot defer ({exc}); falling back to reschedule mode")
            else:
                release.set()
                return Deferred(**_base(row, owner), deferral=deferral, logs=ctx.lines)
        job = partial(
            sensing.sense,
            trigger,
            sensor,
            hold_slot=mode == "poke",
            deadline=deadline,
            main_loop=asyncio.get_running_loop(),
            views=self.views,
            log=ctx.log,
            check_timeout=spec.execution_timeout,
        )
        result = await self.sensor_runner.run(job, ctx, None, release)
        o: Outcome
        if not result.ok:
            o = self.failed(row, owner, result.message, spec)
            o.traceback = result.traceback
        elif result.value.timed_out:
            why = f"sensor timeout: {trigger.describe()} did not hold within {sensor.timeout:g} s"
            o = SensorTimedOut(**_base(row, owner), message=why, soft_fail=sensor.soft_fail)
        elif result.value.event is None:
            o = Rescheduled(
                **_base(row, owner),
                message=f"checked {trigger.describe()}: not yet; next in {sensor.interval:g} s",
                ready_at=time.time() + sensor.interval,
                wait_started_at=started,
                timeout_at=deadline,
            )
        elif result.value.event.error:
            o = self.failed(row, owner, result.value.event.error, spec)
        else:
            ctx.log(f"condition held: {trigger.describe()}")
            o = Succeeded(
                **_base(row, owner),
                output_json=json.dumps(result.value.event.payload),
                asset_events=[(row.task_id, a.uri, None) for a in spec.outlets],
            )
        o.slot_kind = "poke" if mode == "poke" else "execute"
        o.logs = ctx.lines
        return o

    def _sensed(
        self, row: MovedTask, owner: str, spec: TaskSpec, ctx: TaskContext, release: asyncio.Event
    ) -> Outcome:
        """A deferred sensor with outlets whose condition held on the triggerer: its success,
        with the event as its output and its outlets' asset events."""
        release.set()
        ctx.log("condition held; recording its outlets' asset events")
        return Succeeded(
            **_base(row, owner),
            output_json=row.event if row.event is not None else "null",
            asset_events=[(row.task_id, a.uri, None) for a in spec.outlets],
            logs=ctx.lines,
        )

    async def run_dag(self, run_id: str) -> tuple[DAG | None, str, date | None, str | None]:
        """The run's DAG as its attempts find it (the worker's, else its file), its id, its
        logical date, and why it could not be loaded: for callbacks (executor/callbacks.py)."""
        info = await self._run_info(run_id)
        found = info.dag_id != "?"
        return info.dag, info.dag_id, info.logical_date if found else None, info.problem

    async def logical_shown(self, run_id: str) -> str | None:
        """The run's logical time as people read it, for its notifications (read once)."""
        return (await self._run_info(run_id)).shown

    async def _inputs(self, row: MovedTask, spec: TaskSpec) -> dict[str, Any]:
        if row.inputs is not None:
            return row.inputs  # read by the claim
        source = spec.map_source if row.map_index >= 0 else None
        if not any(p != source for p in spec.parents):
            return {}  # no query: the common case of a root or a mapped instance
        return await self.exchange.parent_outputs(row)

    def _judge(
        self, row: MovedTask, owner: str, spec: TaskSpec, ctx: TaskContext, r: Result
    ) -> Outcome:
        """Turn a callable's result into what the store records."""
        o: Outcome
        if not r.ok:
            o = self.failed(row, owner, r.message, spec)
            o.traceback = r.traceback
            o.logs = ctx.lines
            return o
        try:
            value = json.loads(r.value) if r.value_is_json else r.value
            output_json = r.value if r.value_is_json else json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            o = self.failed(row, owner, f"output cannot be stored as JSON: {exc}", spec)
            o.logs = ctx.lines
            return o
        problem, skip = check_output(spec, value, row.map_index >= 0)
        if problem:
            o = self.failed(row, owner, problem, spec)
        else:
            for uri in sorted(set(ctx._asset_extras) - {a.uri for a in spec.outlets}):
                ctx.log(f"ctx.asset_event({uri!r}): not one of this task's outlets, ignored")
            o = Succeeded(
                **_base(row, owner),
                output_json=output_json,
                skip_children=skip,
                values=dict(ctx._pushed),
                asset_events=[
                    (row.task_id, a.uri, ctx._asset_extras.get(a.uri)) for a in spec.outlets
                ],
            )
        o.logs = ctx.lines
        return o

    async def _run_info(self, run_id: str) -> _RunInfo:
        info = self._runs.get(run_id)
        if info is not None:
            return info
        # One look per run, however many of its tasks were claimed at once.
        lock = self._run_locks.setdefault(run_id, asyncio.Lock())
        async with lock:
            info = self._runs.get(run_id) or await self._read_run_info(run_id)
        self._run_locks.pop(run_id, None)
        return info

    async def _import_dag(self, path: str, dag_id: str) -> DAG:
        """Import a user's DAG file off the event loop, so that nothing it does at import
        can stop the worker: it is tried first in a forked child with a time limit (which
        catches ``sys.exit()``, ``os._exit()``, a crash and a hang), and only a file that
        imported there is imported here, in a thread, under the same limit."""
        timeout = self._dag_import_timeout
        if not is_loaded(path, dag_id):
            parsed = await parse_file(path, timeout)
            if parsed.error is not None:
                raise DagImportError(parsed.error)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.to_thread(load_dag, path, dag_id)
        except TimeoutError:
            raise DagImportError(
                f"cannot import {path}: did not finish within {timeout:g} s"
            ) from None

    async def _read_run_info(self, run_id: str) -> _RunInfo:
        run = await self.views.run_info(run_id)
        if run is None:
            info = _RunInfo(None, "?", date.today(), problem=f"run {run_id} not found")
        else:
            logical = date.fromisoformat(run["logical_date"])
            dag = self._dags_by_id.get(run["dag_id"])
            problem = None
            if dag is None and run["dag_file"]:
                try:
                    dag = await self._import_dag(run["dag_file"], run["dag_id"])
                except Exception as exc:
                    problem = f"cannot load DAG {run['dag_id']}: {exc}"
            elif dag is None:
                problem = f"DAG {run['dag_id']} is unknown to this worker and has no file"
            params = None
            if dag is not None:
                conf = None if run["conf"] is None else json.loads(run["conf"])
                try:
                    params = resolve(dag.params, conf, dag.dag_id)
                except BadConf as exc:  # the DAG's params changed since the run was created
                    dag, problem = None, str(exc)
            interval = None
            if run["data_interval_start"] is not None:
                interval = (
                    datetime.fromisoformat(run["data_interval_start"]),
                    datetime.fromisoformat(run["data_interval_end"]),
                )
            event = None if run["start_event"] is None else json.loads(run["start_event"])
            info = _RunInfo(
                dag, run["dag_id"], logical, problem, params, interval, event, logical_shown(run)
            )
            info.logical_time = utc(run["logical_time"]) if run["logical_time"] else None
            info.zone = _zone(run["timezone"])
            info.conf = None if run["conf"] is None else json.loads(run["conf"])
            info.run_type = run["run_type"] or "manual"
        self._runs[run_id] = info
        return info


def _zone(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):  # a zone this machine's tzdata lacks
        return ZoneInfo("UTC")


def refuse(row: MovedTask, owner: str, release: asyncio.Event, why: str) -> Failed:
    """Fail the attempt before it ran, without retrying: retrying cannot change ``why``."""
    release.set()
    return Failed(**_base(row, owner, final=True), message=why)


def check_output(spec: TaskSpec, value: Any, is_instance: bool) -> tuple[str | None, list[str]]:
    """Problems that fail the task itself: a bad fan-out source, a bad branch choice.

    Returns the problem (or None) and, for a branch, the children it did not choose.
    """
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
        return f"branch {spec.task_id} must return a child id or a list of them, not {value!r}", []
    unknown = [c for c in chosen if c not in children]
    if unknown:
        return (
            f"branch {spec.task_id} chose {', '.join(unknown)}, which is not one of "
            f"its children ({', '.join(children) or 'none'})"
        ), []
    return None, [c for c in children if c not in chosen]


def _base(row: MovedTask, owner: str, *, final: bool = False) -> dict[str, Any]:
    """The fields every outcome of ``row``'s attempt shares; ``final``: no retry left."""
    return {
        "row_id": row.id,
        "owner": owner,
        "attempt": row.attempt,
        "max_attempts": row.attempt if final else row.max_attempts,
        "run_id": row.run_id,
    }
