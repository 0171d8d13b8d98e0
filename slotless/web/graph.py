"""A run's tasks as a graph: laid out here in columns by depth, drawn as SVG by the run
page's template (templates/_graph.html), where every text is escaped like any other.

Each task is a box coloured by state (see assets.CSS); a mapped task is one box, folded,
with a strip of its instances' states and their counts. Edges run left to right.

Task groups fold as the DAG page's grid folds them (``?fold=GROUP``, repeated): a folded
group is one box, coloured by the state among its tasks that most needs a look (the grid's
rule, ``dag_page.GROUP_STATE``) with a strip of its tasks' states by count; the edges into
and out of its tasks are drawn once each to and from the box, and edges between its own
tasks are not drawn. The box links to the page with the group unfolded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from executor.rows import TaskRow
from executor.taskgroups import GroupNode

BOX_W, BOX_H = 220, 66
GAP_X, GAP_Y = 70, 18
PAD = 16

# Order in which a mapped task's instance states are drawn and listed.
STATE_ORDER = (
    "SUCCESS",
    "RUNNING",
    "DEFERRED",
    "SENSING",
    "RETRYING",
    "PENDING",
    "FAILED",
    "UPSTREAM_FAILED",
    "SKIPPED",
)
MARK = {
    "DEFERRED": "\u25f7",  # a clock face: waiting in the triggerer
    "SENSING": "\u25ce",  # a bullseye: looking again later
    "RETRYING": "\u21bb",  # clockwise arrow: again
    "FAILED": "\u2717",
    "UPSTREAM_FAILED": "\u2717",
    "SUCCESS": "\u2713",
    "RUNNING": "\u25b6",
    "SKIPPED": "\u2013",
    "PENDING": "\u00b7",
}


def layout(task_ids: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """task id -> (column, row): column = longest path from a root; rows ordered so that
    children sit near their parents (one barycentre pass)."""
    known = set(task_ids)
    parents: dict[str, list[str]] = defaultdict(list)
    children: dict[str, list[str]] = defaultdict(list)
    for p, c in edges:
        if p in known and c in known:
            parents[c].append(p)
            children[p].append(c)
    indegree = {t: len(parents[t]) for t in task_ids}
    column = {t: 0 for t in task_ids}
    ready = [t for t in task_ids if indegree[t] == 0]
    while ready:
        t = ready.pop(0)
        for c in children[t]:
            column[c] = max(column[c], column[t] + 1)
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    columns: dict[int, list[str]] = defaultdict(list)
    for t in task_ids:  # definition order within a column
        columns[column[t]].append(t)
    pos: dict[str, tuple[int, int]] = {}
    for col in sorted(columns):
        members = columns[col]

        def centre(i: int, t: str) -> float:
            rows = [pos[p][1] for p in parents[t] if p in pos]
            return sum(rows) / len(rows) if rows else float(i)

        # Each box near its parents' rows, below the box placed before it.
        row = -1
        for score, _, t in sorted((centre(i, t), i, t) for i, t in enumerate(members)):
            row = max(row + 1, round(score))
            pos[t] = (col, row)
    return pos


@dataclass(frozen=True, slots=True)
class Segment:
    """One state's share of a mapped task's strip of instances."""

    state: str
    n: int
    x: float
    width: float


@dataclass(frozen=True, slots=True)
class Box:
    task_id: str  # "" for a folded group's box
    href: str
    state: str
    x: int
    y: int
    label: str  # the id, cut to fit the box
    sub: str  # its state (and attempt, or how many instances)
    note: str  # a third line: what it waits for, or a mapped task's counts
    strip: list[Segment]
    group_id: str = ""  # a folded group's box: the group
    title: str = ""  # its hover text ("": the id and state)


@dataclass(frozen=True, slots=True)
class GroupLink:
    """A group's fold / unfold link above the graph."""

    group_id: str  # in full (extract.s3): a nested group reads as such
    folded: bool
    href: str  # the page with this group's fold state switched
    over: str | None = None  # a mapped group: what it maps over


@dataclass(frozen=True, slots=True)
class Drawing:
    """Where everything goes; templates/_graph.html draws it (escaped there, as any text)."""

    width: int
    height: int
    edges: list[str]  # each edge's SVG path
    boxes: list[Box]
    box_w: int = BOX_W
    box_h: int = BOX_H
    groups: list[GroupLink] = field(default_factory=list)
    fold_all: str = ""  # the page with every top-level group folded ("": no groups)
    unfold_all: str = ""  # the page with none folded ("": none is)


