"""The native DateTimeTrigger timer (triggerer/airflow/native_time.py), without Airflow:
every instant held is one heap entry under one timer, which wakes for the earliest, not
once per instant; an earlier instant added later is not slept past; waits left are
dropped from the heap."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator

import pytest
from support.helpers import async_wait_until

from triggerer.airflow.native_time import COMPACT_AT, TimeHub


@pytest.fixture
async def hub() -> AsyncIterator[TimeHub]:
    h = TimeHub()
    yield h
    await h.close()


async def test_ten_thousand_instants_cost_one_timer(hub: TimeHub) -> None:
    now = time.time()
    later = [asyncio.create_task(hub.until(now + 3600 + i)) for i in range(10_000)]
    # Twenty instants over 0.2 s, added last and in reverse order.
    soon = [asyncio.create_task(hub.until(now + 0.3 - i * 0.01)) for i in range(20)]
    order: list[int] = []

    def done(i: int, _: asyncio.Task[None]) -> None:
        order.append(i)

    for i, t in enumerate(soon):
        t.add_done_callback(functools.partial(done, i))
    await asyncio.wait_for(asyncio.gather(*soon), 10)
    assert order == sorted(order, reverse=True)  # earliest first
    assert not any(t.done() for t in later)
    # Woken for the instants that came due (and their additions), never per instant held.
    assert hub.wakes < 60
    for t in later:
        t.cancel()
    await asyncio.gather(*later, return_exceptions=True)
    assert len(hub) == 0


async def test_an_earlier_instant_added_later_is_not_slept_past(hub: TimeHub) -> None:
    far = asyncio.create_task(hub.until(time.time() + 3600))
    await async_wait_until(lambda: hub._task is not None, what="the timer")
    await asyncio.sleep(0)  # one turn: the timer now sleeps for the far instant (a minute)
    began = time.monotonic()
    await asyncio.wait_for(hub.until(time.time() + 0.05), 10)
    assert time.monotonic() - began < 5.0  # not the minute the timer was sleeping for
    far.cancel()


async def test_waits_left_are_dropped_from_the_heap(hub: TimeHub) -> None:
    now = time.time()
    n = COMPACT_AT * 3
    waits = [asyncio.create_task(hub.until(now + 3600 + i)) for i in range(n)]
    await asyncio.sleep(0)  # one turn: every wait has pushed its entry
    for t in waits:
        t.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    assert len(hub._heap) <= COMPACT_AT + 1
