"""A run's tasks as a graph: laid out in columns by depth, drawn as server-side SVG.

Each task is a box coloured by state (see assets.CSS); a mapped task is one box, folded,
with a strip of its instances' states and their counts. Edges run left to right.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from html import escape

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


def svg(
    tasks: Sequence[TaskRow],
    edges: Sequence[tuple[str, str]],
    mapped: dict[str, dict[str, int]],
    href: Callable[[str], str],
    notes: dict[str, str] | None = None,
) -> str:
    """The graph; ``notes`` adds a third line to a box (e.g. what a DEFERRED task waits for)."""
    notes = notes or {}
    by_id = {t.task_id: t for t in tasks}
    pos = layout([t.task_id for t in tasks], edges)
    cols = 1 + max((c for c, _ in pos.values()), default=0)
    rows = 1 + max((r for _, r in pos.values()), default=0)
    width = 2 * PAD + cols * BOX_W + (cols - 1) * GAP_X
    height = 2 * PAD + rows * BOX_H + (rows - 1) * GAP_Y

    def xy(task_id: str) -> tuple[int, int]:
        c, r = pos[task_id]
        return PAD + c * (BOX_W + GAP_X), PAD + r * (BOX_H + GAP_Y)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="task graph">'
    ]
    for p, c in edges:
        if p not in pos or c not in pos:
            continue
        x1, y1 = xy(p)
        x2, y2 = xy(c)
        x1, y1, y2 = x1 + BOX_W, y1 + BOX_H // 2, y2 + BOX_H // 2
        mid = (x1 + x2) / 2
        parts.append(f'<path class="edge" d="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}"/>')
    for task_id, t in by_id.items():
        x, y = xy(task_id)
        state = t.state
        counts = mapped.get(task_id)
        label = task_id if len(task_id) <= 26 else task_id[:25] + "\u2026"
        note = notes.get(task_id, "")
        if counts is not None or t.map_total is not None:
            counts = counts or {}
            total = sum(counts.values())
            sub = f"{MARK.get(state, '')} {state} \u00b7 mapped \u00d7{total}"
            note = " ".join(f"{counts[s]}{MARK[s]}" for s in STATE_ORDER if counts.get(s))
        else:
            sub = box_sub(t)
        parts.append(
            f'<a href="{escape(href(task_id))}" data-task="{escape(task_id)}" '
            f'data-state="{state}" data-k="box:{escape(task_id)}">'
            f"<title>{escape(task_id)}: {state}</title>"
            f'<rect data-k="box:{escape(task_id)}" class="box st-{state}" x="{x}" y="{y}" '
            f'width="{BOX_W}" height="{BOX_H}" rx="6"/>'
            f'<text class="tid" x="{x + 10}" y="{y + 18}">{escape(label)}</text>'
            f'<text class="sub" data-k="sub:{escape(task_id)}" x="{x + 10}" y="{y + 35}">'
            f"{escape(sub)}</text>"
        )
        if note:
            note = note if len(note) <= 36 else note[:12] + "\u2026" + note[-23:]
            parts.append(f'<text class="sub note" x="{x + 10}" y="{y + 51}">{escape(note)}</text>')
        if counts:
            parts.append(_strip(x + 10, y + BOX_H - 9, BOX_W - 20, counts))
        parts.append("</a>")
    parts.append("</svg>")
    return "".join(parts)


def box_sub(t: TaskRow) -> str:
    """The line under an unmapped task's id: its state, and its attempt past the first."""
    sub = f"{MARK.get(t.state, '')} {t.state}"
    if t.attempt > 1:
        sub += f" \u00b7 attempt {t.attempt}/{t.max_attempts}"
    return sub


def _strip(x: int, y: int, width: int, counts: dict[str, int]) -> str:
    """A thin bar of a mapped task's instances, one segment per state."""
    total = sum(counts.values()) or 1
    out = []
    offset = 0.0
    for state in STATE_ORDER:
        n = counts.get(state, 0)
        if not n:
            continue
        w = width * n / total
        out.append(
            f'<rect class="seg st-{state}" x="{x + offset:.1f}" y="{y}" width="{w:.1f}" '
            f'height="5"><title>{n} {state}</title></rect>'
        )
        offset += w
    return "".join(out)
