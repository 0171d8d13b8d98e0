"""The DAG page's grid cells and duration bars are written in Python (dag_page.py, charts.py),
not by the template's autoescape: every text in them must still come out escaped, and say
what the cell's plain fields say."""

from __future__ import annotations

import re
from html import unescape

from executor.store.grid import Grid, GridCell, GridRun
from slotless.web.charts import bar_chart
from slotless.web.dag_page import Query, durations_shown, grid_shown

EVIL_RUN = 'r"1<b>&'
EVIL_TASK = "t'<script>alert(1)</script>"


def grid() -> Grid:
    run = GridRun(EVIL_RUN, "2026-11-26", "FAILED", 1.0, 9.0, None, None, None)
    cells = {
        (EVIL_RUN, EVIL_TASK): GridCell(EVIL_RUN, EVIL_TASK, "FAILED", 2.0, 5.0, 2, 3),
        (EVIL_RUN, "mapped"): GridCell(
            EVIL_RUN, "mapped", "FAILED", 2.0, 4.0, counts={"SUCCESS": 2, "FAILED": 1}
        ),
    }
    return Grid(
        "d", None, None, [run], [EVIL_TASK, "mapped", "absent"], cells, {}, {}, None, None,
        True, 10.0, mapped_tasks=frozenset({"mapped"}),
    )  # fmt: skip


def no_raw_markup(html: str) -> None:
    """Only our own tags: no text's < or " got through unescaped."""
    assert "<script" not in html and "<b>" not in html
    for value in re.findall(r'(?:title|href|data-state)="([^"]*)"', html):
        assert "<" not in value and ">" not in value and "'" not in value


def test_a_cells_markup_escapes_its_texts_and_says_its_title() -> None:
    rows = {r.task_id: r for r in grid_shown(grid(), Query()).rows}
    row = rows[EVIL_TASK]
    [cell] = row.cells
    assert cell is not None
    assert (
        cell.title
        == f"{EVIL_TASK} \u00b7 2026-11-26 \u00b7 FAILED \u00b7 3.0 s \u00b7 attempt 2 of 3"
    )
    assert cell.href == "/runs/r%221%3Cb%3E%26/tasks/t%27%3Cscript%3Ealert%281%29%3C%2Fscript%3E"
    html = str(row.html)
    no_raw_markup(html)
    [title] = re.findall(r'title="([^"]*)"', html)
    [href] = re.findall(r'href="([^"]*)"', html)
    assert unescape(title) == cell.title and unescape(href) == cell.href
    assert 'class="cell st-FAILED" ' in html and 'data-state="FAILED"' in html
    mapped = str(rows["mapped"].html)
    no_raw_markup(mapped)
    assert 'class="cell st-FAILED mixed"' in mapped and "2 ok / 1 failed" in mapped
    assert 'style="background: linear-gradient(to top, ' in mapped
    assert str(rows["absent"].html) == (
        '<td><span class="cell none" title="not in this run"></span></td>'
    )


def test_a_duration_bars_title_is_escaped_on_the_dag_page_and_elsewhere() -> None:
    charts = dict(durations_shown(grid()))
    svg = str(charts[EVIL_TASK].svg)
    no_raw_markup(svg)
    [title] = re.findall(r"<title>([^<]*)</title>", svg)
    assert unescape(title).startswith(f"{EVIL_TASK} \u00b7 2026-11-26 \u00b7 {EVIL_RUN} \u00b7 ")
    assert 'data-seconds="3.000"' in svg and "<a " not in svg  # the grid links each run
    # The task page's chart: plain texts, escaped by bar_chart, each bar a link.
    chart = bar_chart([("<i>x</i>", 1.0, "SUCCESS", '/runs/"a"'), ("y", None, "NONE", "/b")])
    svg = str(chart.svg)
    assert "<i>" not in svg and "&lt;i&gt;x&lt;/i&gt;" in svg
    assert '<a href="/runs/&#34;a&#34;"><rect class="dur-bar" data-state="SUCCESS"' in svg
    assert '<rect class="dur-bar none"' in svg and len(chart.bars) == 2
