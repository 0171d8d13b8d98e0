"""A big load holds a plain polled row without validating its kwargs (issue 17): the
first check validates them. What must not change: a bad row fails its own task and no
other, with the load's message, and every wait is checked at its own interval.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from typing import Any

import pytest

from triggerer.checks import CheckTable
from triggerer.loading import Loader, _interval_in
from triggerer.models import KeptModels
from triggerer.running import CheckRunner
from triggerer.settling import Settler
from triggerer.waitref import pack
from triggerer.writing import Outbox
from triggers.base import BaseTrigger, TriggerEvent
from triggers.checking import CheckContext
from triggers.context import TriggerContext
from triggers.registry import register


@register
class OptionsTrigger(BaseTrigger):
    """Never true; its options may hold a key named like the interval."""

    name: str
    options: dict[str, Any] = {}

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        return None


CLASSPATH = OptionsTrigger.classpath()


class Rows:
    """The store's side of a load: these rows, as load_triggers returns them."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    async def max_trigger_id(self) -> int:
        return max((col(r, "trigger_id") for r in self.rows), default=0)

    async def max_release_id(self) -> int:
        return 0

    async def load_triggers(
        self, shards: Collection[int], after_id: int = 0, upto: int | None = None
    ) -> list[Any]:
        top = (
            upto if upto is not None else max((col(r, "trigger_id") for r in self.rows), default=0)
        )
        return [
            r for r in self.rows
            if col(r, "shard") in shards and after_id < col(r, "trigger_id") <= top
        ]  # fmt: skip


class FakeRow(tuple[Any, ...]):
    """A row as both drivers' rows read: by position, and by name through keys()."""

    COLUMNS: tuple[str, ...] = (
        "trigger_id", "classpath", "kwargs", "poke_hash", "shard",
        "wait_kind", "wait_id", "next_method", "not_before",
    )  # fmt: skip

    def keys(self) -> tuple[str, ...]:
        return self.COLUMNS


def col(r: Any, name: str) -> Any:
    return r[list(r.keys()).index(name)]


def row(n: int, kwargs: dict[str, Any] | str, poke_hash: str | None = None) -> tuple[Any, ...]:
    text = kwargs if isinstance(kwargs, str) else json.dumps(kwargs, sort_keys=True)
    return FakeRow((n, CLASSPATH, text, poke_hash or f"h{n}", 0, "task", 100 + n, None, None))


async def load(rows: list[tuple[Any, ...]]) -> tuple[CheckTable, Outbox]:
    table = CheckTable()
    ops: Any = Rows(rows)
    outbox = Outbox(ops)
    loader = Loader(ops, table, outbox, shards_per_query=4, clock=lambda: 1000.0)
    await loader.load([0], full=True)
    return table, outbox


@pytest.mark.parametrize(
    ("kwargs", "interval"),
    [
        ('{"name": "a", "poke_interval": 5.0}', 5.0),
        ('{"name": "a","poke_interval":7}', 7.0),
        ('{"name": "a"}', 60.0),  # absent: the class's default
        ('{"options": {"poke_interval": 1}, "poke_interval": 2}', None),  # twice: validate now
        ('{"name": "a", "poke_interval": -1}', None),
        ('{"name": "a", "poke_interval": "soon"}', None),
        ('{"name": "a", "poke_interval": 1e999}', None),
    ],
)
def test_the_interval_is_read_from_the_json_or_left_to_validation(
    kwargs: str, interval: float | None
) -> None:
    assert _interval_in(kwargs, 60.0) == interval


async def test_a_plain_row_is_held_unvalidated_and_its_first_check_validates_it() -> None:
    table, outbox = await load([row(1, {"name": "a", "poke_interval": 5.0})])
    check = table.by_hash["h1"]
    assert not check.valid and check.interval == 5.0
    assert check.trigger == OptionsTrigger(name="a", poke_interval=5.0)
    assert check.valid and not outbox.batch


async def test_an_interval_read_from_a_nested_object_is_corrected_by_the_first_build() -> None:
    table, _ = await load([row(1, {"name": "a", "options": {"poke_interval": 1}})])
    check = table.by_hash["h1"]
    assert check.interval == 1.0  # what the JSON seemed to say: only placed the first check
    check.model()
    assert check.interval == 60.0 and check.subscribers[101].interval == 60.0


async def test_a_bad_row_joined_by_a_good_one_fails_alone() -> None:
    bad = row(1, {"name": "a", "bogus": 1}, poke_hash="same")
    good = row(2, {"name": "a"}, poke_hash="same")
    table, outbox = await load([bad, good])
    check = table.by_hash["same"]
    assert check.valid and list(check.subscribers) == [102]
    [(waits, why)] = outbox.batch.failures
    assert waits == {101: 1}
    assert why.startswith(f"cannot load trigger: invalid kwargs for {CLASSPATH}: bogus:")


async def test_a_bad_row_fails_its_own_task_at_its_first_check() -> None:
    table, outbox = await load([row(1, {"name": "a", "bogus": 1}), row(2, {"name": "b"})])
    assert len(table) == 2 and not outbox.batch
    settler = Settler(table, outbox, KeptModels(), max_backoff=60)
    runner = CheckRunner(
        table, CheckContext(), settler, wake=asyncio.Event(), clock=lambda: 2000.0,
        max_concurrency=4, wave=4, batch_size=10, check_timeout=5,
    )  # fmt: skip
    assert runner.dispatch(2000.0)
    await asyncio.gather(*runner.tasks)
    assert list(table.by_hash) == ["h2"] and settler.checks_done == 1
    [(waits, why)] = outbox.batch.failures
    assert waits == {101: 1}
    assert why.startswith(f"cannot load trigger: invalid kwargs for {CLASSPATH}: bogus:")
    assert settler.unloadable == 1


class ReorderedRow(FakeRow):
    """A row whose statement lists its columns in another order (and one more column)."""

    COLUMNS = ("wait_id", "extra", *(c for c in FakeRow.COLUMNS if c != "wait_id"))


async def test_columns_are_read_by_name_whatever_their_order() -> None:
    """The loader finds its columns by name: a start wait and a task, their values in
    another order than the load statements give them, are held under their own keys."""
    rows: list[tuple[Any, ...]] = []
    for n, kind in ((1, "task"), (2, "start")):
        base = dict(zip(FakeRow.COLUMNS, row(n, {"name": f"w{n}"}), strict=True))
        base["wait_kind"] = kind
        values = {**base, "extra": "ignored"}
        rows.append(ReorderedRow(values[c] for c in ReorderedRow.COLUMNS))
    table, outbox = await load(rows)
    assert not outbox.batch
    held = {key: check.subscribers[key].trigger_id for key, check in table.by_row.items()}
    assert held == {pack("task", 101): 1, pack("start", 102): 2}
