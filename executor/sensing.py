"""Sensors inside a worker: deciding how to wait, and checking in poke / reschedule mode.

A deferrable sensor becomes a DEFERRED row at once (no check in the worker). In poke and
reschedule modes the worker runs the same trigger code itself, in its slot's thread,
on a short-lived event loop: this is the path whose slot cost the benchmark compares.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from triggers.base import BaseTrigger, TriggerEvent, shard_of
from triggers.connections import Connection, get_connection
from triggers.registry import is_allowed, load_trigger

from .context import TaskContext
from .dag import SensorSpec
from .outcomes import Deferral

T = TypeVar("T")


def template_values(ctx: TaskContext) -> dict[str, str]:
    return {
        "ds": ctx.ds,
        "ds_nodash": ctx.ds.replace("-", ""),
        "logical_date": ctx.ds,
        "run_id": ctx.run_id,
        "dag_id": ctx.dag_id,
        "task_id": ctx.task_id,
    }


def deferral(
    trigger: BaseTrigger,
    *,
    method: str | None,
    method_kwargs: dict[str, Any],
    wait_started_at: float,
    timeout: float | None,
    soft_fail: bool = False,
) -> Deferral:
    """Serialize ``trigger`` for a DEFERRED row; raises ValueError if it cannot be."""
    classpath, kwargs = trigger.serialize()
    if not is_allowed(classpath):
        raise ValueError(f"trigger class {classpath} is not allow-listed")
    kwargs_json = json.dumps(kwargs, sort_keys=True)
    load_trigger(classpath, kwargs_json)  # what the triggerer will do: fail here, not there
    poke_hash = trigger.poke_hash()  # a sha256 of the dumped context: once, not per use
    return Deferral(
        classpath=classpath,
        kwargs_json=kwargs_json,
        poke_hash=poke_hash,
        shard=shard_of(poke_hash),
        description=trigger.describe(),
        method=method,
        method_kwargs_json=json.dumps(method_kwargs),
        wait_started_at=wait_started_at,
        timeout_at=None if timeout is None else wait_started_at + timeout,
        soft_fail=soft_fail,
    )


@dataclass(slots=True)
class Verdict:
    event: TriggerEvent | None  # None: not yet
    timed_out: bool = False
    checks: int = 0


class WorkerTriggerContext:
    """The trigger context for checks run inside a worker slot."""

    def __init__(self, main_loop: asyncio.AbstractEventLoop, store: Any) -> None:
        self._main_loop = main_loop
        self._store = store
        self._shared: dict[str, Any] = {}

    def now(self) -> float:
        return time.time()

    def connection(self, conn_id: str) -> Connection:
        return get_connection(conn_id)

    async def shared(self, key: str, factory: Callable[[], Awaitable[T]]) -> T:
        # One check's event loop lives only as long as the check: nothing outlives it.
        if key not in self._shared:
            self._shared[key] = await factory()
        return self._shared[key]  # type: ignore[no-any-return]

    async def external_states(self, questions: Sequence[dict[str, Any]]) -> list[Any]:
        # The store belongs to the worker's loop; ask it from this thread's loop.
        fut = asyncio.run_coroutine_threadsafe(
            self._store.external_states(questions), self._main_loop
        )
        return await asyncio.wrap_future(fut)

    async def aclose(self) -> None:
        for value in self._shared.values():
            close = getattr(value, "close", None) or getattr(value, "__aexit__", None)
            if close is not None:
                try:
                    res = close() if close.__name__ == "close" else close(None, None, None)
                    if asyncio.iscoroutine(res):
                        await res
                except Exception:
                    pass
        self._shared.clear()


async def check(trigger: BaseTrigger, tctx: Any) -> TriggerEvent | None:
    """One check, whichever style the trigger is written in."""
    if type(trigger).is_push():
        agen = trigger.run(tctx)
        try:
            return await asyncio.wait_for(anext(agen), trigger.poke_interval)  # type: ignore[arg-type]
        except (TimeoutError, StopAsyncIteration):
            return None
        finally:
            await agen.aclose()  # type: ignore[attr-defined]
    return await trigger.poke(tctx)


def sense(
    trigger: BaseTrigger,
    sensor: SensorSpec,
    *,
    hold_slot: bool,
    deadline: float,
    main_loop: asyncio.AbstractEventLoop,
    store: Any,
    log: Callable[[str], None],
    check_timeout: float | None = None,
) -> Verdict:
    """Run in a slot's thread: one check (reschedule) or checks until done (poke).

    A check that hangs is cut off at the sensor's deadline (a sensor timeout) or after
    ``check_timeout`` (the task's execution_timeout, per check: the attempt fails).
    """
    checks = 0
    while True:
        if time.time() >= deadline:
            return Verdict(None, timed_out=True, checks=checks)
        tctx = WorkerTriggerContext(main_loop, store)
        limit = deadline - time.time()
        if check_timeout is not None:
            limit = min(limit, check_timeout)

        async def once(tctx: WorkerTriggerContext = tctx, limit: float = limit) -> Any:
            try:
                async with asyncio.timeout(limit):
                    return await check(trigger, tctx)
            finally:
                await tctx.aclose()

        try:
            event = asyncio.run(once())
        except TimeoutError:
            if time.time() >= deadline:
                return Verdict(None, timed_out=True, checks=checks + 1)
            raise TimeoutError(
                f"a check of {trigger.describe()} took longer than {check_timeout:g} s "
                "(the task's execution_timeout)"
            ) from None
        checks += 1
        if event is not None:
            return Verdict(event, checks=checks)
        if not hold_slot:
            return Verdict(None, checks=checks)
        if checks == 1 or checks % 10 == 0:
            log(
                f"checked {trigger.describe()}: not yet; next in {sensor.interval:g} s "
                f"(poke mode, check {checks})"
            )
        time.sleep(max(0.0, min(sensor.interval, deadline - time.time())))
