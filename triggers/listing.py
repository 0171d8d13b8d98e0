"""Helpers for triggers that answer many checks from one listing (S3, SFTP).

* :func:`compile_glob` - path-style globs: ``*`` and ``?`` stop at ``/``, ``**`` crosses
  it, ``[abc]`` / ``[!abc]`` are classes; a malformed pattern raises ValueError.
* :class:`SingleFlight` - concurrent callers asking for the same listing share one request.
  The triggerer hands a batched class at most ``batch_size`` checks per call, so 10,000
  keys under one prefix arrive as ten concurrent calls; they still make one listing.
* :func:`on_grid` - the next check on a grid of the interval, so that checks deferred at
  different moments fall due together and share their listings from the second check on.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable, Hashable
from functools import lru_cache, partial
from typing import Any, TypeVar

T = TypeVar("T")

MAGIC = frozenset("*?[")


def has_magic(pattern: str) -> bool:
    return any(c in MAGIC for c in pattern)


def literal_prefix(pattern: str) -> str:
    """The part before the first wildcard."""
    for i, c in enumerate(pattern):
        if c in MAGIC:
            return pattern[:i]
    return pattern


@lru_cache(maxsize=4096)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """Translate a path-style glob to a regex; raise ValueError saying what is wrong."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            negate = j < n and pattern[j] in "!^"
            if negate:
                j += 1
            end = pattern.find("]", j)
            if end < 0:
                raise ValueError(f"malformed glob {pattern!r}: '[' at {i} is never closed")
            body = pattern[j:end]
            if not body:
                raise ValueError(f"malformed glob {pattern!r}: empty character class at {i}")
            if "/" in body:
                raise ValueError(f"malformed glob {pattern!r}: '/' inside a character class")
            body = body.replace("\\", "\\\\")
            out.append(f"[{'^' if negate else ''}{body}]")
            i = end
        elif c == "]":
            raise ValueError(f"malformed glob {pattern!r}: ']' at {i} closes nothing")
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def check_glob(pattern: str) -> None:
    """Raise ValueError where :func:`compile_glob` would, without compiling a literal.

    A trigger validates its key at every model build (each check): 10,000 distinct
    literal keys would compile 10,000 regexes a cycle (~0.1 ms each) and evict the
    globs from :func:`compile_glob`'s cache. A literal can only be malformed by a ']'.
    """
    if has_magic(pattern) or "]" in pattern:
        compile_glob(pattern)


def on_grid(now: float, interval: float) -> float:
    """The first multiple of ``interval`` (since the epoch) after ``now``.

    A batched trigger returns this from ``next_check_at``: ten thousand sensors that
    deferred over a minute are checked at the same instants, so one listing per prefix
    answers all of them instead of one listing per moment someone happened to defer.
    """
    return (math.floor(now / interval) + 1) * interval


class SingleFlight:
    """Run one coroutine per key at a time; callers arriving meanwhile share its result.

    A caller that is cancelled (its check timed out) does not cancel the shared request.
    """

    def __init__(self, max_age: float | None = None) -> None:
        self._inflight: dict[Hashable, tuple[float, asyncio.Future[Any]]] = {}
        # A request older than this is not joined: it may have been sent before the change
        # a pushed check was woken for (its answer would be stale); one of its own is made.
        self._max_age = max_age
        self.started = 0  # requests actually made (for tests and benchmarks)
        self.joined = 0  # callers served by a request someone else started

    async def run(
        self, key: Hashable, fn: Callable[[], Awaitable[T]], *, fresh_after: float = 0.0
    ) -> T:
        """``fn()``'s result, or that of the same key's request in flight if it began after
        ``fresh_after`` (``time.monotonic()``: when a change was last heard of; a request
        sent before it may not show the change)."""
        entry = self._inflight.get(key)
        now = time.monotonic()
        stale = entry is not None and (
            entry[0] < fresh_after or (self._max_age is not None and now - entry[0] > self._max_age)
        )
        if entry is None or stale:
            self.started += 1
            fut: asyncio.Future[Any] = asyncio.ensure_future(fn())
            self._inflight[key] = (now, fut)
            fut.add_done_callback(partial(self._done, key))
        else:
            self.joined += 1
            fut = entry[1]
        return await asyncio.shield(fut)

    def _done(self, key: Hashable, fut: asyncio.Future[Any]) -> None:
        entry = self._inflight.get(key)
        if entry is not None and entry[1] is fut:
            del self._inflight[key]
        if not fut.cancelled():
            fut.exception()  # retrieved: no "never retrieved" warning if every caller left