@dataclass(frozen=True, slots=True)
class Folded:
    """The graph's nodes once groups are folded: task ids and folded groups' keys
    (:func:`group_key`), in task order, and the edges between them, each once."""

    nodes: list[str]
    edges: list[tuple[str, str]]
    members: dict[str, list[str]]  # a folded group's key -> its tasks, at every depth
    groups: dict[str, GroupNode]  # a folded group's key -> the group


def parse_fold(values: Sequence[str]) -> tuple[str, ...]:
    """The groups a page's ``?fold=`` asks to fold (repeated, empty ones ignored), with the
    DAG page's limits; ValueError with one line naming what is wrong."""
    from triggers.limits import storable_text

    from .dag_page import MAX_FOLDED  # dag_page imports this module

    fold = tuple(dict.fromkeys(f for f in values if f))
    if len(fold) > MAX_FOLDED:
        raise ValueError(f"fold: at most {MAX_FOLDED} groups at once")
    if not all(storable_text(f) for f in fold):
        raise ValueError("fold: a group id without NUL or lone surrogates")
    return fold


def group_key(group_id: str) -> str:
    """A folded group's node in the layout. No task id starts with "{" (the DAG refuses
    one), so a group never takes the place of a task of the same name."""
    return "{" + group_id + "}"


def chains(tree: GroupNode) -> dict[str, tuple[GroupNode, ...]]:
    """Each grouped task's groups, outermost first."""
    out: dict[str, tuple[GroupNode, ...]] = {}

    def walk(node: GroupNode, above: tuple[GroupNode, ...]) -> None:
        for g in node.groups:
            chain = (*above, g)
            out.update(dict.fromkeys(g.tasks, chain))
            walk(g, chain)

    walk(tree, ())
    return out


def fold(
    task_ids: Sequence[str],
    edges: Sequence[tuple[str, str]],
    tree: GroupNode,
    folded: Collection[str],
) -> Folded:
    """The nodes and edges with each folded group (its outermost folded one, for a task in
    nested folded groups) standing for its tasks. A group id in ``folded`` that the tree
    does not hold is left out, as the grid leaves it out."""
    chain = chains(tree)
    node_of: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    groups: dict[str, GroupNode] = {}
    for t in task_ids:
        outer = next((g for g in chain.get(t, ()) if g.group_id in folded), None)
        if outer is None:
            node_of[t] = t
            continue
        key = group_key(outer.group_id)
        node_of[t] = key
        members.setdefault(key, []).append(t)
        groups[key] = outer
    nodes = list(dict.fromkeys(node_of[t] for t in task_ids))
    shown = dict.fromkeys(
        (node_of[p], node_of[c])
        for p, c in edges
        if p in node_of and c in node_of and node_of[p] != node_of[c]
    )
    return Folded(nodes, list(shown), members, groups)


def drawing(
    tasks: Sequence[TaskRow],
    edges: Sequence[tuple[str, str]],
    mapped: dict[str, dict[str, int]],
    href: Callable[[str], str],
    notes: dict[str, str] | None = None,
    tree: GroupNode | None = None,
    folded: Sequence[str] = (),
    fold_href: Callable[[tuple[str, ...]], str] | None = None,
) -> Drawing:
    """The graph laid out; ``notes`` adds a third line to a box (what a task waits for).
    ``tree``: the run's task groups, of which ``folded`` are drawn as one box each;
    ``fold_href`` makes the page's URL for a fold state (the groups' links)."""
    notes = notes or {}
    tree = tree or GroupNode("", ())
    by_id = {t.task_id: t for t in tasks}
    shown = fold(list(by_id), edges, tree, folded)
    edges = shown.edges
    pos = layout(shown.nodes, edges)
    cols = 1 + max((c for c, _ in pos.values()), default=0)
    rows = 1 + max((r for _, r in pos.values()), default=0)

    def xy(task_id: str) -> tuple[int, int]:
        c, r = pos[task_id]
        return PAD + c * (BOX_W + GAP_X), PAD + r * (BOX_H + GAP_Y)

    paths = []
    for p, c in edges:
        if p not in pos or c not in pos:
            continue
        x1, y1 = xy(p)
        x2, y2 = xy(c)
        x1, y1, y2 = x1 + BOX_W, y1 + BOX_H // 2, y2 + BOX_H // 2
        mid = (x1 + x2) / 2
        paths.append(f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}")
    boxes = []
    for key in shown.nodes:
        if key in shown.groups:
            x, y = xy(key)
            group = shown.groups[key]
            states = [by_id[t].state for t in shown.members[key]]
            unfold = tuple(f for f in folded if f != group.group_id)
            boxes.append(group_box(group, states, x, y, fold_href(unfold) if fold_href else ""))
            continue
        t = by_id[key]
        x, y = xy(t.task_id)
        counts = mapped.get(t.task_id)
        note = notes.get(t.task_id, "")
        strip: list[Segment] = []
        if counts is not None or t.map_total is not None:
            counts = counts or {}
            sub = f"{MARK.get(t.state, '')} {t.state} \u00b7 mapped \u00d7{sum(counts.values())}"
            note = " ".join(f"{counts[s]}{MARK[s]}" for s in STATE_ORDER if counts.get(s))
            strip = _strip(x + 10, BOX_W - 20, counts)
        else:
            sub = box_sub(t)
        boxes.append(
            Box(
                task_id=t.task_id,
                href=href(t.task_id),
                state=t.state,
                x=x,
                y=y,
                label=t.task_id if len(t.task_id) <= 26 else t.task_id[:25] + "\u2026",
                sub=sub,
                note=note if len(note) <= 36 else note[:12] + "\u2026" + note[-23:],
                strip=strip,
            )
        )
    width = 2 * PAD + cols * BOX_W + (cols - 1) * GAP_X
    height = 2 * PAD + rows * BOX_H + (rows - 1) * GAP_Y
    links, fold_all, unfold_all = group_links(tree, folded, fold_href)
    return Drawing(width, height, paths, boxes, groups=links, fold_all=fold_all,
                   unfold_all=unfold_all)  # fmt: skip


