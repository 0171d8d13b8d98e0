"""How a mapped task is cut into instances: what it maps over, and the items it gets.

A mapped task's template row keeps its :class:`MapSpec` in ``expand_from``. The form
stored before this module, a mapping over one upstream task's list (``expand=upstream``),
stays that task's id, so runs and shapes stored earlier read as they did; every other form
(a literal list, ``expand(a=..., b=...)``'s cross product, ``expand_kwargs``, a member of a
mapped task group) is a JSON object, which no task id can be mistaken for (task ids may
not begin with ``{``: executor/dag.py).

Pure code: the state machine (executor/statemachine.py) reads the upstream lists and asks
:func:`items_of` for the instances' items; the worker's checks (executor/attempt.py) ask
:func:`expansion_problem` the same questions about an output before it is stored.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

MapKind = Literal["items", "product", "kwargs"]


@dataclass(frozen=True, slots=True)
class Source:
    """A list to map over: an upstream task's output (``task``) or a literal ``values``."""

    task: str | None = None
    values: tuple[Any, ...] | None = None

    def describe(self) -> str:
        return self.task if self.task is not None else f"a list of {len(self.values or ())}"


@dataclass(frozen=True, slots=True)
class MapSpec:
    """What a mapped task maps over.

    ``items``: one instance per element of one list (``ctx.item`` is the element).
    ``product``: one instance per combination of several named lists, in
    ``itertools.product`` order (``ctx.item`` is ``{name: element}``, also passed as keyword
    arguments). ``kwargs``: one instance per dict of a list of dicts (``ctx.item`` is the
    dict, passed as keyword arguments).

    A member of a mapped task group also carries its ``group``, its parents inside the
    group (``after``: instance ``i`` waits for their instances ``i``), its children there
    (``before``), the parents its template waits for (``needs``: the group's parents
    outside it, the same for every member, so that they all expand in one transaction) and
    its own trigger rule, applied per instance to ``after`` (``rule``).
    """

    kind: MapKind
    over: tuple[tuple[str, Source], ...]
    group: str | None = None
    after: tuple[str, ...] = ()
    before: tuple[str, ...] = ()
    needs: tuple[str, ...] | None = None
    rule: str | None = None

    @property
    def tasks(self) -> list[str]:
        """The upstream tasks whose outputs it maps over."""
        return [s.task for _, s in self.over if s.task is not None]

    @property
    def legacy(self) -> bool:
        """Whether it is the form stored as a bare task id."""
        return (
            self.kind == "items"
            and self.group is None
            and len(self.over) == 1
            and self.over[0][1].task is not None
        )

    def encode(self) -> str:
        if self.legacy:
            task = self.over[0][1].task
            assert task is not None
            return task
        return json.dumps(self._doc(values=True), separators=(",", ":"))

    def instance_tag(self) -> str:
        """What its instances keep in ``expand_from``: the spec without the literal lists
        (50,000 instances must not each carry the list they were cut from)."""
        if self.legacy:
            return self.encode()
        return json.dumps(self._doc(values=False), separators=(",", ":"))

    def describe(self) -> str:
        """One line for people: ``extract``, ``a list of 3``, ``a x b``."""
        over = " x ".join(s.describe() for _, s in self.over)
        kind = {"items": "", "product": "", "kwargs": "the dicts of "}[self.kind]
        group = f" (group {self.group})" if self.group else ""
        return f"{kind}{over}{group}"

    def _doc(self, *, values: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kind": self.kind,
            "over": [
                [name, {"task": s.task}]
                if s.task is not None
                else [name, {"values": list(s.values or ()) if values else None}]
                for name, s in self.over
            ],
        }
        if self.group is not None:
            doc |= {"group": self.group, "after": list(self.after), "before": list(self.before)}
            if self.needs is not None:
                doc["needs"] = list(self.needs)
            if self.rule is not None:
                doc["rule"] = self.rule
        return doc


@functools.lru_cache(maxsize=4096)
def decode(text: str) -> MapSpec:
    """The spec an ``expand_from`` holds (cached: each ended instance asks again)."""
    if not text.startswith("{"):
        return MapSpec("items", (("", Source(task=text)),))
    doc = json.loads(text)
    over = tuple(
        (
            name,
            Source(task=s["task"])
            if "task" in s
            else Source(values=None if s["values"] is None else tuple(s["values"])),
        )
        for name, s in doc["over"]
    )
    needs = doc.get("needs")
    return MapSpec(
        doc["kind"],
        over,
        doc.get("group"),
        tuple(doc.get("after", ())),
        tuple(doc.get("before", ())),
        None if needs is None else tuple(needs),
        doc.get("rule"),
    )


def describe(expand_from: str) -> str:
    """What a stored ``expand_from`` maps over, for people (``slotless run``'s bars)."""
    return decode(expand_from).describe()


class _Row(Protocol):
    task_id: str
    expand_from: str | None


def group_mates(rows: Iterable[_Row], picked: Collection[str]) -> set[str]:
    """The tasks (template rows) of every mapped group a task of ``picked`` belongs to."""
    groups: dict[str, set[str]] = {}
    for r in rows:
        if r.expand_from is not None and r.expand_from.startswith("{"):
            group = decode(r.expand_from).group
            if group is not None:
                groups.setdefault(group, set()).add(r.task_id)
    return {t for members in groups.values() if members & set(picked) for t in members}


def expansion_problem(source: str, items: Any, cap: int | None) -> str | None:
    """Why ``items`` (the output of ``source``) cannot be mapped over, or None."""
    if not isinstance(items, list):
        return f"cannot map over the output of {source}: it is a {type(items).__name__}, not a list"
    if cap is not None and len(items) > cap:
        return (
            f"fan-out of {len(items)} items from {source} exceeds the cap of {cap}; "
            "no instance was created"
        )
    return None


def kwargs_problem(source: str, items: Sequence[Any]) -> str | None:
    """Why ``items`` cannot be ``expand_kwargs``'s list of dicts, or None."""
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not all(isinstance(k, str) for k in item):
            return (
                f"expand_kwargs over {source}: item {i} is {type(item).__name__} "
                f"{_short(item)}, not a dict of keyword arguments"
            )
    return None


def items_of(
    spec: MapSpec, lists: Mapping[str, Any], cap: int | None
) -> tuple[list[Any] | None, str | None]:
    """The instances' items (or why there can be none) given each argument's list:
    ``lists`` maps each name of ``spec.over`` to its upstream's output or literal list.
    The cap bounds the number of instances (a cross product's size is known, and refused,
    before one combination is built)."""
    named = [(name, s.describe(), lists[name]) for name, s in spec.over]
    for _, what, items in named:
        problem = expansion_problem(what, items, None)
        if problem:
            return None, problem
    if spec.kind == "product":
        size = math.prod(len(items) for _, _, items in named)
        if cap is not None and size > cap:
            sizes = " x ".join(f"{len(items)} ({name})" for name, _, items in named)
            return None, (
                f"fan-out of {size} instances ({sizes}) exceeds the cap of {cap}; "
                "no instance was created"
            )
        names = [name for name, _, _ in named]
        combos = itertools.product(*(items for _, _, items in named))
        return [dict(zip(names, combo, strict=True)) for combo in combos], None
    [(_, what, items)] = named
    problem = expansion_problem(what, items, cap)
    if problem is None and spec.kind == "kwargs":
        problem = kwargs_problem(what, items)
    return (None, problem) if problem else (list(items), None)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
