"""SplitDict: a dict's behaviour, kept in parts that do not grow in step (splitdict.py)."""

from __future__ import annotations

import pytest

from triggerer.splitdict import SplitDict


def test_it_behaves_as_a_dict() -> None:
    d = SplitDict[object, int]()
    plain: dict[object, int] = {}
    keys: list[object] = [*range(-50, 50), *(f"k{i}" for i in range(100)), 2**40 + 3, -(2**41)]
    for i, key in enumerate(keys):
        d[key] = plain[key] = i
    assert len(d) == len(plain) and bool(d)
    assert dict(d.items()) == plain
    assert sorted(d.values()) == sorted(plain.values())
    assert set(d) == set(plain)
    assert all(d[k] == plain[k] and k in d and d.get(k) == plain[k] for k in keys)
    assert d.get("absent") is None and d.get("absent", 7) == 7 and "absent" not in d
    assert d.pop("k3") == plain.pop("k3")
    assert d.pop("k3", None) is None
    with pytest.raises(KeyError):
        d.pop("k3")
    del d[-50]
    del plain[-50]
    with pytest.raises(KeyError):
        d["k3"]
    assert dict(d.items()) == plain
    chunks = list(d.key_chunks())
    assert len(chunks) == 64
    assert sorted(str(k) for chunk in chunks for k in chunk) == sorted(map(str, plain))
    d.clear()
    assert len(d) == 0 and not d and list(d) == []


def test_consecutive_ints_fill_one_part_at_a_time() -> None:
    """Task rows come in order: a run of 16,384 of them grows one part only, so that no
    insertion rehashes more than that part (a 64th of a million)."""
    d = SplitDict[int, None]()
    for row in range(3 * 16_384):
        d[row] = None
        if row in (16_383, 2 * 16_384 - 1):
            sizes = sorted(len(p) for p in d._parts if p)
            assert sizes == [16_384] * ((row + 1) // 16_384), sizes


def test_str_keys_spread_over_every_part() -> None:
    d = SplitDict[str, None]()
    for i in range(64_000):
        d[f"{i:x}-hash"] = None
    sizes = [len(p) for p in d._parts]
    assert min(sizes) > 700 and max(sizes) < 1300, sizes
