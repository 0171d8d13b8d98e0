"""The push layer beside the check table (triggerer/push.py), with a source the test drives:
one source per key, a push wakes only its topic's checks, the safety interval while live,
a failing source falls back and is retried, the last check closes it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from support.helpers import async_wait_until

from triggerer.checks import Check, CheckTable, Subscriber
from triggerer.early import EarlyChecks
from triggerer.models import KeptModels
from triggerer.push import PushHub
from triggerer.running import CallTimes, CheckRunner
from triggerer.settling import Settler
from triggerer.writing import Outbox
from triggers.base import BaseTrigger, TriggerEvent
from triggers.push import PushInterest, PushSource, PushUnavailable, Wake

OPENED: list[Source] = []


class Source(PushSource):
    """Live until told to fail; the test pushes through ``wake``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.wake: Wake | None = None
        self.fail: asyncio.Future[PushUnavailable] | None = None
        self.closed = False
        OPENED.append(self)

    async def run(self, ctx: Any, ready: Callable[[], None], wake: Wake) -> None:
        self.fail = asyncio.get_running_loop().create_future()
        self.wake = wake
        ready()
        try:
            raise await self.fail
        except asyncio.CancelledError:
            self.closed = True
            raise


class Topical(BaseTrigger):
    source: str
    topic: str

    def push_interest(self, ctx: Any) -> PushInterest:
        return PushInterest(("test", self.source), lambda: Source(self.source), topic=self.topic)

    async def poke(self, ctx: Any) -> TriggerEvent | None:
        return None


class Broken(Topical):
    def push_interest(self, ctx: Any) -> PushInterest:
        raise RuntimeError("no idea")


def hold(table: CheckTable, trigger: BaseTrigger, row: int, now: float, interval: float = 60):
    return table.subscribe(
        trigger.poke_hash(), trigger, 0, Subscriber(row, row, interval, True), now
    )


@pytest.fixture
def opened():
    OPENED.clear()
    yield OPENED
    OPENED.clear()


async def test_one_source_per_key_and_a_push_wakes_only_its_topic(opened) -> None:
    now = [1000.0]
    table = CheckTable()
    hub = PushHub(table, None, wake_checker=asyncio.Event(), clock=lambda: now[0])  # type: ignore[arg-type]
    table.watcher = hub
    a = hold(table, Topical(source="s", topic="a"), 1, now[0])
    b = hold(table, Topical(source="s", topic="b"), 2, now[0])
    await async_wait_until(lambda: hub.live(("test", "s")), what="live")
    assert len(opened) == 1  # two checks, one source
    for c in (a, b):  # as if checked: next due an interval on
        table.schedule(c, now[0] + 60)
    assert opened[0].wake is not None
    now[0] += 1
    opened[0].wake(["a"])
    assert a.due == now[0] and b.due == 1060.0
    # Live: a check that said "not yet" is next due at the safety interval ...
    assert hub.next_check(b, now[0]) == pytest.approx(now[0] + hub.safety_interval)
    # ... but one woken by its own topic is checked once more a second later.
    assert hub.next_check(a, now[0]) == now[0] + 1.0
    # Woken while it runs: due again as soon as it ends.
    b.running = True
    opened[0].wake(["b"])
    b.running = False
    assert hub.next_check(b, now[0]) == now[0]
    # The last check gone, the source is closed.
    table.unsubscribe(1)
    assert hub.sources
    table.unsubscribe(2)
    assert not hub.sources
    await async_wait_until(lambda: opened[0].closed, what="source cancelled")


async def test_a_failing_source_falls_back_logs_and_is_tried_again(opened, caplog) -> None:
    caplog.set_level(logging.INFO, logger="slotless.triggerer.push")
    now = [1000.0]
    table = CheckTable()
    hub = PushHub(table, None, wake_checker=asyncio.Event(), clock=lambda: now[0], retry_after=0.05)  # type: ignore[arg-type]
    table.watcher = hub
    check = hold(table, Topical(source="s", topic="a"), 1, now[0])
    await async_wait_until(lambda: hub.live(("test", "s")), what="live")
    table.schedule(check, now[0] + 300)  # on the safety interval
    assert opened[0].fail is not None
    opened[0].fail.set_result(PushUnavailable("the queue went away"))
    await async_wait_until(lambda: "the queue went away" in caplog.text, what="log line")
    assert check.due == now[0]  # back to polling: checked at once, then its own interval
    assert hub.next_check(check, now[0]) is None
    # The same source, run again after push_retry.
    await async_wait_until(
        lambda: caplog.text.count("is live") == 2 and hub.live(("test", "s")), what="retried"
    )
    assert opened[0].fail is not None and not opened[0].fail.done()
    opened[0].fail.set_result(PushUnavailable("never here", retry=False))
    await async_wait_until(lambda: "never here" in caplog.text, what="declined")
    await asyncio.sleep(0.2)
    assert caplog.text.count("is live") == 2 and not hub.live(("test", "s"))
    assert len(opened) == 1
    await hub.aclose()


