"""Sensors inside a worker: deciding how to wait, and checking in poke / reschedule mode.

A deferrable sensor becomes a DEFERRED row at once (no check in the worker). In poke and
reschedule modes the worker runs the same trigger code itself, in its slot's thread,
on a short-lived event loop: this is the path whose slot cost the benchmark compares.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from triggers.base import BaseTrigger, TriggerEvent, shard_of
from triggers.checking import CheckContext, ExternalStates, check_once
from triggers.events import check_name
from triggers.limits import MAX_SERIALIZED_BYTES
from triggers.people import PersonWait
from triggers.registry import is_allowed, load_trigger

from .dag import SensorSpec
from .outcomes import Deferral
from .templating import Scope, render_trigger

# The resume point of a deferred sensor that has outlets: the worker's cue to record the
# sensor's success with its asset events (attempt.py). It names no method: a sensor's
# attempt never dispatches to the task's resume methods, whatever they are called.
SENSED = "__sensed__"


async def rendered(trigger: BaseTrigger, scope: Scope) -> BaseTrigger:
    """``trigger`` with its templates rendered for ``scope``: in a thread (a template is
    an author's code, and a first use compiles it), itself at once when it has none."""
    if not trigger.templates():
        return trigger
    return await asyncio.to_thread(render_trigger, trigger, scope)


# A wait's serialized trigger kwargs are copied into its trigger row, read by every full
# reload and held while it is checked: a deferral above this is refused (docs/writing-triggers.md).
# The same bound as an event's payload (triggers/limits.py).
MAX_TRIGGER_KWARGS = MAX_SERIALIZED_BYTES


class TriggerTooLarge(ValueError):
    """A trigger whose serialized kwargs exceed :data:`MAX_TRIGGER_KWARGS`: the task fails."""


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
    size = len(kwargs_json.encode())
    if size > MAX_TRIGGER_KWARGS:
        raise TriggerTooLarge(
            f"trigger {classpath} serializes to {size} bytes of kwargs, over the limit of "
            f"{MAX_TRIGGER_KWARGS} bytes (64 KiB): pass a reference (a path, a key), not the data"
        )
    load_trigger(classpath, kwargs_json)  # what the triggerer will do: fail here, not there
    poke_hash = trigger.poke_hash()  # a sha256 of the dumped context: once, not per use
    event = trigger.event_wait()
    person = isinstance(trigger, PersonWait)
    if event is not None:
        check_name(event.name)  # a template may have rendered it into a bad one
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
        event=event,
        person=person,
    )


class _CutOff(Exception):
    """A check ran into the limit :func:`sense` set (the sensor's deadline or the
    task's execution_timeout), as opposed to a TimeoutError of the trigger's own."""


@dataclass(slots=True)
class Verdict:
    event: TriggerEvent | None  # None: not yet
    timed_out: bool = False
    checks: int = 0


def sense(
    trigger: BaseTrigger,
    sensor: SensorSpec,
    *,
    hold_slot: bool,
    deadline: float,
    main_loop: asyncio.AbstractEventLoop,
    views: Any,
    log: Callable[[str], None],
    check_timeout: float | None = None,
) -> Verdict:
    """Run in a slot's thread: one check (reschedule) or checks until done (poke).

    A check that hangs is cut off at the sensor's deadline (a sensor timeout) or after
    ``check_timeout`` (the task's execution_timeout, per check: the attempt fails).
    """
    external_states = _on_loop(views, main_loop)
    checks = 0
    while True:
        if time.time() >= deadline:
            return Verdict(None, timed_out=True, checks=checks)
        # A context per check: shared clients belong to this check's loop and die with it.
        tctx = CheckContext(external_states)
        limit = deadline - time.time()
        if check_timeout is not None:
            limit = min(limit, check_timeout)

        async def once(tctx: CheckContext = tctx, limit: float = limit) -> TriggerEvent | None:
            cut_off = asyncio.timeout(limit)
            try:
                async with cut_off:
                    # A push trigger would hold the slot until its event: one interval
                    # without one is this check's "not yet".
                    return await check_once(trigger, tctx, push_wait=trigger.poke_interval)
            except TimeoutError:
                # Ours, or the trigger's own (a client's read timeout): only ours is a
                # deadline; the trigger's fails the attempt like any error of its check.
                if cut_off.expired():
                    raise _CutOff from None
                raise
            finally:
                await tctx.aclose()

        try:
            event = asyncio.run(once())
        except _CutOff:
            if check_timeout is None or time.time() >= deadline:
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


def _on_loop(views: Any, loop: asyncio.AbstractEventLoop) -> ExternalStates:
    """``views.external_states``, asked from a check's loop in a slot's thread.

    The store belongs to the worker's loop (``loop``): its connection cannot be used from
    another, so the question is run there.
    """

    async def ask(questions: Sequence[dict[str, Any]]) -> list[Any]:
        future = asyncio.run_coroutine_threadsafe(views.external_states(questions), loop)
        return await asyncio.wrap_future(future)

    return ask
