"""Recovery details of the triggerer, one module at a time: the watchdog reports a stall's
true length when it ends, and a success on a connection resets the backoff of the waits
sharing it (so a server that comes back is seen within seconds, not max_backoff), and a
renewal that finds shards gone stays fenced until it has forgotten their checks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from support.helpers import async_wait_until

from executor.driver.liveness import NoLiveness
from triggerer.checks import CheckTable, Subscriber
from triggerer.config import TriggererConfig
from triggerer.leasing import Leases
from triggerer.models import KeptModels
from triggerer.settling import PROBE_EVERY, Settler
from triggerer.watchdog import LoopWatch
from triggers.base import BaseTrigger, TriggerEvent


async def test_the_watchdog_reports_a_stalls_true_length_when_it_ends() -> None:
    ended: list[tuple[str, float, Any]] = []
    watch = LoopWatch(on_block=lambda c, s, b: ended.append((c, s, b)), blame=lambda c: [7])
    watching = asyncio.create_task(watch.run())
    await asyncio.sleep(0.3)  # a few ticks first
    time.sleep(1.5)  # blocks the loop: the watchdog's thread sees it pass the threshold
    await async_wait_until(lambda: ended, timeout=10, what="the stall's end to be reported")
    watching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watching
    ((culprit, length, blamed),) = ended
    assert culprit == "unknown (not inside a trigger)"
    assert 1.4 <= length < 30  # its true length, not the threshold it passed (0.25 s)
    assert blamed == [7]  # who was blamed when the stall was seen
    assert watch.blocked[culprit] == 1
    assert watch.blocked_seconds[culprit] == pytest.approx(length)


class ServerTrigger(BaseTrigger):
    name: str
    conn_id: str


class NullOutbox:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, rows: Any, line: str) -> None:
        self.lines.append(line)

    def fire(self, fire: Any) -> None: ...

    def fail(self, waits: Any, why: str) -> None: ...


def settler_with(table: CheckTable) -> Settler:
    return Settler(table, NullOutbox(), KeptModels(), max_backoff=300)  # type: ignore[arg-type]


async def test_a_success_on_a_connection_resets_the_backoff_of_every_wait_on_it() -> None:
    table = CheckTable()
    now = 1000.0
    checks = {}
    for row, (name, conn) in enumerate([("a", "srv"), ("b", "srv"), ("c", "other")], start=1):
        trigger = ServerTrigger(name=name, conn_id=conn)
        checks[name] = table.subscribe(
            trigger.poke_hash(), trigger, 0, Subscriber(row, row, 1.0, False), now
        )
    settler = settler_with(table)
    down = ConnectionError("connection refused")
    for _ in range(8):  # a long outage: 2**8 s of backoff each, capped at 300
        for name in "abc":
            settler.settle(checks[name], down, now)
    a, b, c = checks["a"], checks["b"], checks["c"]
    # The first to back off on a connection is its probe: it keeps trying every few seconds.
    assert a.due == now + PROBE_EVERY and c.due == now + PROBE_EVERY
    assert b.due == now + 256 and b.failures == 8
    # The server is back: the probe's check succeeds (not yet), and b is due at once.
    later = now + PROBE_EVERY
    settler.settle(a, None, later)
    assert (b.failures, b.due) == (0, later)
    assert (c.failures, c.due) == (8, now + PROBE_EVERY)  # another connection: unchanged
    # A fire counts as a success too.
    for _ in range(3):
        settler.settle(b, down, later)
    settler.settle(a, down, later)
    assert b.due == later + PROBE_EVERY  # the probe now: a backed off after it
    assert a.due == later + 2
    settler.settle(b, TriggerEvent(payload={}), later + 1)
    assert (a.failures, a.due) == (0, later + 1)


def test_the_connection_of_a_check() -> None:
    assert str(ServerTrigger(name="x", conn_id="s3").connection_key()).endswith(":s3")

    class UrlTrigger(BaseTrigger):
        url: str

    assert str(UrlTrigger(url="https://h.example:8443/p?q").connection_key()).endswith(
        ":h.example:8443"
    )

    class PlainTrigger(BaseTrigger):
        path: str

    assert PlainTrigger(path="/x").connection_key() is None


class ShrinkingLeases:
    """The store's side of a renewal: the shards it grants, each time fewer."""

    def __init__(self, grants: list[set[int]]) -> None:
        self.grants = grants

    async def lease_shards(self, *args: Any, **kwargs: Any) -> set[int]:
        return self.grants.pop(0)

    async def triggerer_beat(self, *args: Any) -> None: ...


async def test_no_check_of_a_shard_found_gone_can_start_while_its_checks_are_forgotten() -> None:
    """The drop yields to the loop between chunks of the table; meanwhile the triggerer is
    fenced, so a check of a shard it no longer holds is not started after the renewal that
    found the shard gone (a SIGSTOPped triggerer woken after its leases lapsed)."""
    table = CheckTable()
    for row in range(1, 2001):  # spread over both shards, in every chunk of the table
        trigger = ServerTrigger(name=f"t{row}", conn_id="srv")
        table.subscribe(trigger.poke_hash(), trigger, row % 2, Subscriber(row, row, 1.0, False), 0)
    leases = Leases(
        ShrinkingLeases([{0, 1}, {0}]),  # type: ignore[arg-type]
        "me",
        NoLiveness(),
        table,
        TriggererConfig(),
        wake_checker=asyncio.Event(),
        moved=lambda: None,
        lag=lambda: 0.0,
    )
    await leases._renew()
    assert not leases.fenced() and leases.shards == {0, 1}
    seen: list[bool] = []  # fenced, each time the loop ran while shard 1 still had checks

    async def checker() -> None:
        while any(c.shard == 1 for c in table.by_hash.values()):
            seen.append(leases.fenced())
            await asyncio.sleep(0)

    watching = asyncio.create_task(checker())
    await leases._renew()
    await watching
    assert seen and all(seen)
    assert leases.shards == {0} and not leases.fenced()
    assert {c.shard for c in table.by_hash.values()} == {0}
