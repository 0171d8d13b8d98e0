"""The check table's schedule, a wheel of 10 ms ticks (checks.py): a check is taken in
the first tick at or after its due time and never before it; stale entries (a check
rescheduled or dropped) are skipped; a caller that stops early loses nothing."""

from __future__ import annotations

import pytest
from support.triggers import FlagTrigger

from triggerer.checks import TICK, Check, CheckTable, Subscriber

T0 = 1_800_000_000.0  # a wall-clock second, as the triggerer's clock gives


def held(table: CheckTable, name: str, at: float) -> Check:
    trigger = FlagTrigger(name=name, poke_interval=60)
    row = len(table.by_row) + 1
    sub = Subscriber(row, row, 60.0, True)
    return table.subscribe(trigger.poke_hash(), trigger, trigger.shard(), sub, T0, first_at=at)


def taken(table: CheckTable, now: float, limit: int = 1000) -> list[str]:
    out = []
    for check in table.pop_due(now, limit):
        check.running = True  # as the runner does, before asking for the next
        out.append(check.trigger.name)  # type: ignore[attr-defined]
    return out


def test_a_check_is_never_taken_before_its_due_time() -> None:
    table = CheckTable()
    held(table, "a", T0 + 1.234)
    assert taken(table, T0 + 1.2339) == []
    assert taken(table, T0 + 1.2341) == []  # its tick starts at 1.24
    nxt = table.next_due()
    assert nxt is not None and T0 + 1.234 <= nxt < T0 + 1.234 + TICK
    assert taken(table, nxt + 1e-6) == ["a"]
    assert table.next_due() is None


def test_ticks_are_taken_in_order_and_stale_entries_are_skipped() -> None:
    table = CheckTable()
    a, b = held(table, "a", T0 + 3), held(table, "b", T0 + 1)
    c = held(table, "c", T0 + 2)
    table.schedule(a, T0 + 0.5)  # moved earlier: its entry at 3 s is stale
    table.schedule(c, T0 + 10)  # moved later: its entry at 2 s is stale
    table.drop(b)
    assert table.next_due() == pytest.approx(T0 + 0.5, abs=1e-6)
    assert taken(table, T0 + 5) == ["a"]
    a.running = False
    assert taken(table, T0 + 5) == []  # a's old entry at 3 s was stale
    assert taken(table, T0 + 10) == ["c"]


def test_a_caller_that_stops_early_loses_none() -> None:
    table = CheckTable()
    for i in range(10):
        held(table, f"w{i}", T0 + 1)  # all in one tick
    first = taken(table, T0 + 2, limit=4)
    rest = taken(table, T0 + 2)
    assert len(first) == 4 and sorted(first + rest) == [f"w{i}" for i in range(10)]


def test_a_running_check_is_not_taken_twice() -> None:
    table = CheckTable()
    a = held(table, "a", T0 + 1)
    table.schedule(a, T0 + 1.001)  # a second entry in the same tick
    assert taken(table, T0 + 2) == ["a"]


def test_compact_keeps_only_the_current_entries() -> None:
    table = CheckTable()
    checks = [held(table, f"w{i}", T0 + 1) for i in range(600)]
    for round_ in range(5):  # each move leaves a stale entry behind
        for check in checks:
            table.schedule(check, T0 + 2 + round_)
    assert table._entries == 600 * 6
    table.compact()
    assert table._entries == 600
    assert taken(table, T0 + 5.5) == []
    assert sorted(taken(table, T0 + 6)) == sorted(f"w{i}" for i in range(600))


def test_the_next_due_time_is_one_at_which_its_check_is_taken() -> None:
    """On a monotonic clock's small numbers, a tick times 0.01 can fall a hair short of
    the tick (1234567.16 * 100 < 123456716): waking then must still find the check."""
    table = CheckTable()
    held(table, "m", 1234567.155)
    nxt = table.next_due()
    assert nxt is not None and nxt >= 1234567.155
    assert taken(table, nxt) == ["m"]
