"""The triggerer's scrape-time metrics do not hold its loop: the histogram of waits per
check is counted before the scrape, a 64th of the table at a time."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

from support.triggers import FlagTrigger

from triggerer.checks import CheckTable, Subscriber
from triggerer.metrics import TriggererCollector


def table_of(single: int, shared: int) -> CheckTable:
    """``single`` checks with one wait each and ``shared`` with two."""
    table = CheckTable()
    row = 0
    for i in range(single + shared):
        trigger = FlagTrigger(name=f"c{i}", poke_interval=60)
        for _ in range(1 if i < single else 2):
            row += 1
            sub = Subscriber(row, row, 60.0, True)
            table.subscribe(trigger.poke_hash(), trigger, trigger.shard(), sub, 0.0)
    return table


async def test_waits_per_check_are_counted_a_part_at_a_time() -> None:
    triggerer: Any = SimpleNamespace(table=table_of(single=2_000, shared=10))
    collector = TriggererCollector(triggerer)
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = turns
    await collector.refresh()
    task.cancel()
    assert turns - before >= 32, "the loop's other work ran while the table was counted"
    assert collector._sharing == Counter({1: 2_000, 2: 10})
