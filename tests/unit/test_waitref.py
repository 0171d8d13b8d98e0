"""A wait's reference (kind, id) and the int the triggerer holds it as (triggerer/waitref.py):
every kind round-trips, kinds never collide, and the checksum is the SQL's, over the id."""

from __future__ import annotations

import pytest

from triggerer.waitref import WaitKind, by_kind, ident, is_task, pack, unpack, wait_sum

IDS = [1, 2, 999, 2**31 + 7, 2**40 - 1]


@pytest.mark.parametrize("kind", list(WaitKind))
@pytest.mark.parametrize("wait_id", IDS)
def test_every_kind_round_trips_and_keeps_its_id(kind: WaitKind, wait_id: int) -> None:
    key = pack(kind, wait_id)
    assert unpack(key) == (kind, wait_id)
    assert ident(key) == wait_id
    assert is_task(key) is (kind is WaitKind.TASK)
    # The column's plain string packs as the enum does.
    assert pack(str(kind.value), wait_id) == key


def test_kinds_never_share_a_key() -> None:
    keys = [pack(kind, i) for kind in WaitKind for i in IDS]
    assert len(set(keys)) == len(keys)


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown wait kind"):
        pack("person", 1)


def test_by_kind_keys_each_kind_by_its_own_id() -> None:
    waits = {pack(WaitKind.TASK, 5): 50, pack(WaitKind.START, 5): 51, pack(WaitKind.RUN, 5): 52}
    assert by_kind(waits) == {
        WaitKind.TASK: {5: 50},
        WaitKind.START: {5: 51},
        WaitKind.RUN: {5: 52},
    }
    assert by_kind({}) == {WaitKind.TASK: {}, WaitKind.START: {}, WaitKind.RUN: {}}


def test_the_checksum_is_the_shard_sums_expression_over_the_wait_id() -> None:
    for kind in WaitKind:
        for wait_id in IDS:
            assert wait_sum(pack(kind, wait_id), 77) == (wait_id * 1000003 + 77) % 2147483647
