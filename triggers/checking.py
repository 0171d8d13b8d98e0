"""Running a trigger's check: the one context a check sees, and checking once.

Both hosts use these: the triggerer (one context for its lifetime, shared clients kept
between checks) and a worker's poke / reschedule sensors (one context per check, on a
short-lived event loop). What differs between them is injected: the clock, and how
``external_states`` reaches the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .base import BaseTrigger, TriggerEvent
from .connections import Connection, get_connection
from .context import TriggerContext

T = TypeVar("T")

ExternalStates = Callable[[Sequence[dict[str, Any]]], Awaitable[list[Any]]]
Subscribe = Callable[[str, Callable[[str | None], None]], Awaitable[Callable[[], None] | None]]


class CheckContext:
    """The :class:`~triggers.context.TriggerContext` that checks run with.

    ``external_states`` answers cross-DAG questions (the store's method, or a function
    that asks the store on another loop); without it a trigger that asks is told so.
    """

    def __init__(
        self,
        external_states: ExternalStates | None = None,
        *,
        clock: Callable[[], float] = time.time,
        subscribe: Subscribe | None = None,
    ) -> None:
        self._external_states = external_states
        self._subscribe = subscribe
        self._clock = clock
        self._shared: dict[str, Any] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def now(self) -> float:
        return self._clock()

    def connection(self, conn_id: str) -> Connection:
        return get_connection(conn_id)

    async def shared(self, key: str, factory: Callable[[], Awaitable[T]]) -> T:
        """One resource per key for the context's lifetime (created once, under a lock)."""
        if key in self._shared:
            return self._shared[key]
        # Concurrent checks in the triggerer would otherwise each open a client.
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            if key not in self._shared:
                self._shared[key] = await factory()
        return self._shared[key]

    async def external_states(self, questions: Sequence[dict[str, Any]]) -> list[Any]:
        if self._external_states is None:
            raise RuntimeError("this trigger context has no store to answer external_states")
        return await self._external_states(questions)

    async def subscribe(
        self, channel: str, callback: Callable[[str | None], None]
    ) -> Callable[[], None] | None:
        """The database's notifications on ``channel`` (None: this host has none)."""
        if self._subscribe is None:
            return None
        return await self._subscribe(channel, callback)

    async def aclose(self) -> None:
        """Close every shared resource; one that fails to close must not keep the rest open."""
        for value in self._shared.values():
            with contextlib.suppress(Exception):
                await _close(value)
        self._shared.clear()
        self._locks.clear()


async def _close(value: Any) -> None:
    for name in ("aclose", "close", "__aexit__"):
        close = getattr(value, name, None)
        if close is None:
            continue
        res = close(None, None, None) if name == "__aexit__" else close()
        if asyncio.iscoroutine(res):
            await res
        return


async def check_once(
    trigger: BaseTrigger, ctx: TriggerContext, *, push_wait: float | None = None
) -> TriggerEvent | None:
    """One check of ``trigger``, whichever style it is written in.

    Poll style: ``poke()``. Push style: the first event ``run()`` yields, None if the
    generator ends first or, with ``push_wait``, if nothing came within that many seconds
    (a host without a timeout of its own for the call). The generator is always closed,
    so a push trigger is re-entered from the start at its next check.
    """
    if not type(trigger).is_push():
        return await trigger.poke(ctx)
    agen = trigger.run(ctx)
    try:
        if push_wait is None:
            return await anext(agen)
        # wait_for swallows a cancel racing the timeout on 3.11; asyncio.timeout does not.
        async with asyncio.timeout(push_wait):
            return await anext(agen)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        if push_wait is None:
            raise
        return None
    finally:
        await agen.aclose()  # type: ignore[attr-defined]
