"""The geometry of the page's small bar charts, worked out in Python; the templates only
write it out (templates/_durations.html). A DAG page of 200 tasks over 25 runs draws 5,000
bars: computing each in the template (a max over the bars, a scale, a colour lookup per
bar) cost most of that page's time, and this keeps it a plain loop.

No chart library: a bar chart on a linear scale is a few rects; a library would add a
script or a build step, and the page must work offline and in its live poll alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..status import human_seconds

BAR_WIDTH, GAP, HEIGHT = 10, 3, 36
# Each state's colour as a fill: the durations' bars and the grid's mixed cells (dag_page).
FILLS = {
    "SUCCESS": "#43a047", "FAILED": "#e53935", "UPSTREAM_FAILED": "#f4511e",
    "RUNNING": "#1e88e5", "QUEUED": "#cfd8dc", "PENDING": "#cfd8dc", "DEFERRED": "#8e24aa",
    "SENSING": "#00acc1", "RETRYING": "#fb8c00", "SKIPPED": "#bdbdbd", "CANCELLED": "#9e9e9e",
    "PAUSED": "#fbc02d",
}  # fmt: skip

# What a chart is drawn from: (label, seconds or None if it did not run, state, href).
Bar = tuple[str, float | None, str, str]


@dataclass(frozen=True, slots=True)
class BarShown:
    x: int
    y: str  # formatted: the SVG's text, not recomputed per draw
    height: str
    fill: str
    state: str
    seconds: str  # "" when it did not run (a grey tick)
    title: str
    href: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    longest: str  # written beside the chart: its scale
    bars: tuple[BarShown, ...]
    links: bool  # each bar opens its href (off where another view already links each run)


def bar_chart(bars: Sequence[Bar], *, links: bool = True) -> Chart:
    """``bars`` left to right, each bar's height its seconds on a scale from 0 to the longest."""
    top = max((s for _, s, _, _ in bars if s is not None), default=0.0)
    shown = []
    for i, (label, secs, state, href) in enumerate(bars):
        x = i * (BAR_WIDTH + GAP) + 1
        if secs is None:
            title = f"{label} \u00b7 {state}: did not run"
            shown.append(BarShown(x, str(HEIGHT - 1), "2", "#e0e0e0", state, "", title, href))
            continue
        h = max(1.5, secs / top * HEIGHT if top else 1.5)
        title = f"{label} \u00b7 {state} \u00b7 {human_seconds(secs)}"
        fill = FILLS.get(state, "#9e9e9e")
        y, height = f"{HEIGHT + 1 - h:.1f}", f"{h:.1f}"
        shown.append(BarShown(x, y, height, fill, state, f"{secs:.3f}", title, href))
    width = len(bars) * (BAR_WIDTH + GAP) + 1
    return Chart(width, HEIGHT + 2, human_seconds(top) if top else "-", tuple(shown), links)
