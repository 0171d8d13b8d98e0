"""The trigger context inside the triggerer: connections, shared clients, the store."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from triggers.connections import Connection, get_connection

T = TypeVar("T")


class TriggererContext:
    def __init__(self, store: Any, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._shared: dict[str, Any] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def now(self) -> float:
        return self._clock()

    def connection(self, conn_id: str) -> Connection:
        return get_connection(conn_id)

    async def shared(self, key: str, factory: Callable[[], Awaitable[T]]) -> T:
        """One resource per key for the triggerer's lifetime (created once, under a lock)."""
        if key in self._shared:
            return self._shared[key]  # type: ignore[no-any-return]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self._shared:
                self._shared[key] = await factory()
        return self._shared[key]  # type: ignore[no-any-return]

    def forget(self, key: str) -> None:
        """Drop a shared resource (e.g. a dead connection) so the next check makes a new one."""
        self._shared.pop(key, None)

    async def external_states(self, questions: Sequence[dict[str, Any]]) -> list[Any]:
        return await self._store.external_states(questions)

    async def aclose(self) -> None:
        for value in self._shared.values():
            for name in ("aclose", "close"):
                close = getattr(value, name, None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        res = close()
                        if asyncio.iscoroutine(res):
                            await res
                    break
        self._shared.clear()
