"""What the native checks share: the grid they check on, their back-off, their one line,
their clients.

Checks of one interval run at the same moments, the multiples of the interval on the
monotonic clock, so that the ones due together share one listing or one read (the S3
and SFTP listings, the reads of Airflow's runs); after a failure too, the checks it
failed try again at one grid point, with one request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any

from triggers.listing import SingleFlight

BACKOFF_MAX_S = 60.0  # the longest wait after failures (from the interval, doubling)
SAY_EVERY_S = 60.0  # a failing listing or read is logged at most this often


class NotNative(Exception):
    """The row or its connection asks for what the native check does not do: the adapter
    (the provider's own ``run()``) serves it."""


def one_line(exc: BaseException) -> str:
    """``Type: first line``: an error as a task's one-line reason."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def grid(every: float, at: float) -> float:
    """The last point at or before ``at`` (monotonic seconds) of the grid of ``every``."""
    return math.floor(at / every) * every


async def sleep_until(due: float) -> float:
    """Sleep until the monotonic clock reads ``due``, not a moment before: uvloop's timers
    count whole milliseconds and may wake one early, and a check woken before its grid
    point would take the previous point's listing, then check again at once."""
    while (left := due - time.monotonic()) > 0:
        await asyncio.sleep(left)
    return due


async def next_point(every: float) -> float:
    """Sleep until the grid's next point after now; returns it."""
    return await sleep_until(grid(every, time.monotonic()) + every)


async def back_off(every: float, failures: int) -> float:
    """Sleep after ``failures`` failures in a row: the interval doubled that many times (at
    most :data:`BACKOFF_MAX_S`), to the grid point after that; returns the point."""
    wait = min(every * 2**failures, BACKOFF_MAX_S)
    return await sleep_until(grid(every, time.monotonic() + wait) + every)


class Clients:
    """One client per connection for the process's lifetime (an S3 client, an SSH
    connection), opened once however many checks ask for it at once; a connection found
    to need the adapter is remembered as its :class:`NotNative`, for as long."""

    def __init__(self) -> None:
        self._made: dict[Hashable, Any] = {}  # a client, or NotNative
        self._opening = SingleFlight()

    async def get(self, where: Hashable, open_: Callable[[], Awaitable[Any]]) -> Any:
        """The client of ``where``, made by ``open_()`` the first time; NotNative raised
        again for a connection that needs the adapter."""
        made = self._made.get(where)
        if made is None:
            made = await self._opening.run(where, partial(self._open, where, open_))
        if isinstance(made, NotNative):
            raise made
        return made

    async def close(self) -> None:
        made, self._made = self._made, {}
        for client in made.values():
            if not isinstance(client, NotNative):
                with contextlib.suppress(Exception):
                    await client.close()

    async def _open(self, where: Hashable, open_: Callable[[], Awaitable[Any]]) -> Any:
        try:
            client = await open_()
        except NotNative as exc:
            self._made[where] = exc
            raise
        self._made[where] = client
        return client
