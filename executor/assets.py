"""Assets: named data a task updates (``outlets=``) and a DAG is scheduled on (``schedule=``).

``Asset("s3://lake/orders")`` is a URI (and an optional name for people). ``a & b`` and
``a | b`` build a condition; ``schedule=[a, b]`` is ``a & b``. A DAG's condition holds when
each asset it needs has had at least one event since the DAG's last asset-triggered run
(docs/scheduling.md, "Assets"). The condition is stored as JSON (:func:`condition_json`)
and evaluated by the store in the transaction that records an event (executor/store/assets.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from .errors import DagError

if TYPE_CHECKING:
    from triggers.base import BaseTrigger

# The longest URI accepted: an S3 key is at most 1,024 bytes, plus its bucket and scheme.
MAX_URI = 2048
# An event's extra JSON, as a task's output is bounded (triggers/limits.py: 64 KiB).
MAX_EXTRA = 64 * 1024
# How deep a condition may nest (a & (b | (c & ...))): a stored tree, read by every event.
MAX_DEPTH = 16
# A scheme, "://", then at least one character and no whitespace or control character.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^\s\x00-\x1f\x7f]+$")


class AssetError(ValueError):
    """A bad URI, name, condition or extra: the message is one line naming it."""


class ExtraTooLarge(AssetError):
    """An event's extra over :data:`MAX_EXTRA` (the API answers 413)."""


def check_uri(uri: object) -> str:
    """``uri`` if it is one we accept (``scheme://rest``, at most :data:`MAX_URI`
    characters, no whitespace), else :class:`AssetError` naming it."""
    if not isinstance(uri, str):
        raise AssetError(f"an asset URI is a string, not {type(uri).__name__}")
    if len(uri) > MAX_URI:
        raise AssetError(f"asset URI longer than {MAX_URI} characters: {uri[:60]!r}...")
    if not _URI.fullmatch(uri):
        raise AssetError(
            f"bad asset URI {uri!r}: write scheme://path (s3://lake/orders, file:///data/x.csv)"
        )
    return uri


def extra_json(extra: object) -> str | None:
    """An event's extra as stored: a JSON object of at most :data:`MAX_EXTRA` bytes."""
    if extra is None:
        return None
    if not isinstance(extra, dict):
        raise AssetError(f"an asset event's extra is a JSON object, not {type(extra).__name__}")
    try:
        text = json.dumps(extra, allow_nan=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise AssetError(f"an asset event's extra cannot be stored as JSON: {exc}") from None
    if len(text.encode()) > MAX_EXTRA:
        raise ExtraTooLarge(f"an asset event's extra is over {MAX_EXTRA // 1024} KiB")
    return text


@dataclass(frozen=True)
class Asset:
    """A piece of data named by its URI, e.g. ``Asset("s3://lake/orders")``.

    Two assets with one URI are the same asset (``name`` is for people). ``watchers``:
    triggers (as for ``start_when``) whose every fire records an event of the asset,
    held by the triggerer. ``a & b``, ``a | b``: conditions for ``DAG(schedule=...)``.
    """

    uri: str
    name: str | None = field(default=None, compare=False)
    watchers: tuple[BaseTrigger, ...] = field(default=(), compare=False, hash=False)

    def __init__(
        self, uri: str, name: str | None = None, *, watchers: Sequence[BaseTrigger] = ()
    ) -> None:
        object.__setattr__(self, "uri", check_uri(uri))
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise AssetError(f"asset {uri!r}: name must be a non-empty string")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "watchers", tuple(watchers))

    def __and__(self, other: Condition) -> AllOf:
        return AllOf((self, _cond(other)))

    def __or__(self, other: Condition) -> AnyOf:
        return AnyOf((self, _cond(other)))

    def __str__(self) -> str:
        return self.uri


@dataclass(frozen=True)
class AllOf:
    """Holds when every part holds (``a & b``, ``[a, b]``)."""

    parts: tuple[Condition, ...]

    def __and__(self, other: Condition) -> AllOf:
        return AllOf((*self.parts, _cond(other)))

    def __or__(self, other: Condition) -> AnyOf:
        return AnyOf((self, _cond(other)))