def group_box(group: GroupNode, states: Sequence[str], x: int, y: int, href: str) -> Box:
    """A folded group's box: the state among its tasks' that most needs a look, as the
    grid's row of a folded group shows it, and a strip of its tasks' states by count."""
    # dag_page imports this module, so its rule is read when a group is drawn.
    from .dag_page import GROUP_STATE, counts_text

    counts: dict[str, int] = {}
    for s in states:
        counts[s] = counts.get(s, 0) + 1
    state = next((s for s in GROUP_STATE if s in counts), next(iter(counts), "PENDING"))
    kind = "mapped group" if group.mapped else "group"
    sub = f"{MARK.get(state, '')} {state} \u00b7 {kind} of {len(states)}"
    note = " ".join(f"{counts[s]}{MARK[s]}" for s in STATE_ORDER if counts.get(s))
    over = f" over {group.over}" if group.mapped else ""
    label = f"\u25b8 {group.group_id}"
    return Box(
        task_id="",
        href=href,
        state=state,
        x=x,
        y=y,
        label=label if len(label) <= 26 else label[:25] + "\u2026",
        sub=sub,
        note=note if len(note) <= 36 else note[:12] + "\u2026" + note[-23:],
        strip=_strip(x + 10, BOX_W - 20, counts),
        group_id=group.group_id,
        title=f"{group.group_id} ({kind}{over}): {len(states)} tasks: {counts_text(counts)}"
        " \u00b7 click to unfold",
    )


def group_links(
    tree: GroupNode,
    folded: Sequence[str],
    fold_href: Callable[[tuple[str, ...]], str] | None,
) -> tuple[list[GroupLink], str, str]:
    """Each group's fold / unfold link (none for a group inside a folded one: its box
    stands for it), and the links that fold every top-level group and unfold them all."""
    if fold_href is None or not tree.groups:
        return [], "", ""
    links: list[GroupLink] = []
    hidden: set[str] = set()
    for _, g in tree.walk():
        parent = g.group_id.rpartition(".")[0]
        if parent in hidden or parent in folded:
            hidden.add(g.group_id)
            continue
        is_folded = g.group_id in folded
        switched = (
            tuple(f for f in folded if f != g.group_id) if is_folded else (*folded, g.group_id)
        )
        links.append(GroupLink(g.group_id, is_folded, fold_href(switched), g.over))
    top = tuple(g.group_id for g in tree.groups)
    fold_all = "" if set(top) <= set(folded) else fold_href(top)
    unfold_all = (
        fold_href(()) if any(f in {g.group_id for _, g in tree.walk()} for f in folded) else ""
    )
    return links, fold_all, unfold_all


def box_sub(t: TaskRow) -> str:
    """The line under an unmapped task's id: its state, and its attempt past the first."""
    sub = f"{MARK.get(t.state, '')} {t.state}"
    if t.attempt > 1:
        sub += f" \u00b7 attempt {t.attempt}/{t.max_attempts}"
    return sub


def _strip(x: int, width: int, counts: dict[str, int]) -> list[Segment]:
    """A thin bar of a mapped task's instances, one segment per state."""
    total = sum(counts.values()) or 1
    out = []
    offset = 0.0
    for state in STATE_ORDER:
        n = counts.get(state, 0)
        if n:
            w = width * n / total
            out.append(Segment(state, n, round(x + offset, 1), round(w, 1)))
            offset += w
    return out
