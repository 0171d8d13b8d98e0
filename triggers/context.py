"""The small protocol a trigger sees while it checks: its only view of slotless."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class TriggerContext(Protocol):
    def now(self) -> float:
        """Wall-clock seconds (injected in tests)."""
        ...

    def connection(self, conn_id: str) -> Any:
        """The named connection, resolved in this process's environment (never stored)."""
        ...

    async def shared(self, key: str, factory: Callable[[], Awaitable[T]]) -> T:
        """One long-lived resource (a client, an SSH connection) per key, reused by checks."""
        ...

    async def external_states(self, questions: Sequence[dict[str, Any]]) -> list[Any]:
        """Answer cross-DAG questions (see Views.external_states) in one query."""
        ...

    async def subscribe(
        self, channel: str, callback: Callable[[str | None], None]
    ) -> Callable[[], None] | None:
        """Hear the database's notifications on ``channel`` (for push sources).

        ``callback(payload)`` for each one, ``callback(None)`` when the listening
        connection was lost (anything may have been missed). Returns the function that
        stops it, or None where the database sends no notifications (SQLite)."""
        ...


async def to_thread(func: Callable[..., T], *args: Any) -> T:
    """Run an unavoidable blocking call off the event loop."""
    import anyio.to_thread

    return await anyio.to_thread.run_sync(func, *args)