@dataclass(frozen=True)
class AnyOf:
    """Holds when one part holds (``a | b``)."""

    parts: tuple[Condition, ...]

    def __and__(self, other: Condition) -> AllOf:
        return AllOf((self, _cond(other)))

    def __or__(self, other: Condition) -> AnyOf:
        return AnyOf((*self.parts, _cond(other)))


Condition = Union[Asset, AllOf, AnyOf]  # noqa: UP007 (a runtime alias: isinstance below)


def _cond(value: object) -> Condition:
    if isinstance(value, Asset | AllOf | AnyOf):
        return value
    raise AssetError(f"an asset condition combines assets, not {value!r}")


def as_condition(schedule: object) -> Condition | None:
    """``schedule=`` as a condition if it names assets (an Asset, a condition, a non-empty
    list of assets), None if it is something else (a cron, a timedelta, None)."""
    if isinstance(schedule, Asset | AllOf | AnyOf):
        _check_depth(schedule, 1)
        return schedule
    if isinstance(schedule, list | tuple) and schedule:
        if not all(isinstance(a, Asset) for a in schedule):
            raise AssetError("a schedule list holds assets only: schedule=[Asset(...), ...]")
        return AllOf(tuple(dict.fromkeys(schedule)))
    if isinstance(schedule, list | tuple):
        raise AssetError("an empty list of assets would never start a run")
    return None


def _check_depth(c: Condition, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise AssetError(f"an asset condition nests at most {MAX_DEPTH} deep")
    if not isinstance(c, Asset):
        for p in c.parts:
            _check_depth(p, depth + 1)


def assets_of(c: Condition) -> Iterator[Asset]:
    """Every asset a condition names, in order (repeats included)."""
    if isinstance(c, Asset):
        yield c
    else:
        for p in c.parts:
            yield from assets_of(p)


def to_tree(c: Condition) -> Any:
    """The stored form: a URI string, or ``{"all": [...]}`` / ``{"any": [...]}``."""
    if isinstance(c, Asset):
        return c.uri
    return {"all" if isinstance(c, AllOf) else "any": [to_tree(p) for p in c.parts]}


def condition_json(c: Condition) -> str:
    return json.dumps(to_tree(c), separators=(",", ":"))


def tree_uris(tree: Any) -> set[str]:
    """The URIs a stored condition names."""
    if isinstance(tree, str):
        return {tree}
    return set().union(*(tree_uris(p) for p in next(iter(tree.values()))))


def holds(tree: Any, updated: set[str]) -> bool:
    """Whether a stored condition holds when the assets ``updated`` have had an event."""
    if isinstance(tree, str):
        return tree in updated
    op, parts = next(iter(tree.items()))
    return (all if op == "all" else any)(holds(p, updated) for p in parts)


def describe(tree: Any) -> str:
    """A stored condition in words: ``s3://a & (s3://b | s3://c)``."""
    if isinstance(tree, str):
        return tree
    op, parts = next(iter(tree.items()))
    words = [describe(p) if isinstance(p, str) else f"({describe(p)})" for p in parts]
    return (" & " if op == "all" else " | ").join(words)


def declared(schedule: Condition | None, outlets: Mapping[str, Iterable[Asset]]) -> dict[str, Any]:
    """What the catalogue stores of a DAG's assets: its condition, its tasks' outlets, and
    each asset named (its name, its watchers as ``[classpath, kwargs]``)."""
    named: dict[str, Asset] = {}
    for a in [*(assets_of(schedule) if schedule is not None else ()),
              *(a for outs in outlets.values() for a in outs)]:  # fmt: skip
        if a.uri not in named or (a.name and not named[a.uri].name) or a.watchers:
            named[a.uri] = a
    return {
        "schedule": None if schedule is None else to_tree(schedule),
        "outlets": {t: [a.uri for a in outs] for t, outs in outlets.items() if outs},
        "assets": {
            uri: {
                "name": a.name,
                "watchers": [list(w.serialize()) for w in a.watchers],
            }
            for uri, a in named.items()
        },
    }


def check_declaration(where: str, schedule: object) -> Condition | None:
    """``as_condition`` with the DAG named in the error, as the DAG raises it."""
    try:
        return as_condition(schedule)
    except AssetError as exc:
        raise DagError(f"{where}: schedule: {exc}") from None
