"""A dict in 64 parts, so that no insertion rehashes a million entries at once.

CPython grows a dict by rebuilding its whole table when it is two-thirds full: at 699,050
entries that is one call of ~27 ms, on the event loop, in the middle of a load (twice,
since the check table's two indexes grow in step). Split by bits 14-19 of the key's
hash, each part is a 64th of the whole, and the parts do not grow in step:

- a str key's hash is random, so the parts reach a size at scattered moments (64
  rebuilds of ~0.4 ms spread over thousands of insertions, not one of 27 ms);
- an int's hash is itself, so consecutive ints (task rows) fill one part by runs of
  16,384, and each part grows in its own run.

A lookup costs ~0.1 us more than a dict's (one method call): a check does a few.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, ValuesView
from typing import Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

_MISSING = object()


class SplitDict(MutableMapping[K, V], Generic[K, V]):
    """A mapping with a dict's interface, kept in 64 dicts by bits of the key's hash.

    >>> rows = SplitDict[int, str]()
    >>> rows[7] = "seven"
    >>> rows.get(7), len(rows), 8 in rows
    ('seven', 1, False)
    """

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[dict[K, V]] = [{} for _ in range(64)]

    def __getitem__(self, key: K) -> V:
        return self._parts[hash(key) >> 14 & 63][key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | T, /) -> V | T: ...
    def get(self, key: K, default: object = None) -> object:
        return self._parts[hash(key) >> 14 & 63].get(key, default)

    def __setitem__(self, key: K, value: V) -> None:
        self._parts[hash(key) >> 14 & 63][key] = value

    def __delitem__(self, key: K) -> None:
        del self._parts[hash(key) >> 14 & 63][key]

    @overload
    def pop(self, key: K, /) -> V: ...
    @overload
    def pop(self, key: K, default: V | T, /) -> V | T: ...
    def pop(self, key: K, default: object = _MISSING) -> object:
        part = self._parts[hash(key) >> 14 & 63]
        return part.pop(key) if default is _MISSING else part.pop(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._parts[hash(key) >> 14 & 63]

    def __iter__(self) -> Iterator[K]:
        for part in self._parts:
            yield from part

    def __len__(self) -> int:
        return sum(map(len, self._parts))

    def key_chunks(self) -> Iterator[list[K]]:
        """The keys, one part (a 64th) at a time, each a list taken when it is reached:
        a caller on the event loop yields between them."""
        for part in self._parts:
            yield list(part)

    def value_chunks(self) -> Iterator[list[V]]:
        """The values, one part at a time, as :meth:`key_chunks` gives the keys."""
        for part in self._parts:
            yield list(part.values())

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def __bool__(self) -> bool:
        return any(self._parts)

    def clear(self) -> None:
        for part in self._parts:
            part.clear()


class _Values(ValuesView[V]):
    _mapping: SplitDict[object, V]

    def __iter__(self) -> Iterator[V]:
        for part in self._mapping._parts:
            yield from part.values()