async def test_a_trigger_whose_push_interest_raises_is_polled(opened, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="slotless.triggerer.push")
    table = CheckTable()
    hub = PushHub(table, None, wake_checker=asyncio.Event(), clock=lambda: 0.0)  # type: ignore[arg-type]
    table.watcher = hub
    check = hold(table, Broken(source="s", topic="a"), 1, 0.0)
    assert "no idea" in caplog.text and not hub.sources and not opened
    assert hub.next_check(check, 0.0) is None


class SlowListing(Topical):
    """Batched: the first call waits at GATE (a safety poll's slow listing of a folder);
    any call answers from LANDED (what a push said)."""

    @classmethod
    async def poke_many(cls, triggers: Any, ctx: Any) -> list[TriggerEvent | None]:
        calls.append(len(triggers))
        if len(calls) == 1:
            await GATE[0]
        return [
            TriggerEvent(payload={"topic": t.topic}) if t.topic in LANDED else None
            for t in triggers
        ]


GATE: list[asyncio.Future[None]] = []
LANDED: set[str] = set()
calls: list[int] = []


async def test_a_check_pushed_while_its_call_is_in_flight_fires_before_that_call_ends(
    opened,
) -> None:
    now = [1000.0]
    table = CheckTable()
    wake = asyncio.Event()
    outbox = Outbox(None)  # type: ignore[arg-type]  # never flushed here: read as is
    settler = Settler(table, outbox, KeptModels(), max_backoff=60.0)
    running: set[Check] = set()
    runner = CheckRunner(
        table,
        None,  # type: ignore[arg-type]
        settler,
        wake=wake,
        clock=lambda: now[0],
        max_concurrency=8,
        wave=8,
        batch_size=100,
        check_timeout=30.0,
        running=running,
    )
    early = EarlyChecks(
        table,
        settler,
        None,  # type: ignore[arg-type]
        running,
        clock=lambda: now[0],
        batch_size=100,
        check_timeout=30.0,
        call_times=CallTimes(),
    )
    hub = PushHub(table, None, wake_checker=wake, clock=lambda: now[0], early=early.check)  # type: ignore[arg-type]
    table.watcher = hub
    GATE[:] = [asyncio.get_running_loop().create_future()]
    LANDED.clear()
    calls.clear()
    a = hold(table, SlowListing(source="s", topic="a"), 1, now[0])
    b = hold(table, SlowListing(source="s", topic="b"), 2, now[0])
    await async_wait_until(lambda: hub.live(("test", "s")), what="live")
    assert runner.dispatch(now[0])  # both in one call, which waits at the gate
    await async_wait_until(lambda: calls == [2], what="the slow call")
    assert a.running and b.running
    LANDED.add("a")
    assert opened[0].wake is not None
    opened[0].wake(["a"])  # "a" landed while the slow call lists
    await async_wait_until(lambda: outbox.batch.fires, what="the early fire")
    assert not GATE[0].done() and calls == [2, 1]  # "a" alone, early; "b" not asked again
    assert list(outbox.batch.fires[0].waits) == [1]
    assert table.by_hash.get(a.poke_hash) is None and b.running
    # The slow call ends, "a" in its answer too: ignored (dropped), no second fire.
    GATE[0].set_result(None)
    await async_wait_until(lambda: not b.running, what="the slow call settled")
    # One turn of the loop: a second fire would be written by the same settle that ended
    # "b", so whatever that settle scheduled has run by now.
    await asyncio.sleep(0)
    assert len(outbox.batch.fires) == 1 and table.by_hash.get(b.poke_hash) is b
    await hub.aclose()
