"""A wait's reference, (kind, id), and the one int the triggerer holds it as.

The store names a wait by two columns, ``wait_kind`` and ``wait_id`` (the load statements,
``load_triggers`` and ``load_trigger_range``): a task waiting on its trigger (the task's
row id), a start wait (a schedule or start condition: executor/store/starts.py) or a run
wait (a deadline, a dagrun_timeout, an expected_by: executor/store/runwaits.py).

In memory the triggerer holds up to a million waits, each a key of the check table's
``by_row`` index and of a :class:`~triggerer.checks.Subscriber`: one int per wait, not a
(kind, id) pair (a tuple is ~56 bytes more a wait). The packing is defined here and
nowhere else, never in SQL: a task is its row id (> 0), a start wait the negative of its
id, a run wait the negative of ``_RUN_BASE`` plus its id.
"""

from __future__ import annotations

from enum import StrEnum

# A wait key: a packed (kind, id); and the waits of a fire or a failure, key -> the id of
# the trigger row it waits on (a task that deferred again since waits on another one).
Waits = dict[int, int]


class WaitKind(StrEnum):
    """The ``wait_kind`` column's values."""

    TASK = "task"
    START = "start"
    RUN = "run"


# Above any start wait id (an identity column would take decades of inserts to reach it).
_RUN_BASE = 1 << 40


def pack(kind: str, wait_id: int) -> int:
    """The key of the wait (``kind``, ``wait_id``); ``kind`` as the column gives it."""
    if kind == WaitKind.TASK:
        return wait_id
    if kind == WaitKind.START:
        return -wait_id
    if kind == WaitKind.RUN:
        return -(_RUN_BASE + wait_id)
    raise ValueError(f"unknown wait kind {kind!r}")


def unpack(key: int) -> tuple[WaitKind, int]:
    """(kind, id) of a key made by :func:`pack`."""
    if key > 0:
        return WaitKind.TASK, key
    if key > -_RUN_BASE:
        return WaitKind.START, -key
    return WaitKind.RUN, -key - _RUN_BASE


def ident(key: int) -> int:
    """The id part of a key alone: :func:`unpack` less the tuple (the checksum's hot path)."""
    if key > 0:
        return key
    return -key if key > -_RUN_BASE else -key - _RUN_BASE


def is_task(key: int) -> bool:
    return key > 0


def by_kind(waits: Waits) -> dict[WaitKind, Waits]:
    """``waits`` per kind, each keyed by its own id (the store's row ids); every kind is there."""
    out: dict[WaitKind, Waits] = {kind: {} for kind in WaitKind}
    for key, trigger_id in waits.items():
        kind, wait_id = unpack(key)
        out[kind][wait_id] = trigger_id
    return out


def wait_sum(key: int, trigger_id: int) -> int:
    """A wait's share of its shard's checksum. The ``shard_sums`` statement
    (schema/common/queries.sql) computes the same of (``wait_id``, trigger id): a
    reconcile reads again the shards whose sums differ. Blind to the kind: a trigger row is
    written for one kind of wait (a task's deferral, a start wait, a run wait's moment)."""
    return (ident(key) * 1000003 + trigger_id) % 2147483647
