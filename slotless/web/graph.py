"""A run's tasks as a graph: laid out here in columns by depth, drawn as SVG by the run
page's template (templates/_graph.html), where every text is escaped like any other.

Each task is a box coloured by state (see assets.CSS); a mapped task is one box, folded,
with a strip of its instances' states and their counts. Edges run left to right.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from executor.rows import TaskRow

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
    task_id: str
    href: str
    state: str
    x: int
    y: int
    label: str  # the id, cut to fit the box
    sub: str  # its state (and attempt, or how many instances)
    note: str  # a third line: what it waits for, or a mapped task's counts
    strip: list[Segment]


@dataclass(frozen=True, slots=True)
class Drawing:
    """Where everything goes; templates/_graph.html draws it (escaped there, as any text)."""

    width: int
    height: int
    edges: list[str]  # each edge's SVG path
    boxes: list[Box]
    box_w: int = BOX_W
    box_h: int = BOX_H


def drawing(
    tasks: Sequence[TaskRow],
    edges: Sequence[tuple[str, str]],
    mapped: dict[str, dict[str, int]],
    href: Callable[[str], str],
    notes: dict[str, str] | None = None,
) -> Drawing:
    """The graph laid out; ``notes`` adds a third line to a box (what a task waits for)."""
    notes = notes or {}
    pos = layout([t.task_id for t in tasks], edges)
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
    for t in {t.task_id: t for t in tasks}.values():
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
    return Drawing(width, height, paths, boxes)


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
