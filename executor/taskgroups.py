"""A DAG's task groups as a tree, read from its catalogued shape (``dag.shape``): for the
DAG page's graph and grid (collapsible groups) and ``slotless status --run``.

Groups are kept in the shape explicitly (executor/store/runs.py: ``GroupShape``), not
guessed from dots in task ids: a task outside any group may have a dot in its id.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .store.runs import GroupShape, RunShape, shape_groups, shape_parts


@dataclass(frozen=True, slots=True)
class GroupNode:
    """A group, its own tasks (in the shape's order) and its subgroups. The root of a tree
    has ``group_id == ""`` and holds the tasks of no group."""

    group_id: str
    tasks: tuple[str, ...]
    groups: tuple[GroupNode, ...] = ()
    over: str | None = None  # a mapped group: what it maps over, for people

    @property
    def label(self) -> str:
        """Its own name (``s3`` for ``extract.s3``)."""
        return self.group_id.rpartition(".")[2]

    @property
    def mapped(self) -> bool:
        return self.over is not None

    def task_ids(self) -> list[str]:
        """Its tasks and its subgroups', depth first."""
        return [*self.tasks, *(t for g in self.groups for t in g.task_ids())]

    def walk(self) -> Iterator[tuple[int, GroupNode]]:
        """Each group under it with its depth (its own children at 1), depth first."""
        for g in self.groups:
            yield 1, g
            for depth, sub in g.walk():
                yield depth + 1, sub

    def to_json(self) -> dict[str, object]:
        return {
            "group_id": self.group_id,
            "label": self.label,
            "over": self.over,
            "tasks": list(self.tasks),
            "groups": [g.to_json() for g in self.groups],
        }


def group_tree(shape: str | RunShape | None) -> GroupNode:
    """The group tree of a DAG shape (its JSON as the catalogue stores it, or parsed).
    A shape without groups (or none) gives a root holding every task."""
    if shape is None:
        return GroupNode("", ())
    if isinstance(shape, str):
        order = [t.task_id for t in shape_parts(shape)[0]]
        groups = shape_groups(shape)
    else:
        order, groups = [t.task_id for t in shape.tasks], shape.groups
    return _tree(order, groups)


def _tree(order: list[str], groups: Sequence[GroupShape]) -> GroupNode:
    position = {t: i for i, t in enumerate(order)}
    grouped = {t for g in groups for t in g.tasks}
    # Declared parents come before their subgroups, so building from the deepest up works.
    by_parent: dict[str, list[GroupNode]] = {}
    for g in sorted(groups, key=lambda g: g.group_id.count("."), reverse=True):
        parent = g.group_id.rpartition(".")[0]
        node = GroupNode(
            g.group_id,
            tuple(sorted(g.tasks, key=lambda t: position.get(t, len(position)))),
            tuple(sorted(by_parent.pop(g.group_id, []), key=lambda n: _first(n, position))),
            g.over,
        )
        by_parent.setdefault(parent, []).append(node)
    top = sorted(by_parent.pop("", []), key=lambda n: _first(n, position))
    return GroupNode("", tuple(t for t in order if t not in grouped), tuple(top))


def tree_from_ids(task_ids: Sequence[str]) -> GroupNode:
    """A tree guessed from the dots in task ids (``extract.s3.load`` in ``extract.s3``),
    for a run whose DAG the catalogue does not hold: what is shown when the shape is not
    known (mapped groups are not told apart)."""
    members: dict[str, list[str]] = {}
    for t in task_ids:
        group = t.rpartition(".")[0]
        members.setdefault(group, []).append(t)
        while group:  # its ancestors exist, if empty
            group = group.rpartition(".")[0]
            members.setdefault(group, [])
    groups = tuple(GroupShape(g, tuple(ts)) for g, ts in members.items() if g)
    return _tree(list(task_ids), groups)


def run_tree(shape: str | RunShape | None, task_ids: Sequence[str]) -> GroupNode:
    """A run's groups: its DAG's catalogued shape's, or guessed from ``task_ids``' dots
    when the catalogue does not hold the DAG (a run of ``slotless run``'s)."""
    return group_tree(shape) if shape else tree_from_ids(task_ids)


def group_of(shape: str | RunShape | None) -> dict[str, str]:
    """Each grouped task's innermost group id."""
    out: dict[str, str] = {}
    for _, node in group_tree(shape).walk():
        out.update(dict.fromkeys(node.tasks, node.group_id))
    return out


def _first(node: GroupNode, position: dict[str, int]) -> int:
    """Where a group's first task is in the shape: groups are shown in declaration order."""
    return min((position.get(t, len(position)) for t in node.task_ids()), default=len(position))
