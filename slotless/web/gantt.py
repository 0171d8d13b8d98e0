"""A run's Gantt chart laid out for the SVG template (templates/_gantt.html): every segment
of :class:`executor.store.runlist.Gantt` placed on one linear time axis.

No chart library: the chart is a few rectangles on a linear scale, laid out here in a few
lines and drawn by the template as inline SVG. It is then part of the page's one response
(works offline, no script to load or to keep up to date), escaped like every other
template (a task id holding ``<script>`` is text), re-rendered by the live poll like any
other block, and readable without JavaScript; hover shows each segment's ``<title>``.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.store.runlist import Gantt, GanttRow, Segment

LABEL = 260  # the task names' column, in the SVG's units (px at 100%)
WIDTH = 900  # the time axis
ROW = 22  # one task row's height
BAR = 14  # a bar's height within its row
AXIS = 28  # the time axis' labels above the rows
MIN_BAR = 1.5  # a segment shorter than this is drawn this wide, so that it can be seen
# Tick steps, seconds: the first that gives at most MAX_TICKS ticks over the chart's span.
STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
         86400, 172800, 604800)  # fmt: skip
MAX_TICKS = 8


@dataclass(frozen=True, slots=True)
class Bar:
    segment: Segment
    x: float
    width: float


@dataclass(frozen=True, slots=True)
class Line:
    """One row of the chart: a task or an instance (``instance``: drawn indented under its
    task), its bars, and its top edge."""

    row: GanttRow
    y: float
    bars: list[Bar]
    instance: bool

    @property
    def label(self) -> str:
        r = self.row
        return f"[{r.map_index}]" if self.instance else r.task_id


@dataclass(frozen=True, slots=True)
class Tick:
    x: float
    offset: float  # seconds from the chart's start


@dataclass(frozen=True, slots=True)
class Chart:
    gantt: Gantt
    lines: list[Line]
    ticks: list[Tick]
    hidden: dict[str, int]  # mapped task -> instances not drawn
    width: float
    height: float

    @property
    def left(self) -> float:
        return LABEL

    @property
    def right(self) -> float:
        return LABEL + WIDTH


def layout(g: Gantt) -> Chart:
    """``g``'s rows, one under the other (a mapped task's instances after it), and its
    segments as bars on the axis from ``g.start`` to ``g.end``."""
    span = max(g.end - g.start, 1e-6)

    def x(t: float) -> float:
        return LABEL + (t - g.start) / span * WIDTH

    def bars(row: GanttRow) -> list[Bar]:
        out = []
        for s in row.segments:
            left = x(s.start)
            out.append(Bar(s, round(left, 2), round(max(MIN_BAR, x(s.end) - left), 2)))
        return out

    lines: list[Line] = []
    hidden: dict[str, int] = {}
    for task in g.tasks:
        for row, instance in ((task.row, False), *((i, True) for i in task.instances)):
            lines.append(Line(row, AXIS + len(lines) * ROW, bars(row), instance))
        if task.hidden:
            hidden[task.row.task_id] = task.hidden
    step = next((s for s in STEPS if span / s <= MAX_TICKS), STEPS[-1])
    ticks = [Tick(round(x(g.start + k * step), 2), k * step) for k in range(int(span // step) + 1)]
    return Chart(g, lines, ticks, hidden, LABEL + WIDTH + 10, AXIS + len(lines) * ROW + 4)
