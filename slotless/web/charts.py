"""The page's small bar charts (a task's durations over runs), drawn in Python as inline SVG:
the geometry, the colours and the markup. A DAG page of 200 tasks over 25 runs draws 5,000
bars: a template loop (a macro, a dozen escaped attributes per bar) cost a third of that
page's time, so the bars are written here as one string per chart, every text in it escaped
(``markupsafe.escape``) or made of characters that need none (numbers, fixed colours).

No chart library: a bar chart on a linear scale is a few rects; a library would add a
script or a build step, and the page must work offline and in its live poll alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from ..status import human_seconds

BAR_WIDTH, GAP, HEIGHT = 10, 3, 36
# Each state's colour as a fill: the durations' bars and the grid's mixed cells (dag_page).
FILLS = {
    "SUCCESS": "#43a047", "FAILED": "#e53935", "UPSTREAM_FAILED": "#f4511e",
    "RUNNING": "#1e88e5", "QUEUED": "#cfd8dc", "PENDING": "#cfd8dc", "DEFERRED": "#8e24aa",
    "SENSING": "#00acc1", "RETRYING": "#fb8c00", "SKIPPED": "#bdbdbd", "CANCELLED": "#9e9e9e",
    "PAUSED": "#fbc02d",
}  # fmt: skip
OTHER_FILL, NONE_FILL = "#9e9e9e", "#e0e0e0"

# What a chart is drawn from: (label, seconds or None if it did not run, state, href).
Bar = tuple[str, float | None, str, str]


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    longest: str  # written beside the chart: its scale
    bars: tuple[Bar, ...]  # what it was drawn from, left to right
    links: bool  # each bar opens its href (off where another view already links each run)
    svg: Markup  # the chart as the page writes it (templates/_durations.html)


def bar_chart(bars: Sequence[Bar], *, links: bool = True, escaped: bool = False) -> Chart:
    """``bars`` left to right, each bar's height its seconds on a scale from 0 to the longest.

    A bar is a rect titled with its label, state and duration; with ``links`` it opens its
    href; one that did not run is a grey tick. ``escaped``: the labels and hrefs are HTML
    already (escaped by the caller, which can escape each run's and task's part once instead
    of every label whole); otherwise they are text, escaped here."""
    bars = tuple(bars)
    top = max((s for _, s, _, _ in bars if s is not None), default=0.0)
    states: dict[str, str] = {}  # each state escaped once, not once per bar
    out: list[str] = []
    for i, (label, secs, state, href) in enumerate(bars):
        x = i * (BAR_WIDTH + GAP) + 1
        if not escaped:
            label, href = escape(label), escape(href)
        st = states.get(state)
        if st is None:
            st = states[state] = escape(state)
        # human_seconds writes digits, letters, dots and spaces: nothing to escape.
        if secs is None:
            out.append(
                f'<rect class="dur-bar none" x="{x}" y="{HEIGHT - 1}" width="10" height="2" '
                f'fill="{NONE_FILL}"><title>{label} \u00b7 {st}: did not run</title></rect>\n'
            )
            continue
        h = max(1.5, secs / top * HEIGHT if top else 1.5)
        rect = (
            f'<rect class="dur-bar" data-state="{st}" data-seconds="{secs:.3f}" x="{x}" '
            f'y="{HEIGHT + 1 - h:.1f}" width="10" height="{h:.1f}" '
            f'fill="{FILLS.get(state, OTHER_FILL)}"><title>{label} \u00b7 {st} \u00b7 '
            f"{human_seconds(secs)}</title></rect>"
        )
        out.append(f'<a href="{href}">{rect}</a>' if links else rect)
    width = len(bars) * (BAR_WIDTH + GAP) + 1
    height = HEIGHT + 2
    longest = human_seconds(top) if top else "-"
    svg = (
        f'<span class="dur-chart"><svg class="dur" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="durations, longest {longest}">\n'
        f'<line x1="0" y1="{height - 1}" x2="{width}" y2="{height - 1}" stroke="#bbb" '
        f'stroke-width="1"/>\n{"".join(out)}</svg><span class="dur-max muted">{longest}</span>'
        "</span>"
    )
    return Chart(width, height, longest, bars, links, Markup(svg))
