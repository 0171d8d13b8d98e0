"""How long a held trigger's own code ran on the event loop, by trigger class.

A held trigger (an Airflow trigger's ``run()``, open for the whole wait) that retries at
once, waiting for nothing in between, never blocks the loop for long, so the watchdog's
stall detection never sees it; yet it keeps the loop (and a core) busy. Sampling the loop
thread's frames from another thread cannot see it either: that thread gets the GIL when
the loop releases it, in its ``select()``, not while the trigger runs. So the host times
each step of the trigger's coroutine instead (:func:`timed`, ~1 us a step), and the
watchdog reads the sums (:func:`take`) once per window and names a class whose code ran
for a large share of it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Generator
from typing import Any, TypeVar

T = TypeVar("T")

# classpath -> seconds its code ran on the loop since the last take(). Written on the
# loop's thread, swapped by the watchdog's: a step added to the old dict meanwhile is
# lost, which a share over seconds does not notice.
_spent: defaultdict[str, float] = defaultdict(float)


def take() -> dict[str, float]:
    """The seconds each class's code ran on the loop since the last call."""
    global _spent
    spent, _spent = _spent, defaultdict(float)
    return spent


class timed(Awaitable[T]):  # used as a function: await timed(...)
    """Await ``awaitable``, adding the time of each of its steps (its own code, not the
    waits between them) to ``who``'s sum."""

    __slots__ = ("_awaitable", "_who")

    def __init__(self, awaitable: Awaitable[T], who: str) -> None:
        self._awaitable = awaitable
        self._who = who

    def __await__(self) -> Generator[Any, Any, T]:
        it = self._awaitable.__await__()
        who = self._who
        value: Any = None
        error: BaseException | None = None
        while True:
            began = time.perf_counter()
            try:
                step = it.send(value) if error is None else it.throw(error)
            except StopIteration as done:
                _spent[who] += time.perf_counter() - began
                return done.value
            except BaseException:
                _spent[who] += time.perf_counter() - began
                raise
            _spent[who] += time.perf_counter() - began
            try:
                value, error = (yield step), None
            except GeneratorExit:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
                raise
            except BaseException as exc:  # thrown in (a cancellation): passed on
                value, error = None, exc
