"""Typed task rows: what the engine reads back from the store.

Two shapes, because the compare-and-set returns only the columns its callers read (all 34
doubled its cost on SQLite):

* :class:`MovedTask` - a row that just changed state: enough to settle the transition,
  and, for a claim, to run the attempt.
* :class:`TaskRow` - every column, for the trigger rules (counters) and for people.

Both are built by column name, so a migration that adds a column breaks neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from operator import itemgetter
from typing import Any, ClassVar, Self, TypeVar

Row = Mapping[str, Any]  # a driver row: sqlite3.Row or asyncpg.Record


class _FromRow:
    # The class's columns by name, in field order, so the constructor takes them by
    # position (one itemgetter call per row: the cheapest way to build many).
    _get: ClassVar[itemgetter[Any]]

    @classmethod
    def of(cls, row: Row) -> Self:
        return cls(*cls._get(row))

    @classmethod
    def all(cls, rows: list[Row]) -> list[Self]:
        get = cls._get
        return [cls(*get(row)) for row in rows]


T = TypeVar("T", bound=type[_FromRow])


def _typed(cls: T) -> T:
    # A field with a default is filled by the engine, not read from a column.
    columns = [f.name for f in fields(cls) if f.default is MISSING]  # type: ignore[arg-type]
    cls._get = itemgetter(*columns)
    return cls


@_typed
@dataclass(slots=True)
class MovedTask(_FromRow):
    """The columns ``cas`` returns (schema/common/queries.sql), read by name: the
    statement must return each of them (tests/store/test_queries_parity.py checks)."""

    id: int
    run_id: str
    task_id: str
    map_index: int
    state: str
    attempt: int
    max_attempts: int
    is_leaf: int
    priority: int
    n_parents: int
    expand_from: str | None
    item: str | None  # JSON: a mapped instance's element
    map_total: int | None
    next_method: str | None  # where a deferred task resumes
    next_kwargs: str | None  # JSON
    event: str | None  # JSON: the payload of the event that woke it
    wait_started_at: float | None
    owner: str | None
    started_at: float | None
    hooks: int  # events with handlers (executor/notifications.py): a callback row each
    # ctx.inputs when the claim read them in its own transaction (Exchange.exchange), else
    # read by the attempt.
    inputs: dict[str, Any] | None = None


@_typed
@dataclass(slots=True)
class TaskRow(_FromRow):
    """Every column of ``task`` (schema/<backend>/001_init.sql says what each holds)."""

    id: int
    run_id: str
    task_id: str
    map_index: int
    state: str
    trigger_rule: str
    priority: int
    is_leaf: int
    expand_from: str | None
    map_cap: int | None
    attempt: int
    max_attempts: int
    n_parents: int
    n_done: int
    n_success: int
    n_failed: int
    n_upstream_failed: int
    n_skipped: int
    ready_at: float | None
    owner: str | None
    heartbeat_at: float | None
    started_at: float | None
    ended_at: float | None
    updated_at: float
    output: str | None
    map_total: int | None
    item: str | None
    next_method: str | None
    next_kwargs: str | None
    trigger_id: int | None
    event: str | None
    soft_fail: int
    wait_started_at: float | None
    wait_timeout_at: float | None
    pool: str  # executor/pools.py
    pool_slots: int
    queue: str
