"""A DAG's page served by a real `slotless ui`: 30 runs of a six-task DAG with a mapped task
(some runs with one instance failed, the newest still running) as a grid whose cells say
what the store says, a mapped task's instances counted and expanded, durations and a
calendar; bad query values refused with one line; a DAG id that is markup shown as text;
the API's grid and calendar; and in headless Chromium, a cell clicked open and the grid
paged back to the older runs and forward again."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.request
from datetime import date, timedelta
from html import unescape
from pathlib import Path
from urllib.parse import quote

import pytest
from openapi_spec_validator import validate
from support.browser import devtools
from support.exchanging import claim, complete
from support.griddy import GRIDDY, TASKS
from support.helpers import (
    REPO,
    attempt_of,
    sql,
    write_dag,
)
from support.ops import http_get, ui_process

from executor.catalogue import scan
from executor.loader import load_dag
from executor.outcomes import Succeeded
from executor.store import open_store
from executor.worker import Worker

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"

SCRIPT_ID = "<script>alert(1)</script>"
FAILING = {3, 10, 17, 24}  # the runs (by creation, from 0) whose shard 4 fails


@pytest.fixture(scope="module")
def dag_ui(tmp_path_factory: pytest.TempPathFactory):
    """griddy catalogued with 30 runs (the newest still running), a run of a DAG id that is
    markup and no catalogue row, and `slotless ui` serving them."""
    tmp = tmp_path_factory.mktemp("dag-page")
    db = tmp / "dag.db"
    url = f"sqlite:///{db}"
    folder = tmp / "dags"
    folder.mkdir()
    path = write_dag(folder, GRIDDY, "griddy.py")
    runs = asyncio.run(_thirty_runs(url, folder, path))
    sql(
        db,
        "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at, tasks_unfinished,"
        " run_key) VALUES (?, ?, '2026-01-01', 'SUCCESS', 1, 0, 'k')",
        f"{SCRIPT_ID}:run",
        SCRIPT_ID,
    )
    with ui_process(url, tmp / "ui.log", ready="/dags") as base:
        yield {"base": base, "runs": runs, "db": db, "tmp": tmp}


async def _thirty_runs(url: str, folder: Path, path: Path) -> list[str]:
    """The run ids, oldest first: 29 served to their end, the newest with only extract
    done (its shard's instances waiting)."""
    store = await open_store(url)
    try:
        await scan(store, folder, timeout=30, by_hand=True)
        dag = load_dag(str(path), "griddy")
        runs = []
        for i in range(29):
            conf = {"fail_item": 4} if i in FAILING else None
            runs.append(await store.runs.create_run(dag, _day(i), conf=conf, dag_file=str(path)))
        worker = Worker(store, dags={"griddy": dag}, poll_interval=0.02, slots=4)

        async def ended() -> bool:
            states = await store.views.runs_states(runs)
            return all(s in ("SUCCESS", "FAILED") for s in states.values())

        await asyncio.wait_for(worker.run(until=ended), 60)
        runs.append(await store.runs.create_run(dag, _day(29), dag_file=str(path)))
        [row] = await claim(store, "test", 1)
        assert row.task_id == "extract" and row.run_id == runs[-1]
        await complete(store, [Succeeded(**attempt_of(row), output_json="[0,1,2,3,4,5]")])
        return runs
    finally:
        await store.close()


def _day(i: int) -> date:
    return date(2026, 10, 1) + timedelta(days=i)


def page_url(ui: dict, query: str = "") -> str:
    return f"{ui['base']}/dags/griddy{query}"


def store_states(ui: dict, runs: list[str]) -> dict[tuple[str, str], str]:
    marks = ",".join("?" * len(runs))
    rows = sql(
        ui["db"],
        f"SELECT run_id, task_id, state FROM task WHERE map_index = -1 AND run_id IN ({marks})",
        *runs,
    )
    return {(r["run_id"], r["task_id"]): r["state"] for r in rows}


def grid_of(html: str) -> tuple[list[str], dict[tuple[str, str], str], dict[str, str]]:
    """The grid as drawn: its columns' run ids, each (run, task)'s state, each mapped cell's
    title by run."""
    block = re.search(r'<table class="dag-grid" id="grid">(.*?)</table>', html, re.DOTALL)
    assert block is not None
    columns = [unescape(r) for r in re.findall(r'data-run="([^"]+)"', block.group(1))]
    states: dict[tuple[str, str], str] = {}
    titles: dict[str, str] = {}
    for task, rest in re.findall(r'<tr data-task="([^"]+)">(.*?)</tr>', block.group(1), re.DOTALL):
        cells = re.findall(r"<td>(.*?)</td>", rest, re.DOTALL)
        assert len(cells) == len(columns), task
        for run_id, cell in zip(columns, cells, strict=True):
            found = re.search(r'data-state="([A-Z_]+)"', cell)
            assert found is not None, (task, run_id, cell)
            states[(run_id, task)] = found.group(1)
            title = re.search(r'title="([^"]+)"', cell)
            if task == "shard" and title is not None:
                titles[run_id] = unescape(title.group(1))
    return columns, states, titles


def test_the_grid_shows_the_newest_runs_as_the_store_has_them(dag_ui):
    status, html = http_get(page_url(dag_ui))
    assert status == 200
    runs = dag_ui["runs"]
    columns, states, titles = grid_of(html)
    assert columns == runs[-25:]  # the 25 newest, oldest on the left
    assert states == store_states(dag_ui, columns)
    assert re.findall(r'<tr data-task="([^"]+)">', html)[: len(TASKS)] == TASKS
    # A mapped task is one cell with its instances counted.
    for i, run_id in enumerate(runs[-25:], start=5):
        if i in FAILING:
            assert "FAILED: 5 ok / 1 failed" in titles[run_id], titles[run_id]
        elif i < 29:
            assert "SUCCESS: 6 ok" in titles[run_id], titles[run_id]
    assert "6 pending" in titles[runs[-1]]  # the newest: expanded, its instances waiting
    assert 'class="cell st-FAILED mixed"' in html
    # Cells open the task's page; columns the run's.
    run_id = runs[-1]
    assert f'href="/runs/{quote(run_id, safe="")}/tasks/shard"' in html
    assert f'href="/runs/{quote(run_id, safe="")}"' in html
    # The newest run has not ended: the page refreshes; older ones to page back to.
    assert 'data-live="1"' in html
    assert 'id="older"' in html and 'id="newer"' not in html
    # What else the page says: its file and params (read from the file), durations, calendar.
    assert "griddy.py" in html and '<td class="mono">fail_item</td>' in html
    assert html.count('<tr data-task="shard"><th class="mono">shard</th>') == 1  # durations
    assert len(re.findall(r'<rect class="dur-bar" data-state=', html)) >= 25 * 5
    days = re.findall(r'<a class="day d-([a-z]+)" href="([^"]+)" title="([^"]+)"', html)
    assert len(days) == 30
    assert ("success", "/?dag=griddy&amp;from=2026-10-01&amp;to=2026-10-01",
            "2026-10-01: 1 run (1 success)") in days  # fmt: skip
    assert sum(1 for d in days if d[0] == "running") == 1


def test_a_tasks_page_charts_its_durations_over_the_dags_newest_runs(dag_ui):
    run_id = dag_ui["runs"][-2]
    status, html = http_get(f"{dag_ui['base']}/runs/{quote(run_id, safe='')}/tasks/merge")
    assert status == 200
    chart = html[html.index('id="durations"') :]
    bars = re.findall(r'<a href="([^"]+)"><rect class="dur-bar" data-state="([A-Z_]+)"', chart)
    # One mark per run of the 25 newest: a bar where merge ran, a grey tick where it did not
    # (upstream failed, or not started yet), oldest first.
    assert chart.count('class="dur-bar') == 25
    ran = [f"/runs/{quote(r, safe='')}/tasks/merge" for r in dag_ui["runs"][-25:]]
    assert [href for href, _ in bars] == [h for h in ran if h in {b for b, _ in bars}]
    assert len(bars) >= 20 and {state for _, state in bars} == {"SUCCESS"}


def test_a_calendar_day_leads_to_the_runs_of_that_day(dag_ui):
    # The calendar links /?dag=...: the run list hands a filter to the runs page, query kept.
    status, html = http_get(f"{dag_ui['base']}/?dag=griddy&from=2026-10-01&to=2026-10-01")
    assert status == 200 and "<h1>Runs" in html, html[:300]
    shown = re.findall(
        r'<tr data-run="([^"]+)" data-state="[A-Z]+" data-logical-date="([^"]+)"', html
    )
    assert [day for _, day in shown] == ["2026-10-01"]
    assert all(run_id.startswith("griddy:2026-10-01") for run_id, _ in shown)


def test_paging_back_shows_the_older_runs_and_a_mapped_task_expands(dag_ui):
    runs = dag_ui["runs"]
    _, html = http_get(page_url(dag_ui))
    link = re.search(r'<a href="([^"]+)" id="older">', html)
    assert link is not None
    older = unescape(link.group(1))
    status, html = http_get(dag_ui["base"] + older)
    assert status == 200
    columns, states, _ = grid_of(html)
    assert columns == runs[:5]
    assert states == store_states(dag_ui, columns)
    assert 'id="older"' not in html and 'id="newer"' in html
    assert 'data-live="0"' in html  # none of these runs goes on
    # Fewer per page, back through all of them: every run once.
    seen: list[str] = []
    href = "/dags/griddy?runs=7"
    while href:
        status, html = http_get(dag_ui["base"] + href)
        assert status == 200
        seen = grid_of(html)[0] + seen
        found = re.search(r'<a href="([^"]+)" id="older">', html)
        href = unescape(found.group(1)) if found else ""
    assert seen == runs
    # Expanded: a row per map index, each cell opening that instance.
    status, html = http_get(page_url(dag_ui, "?expand=shard"))
    assert status == 200
    rows = re.findall(r'<tr data-task="shard" class="instance" data-index="(\d+)">(.*?)</tr>',
                      html, re.DOTALL)  # fmt: skip
    assert [int(i) for i, _ in rows] == list(range(6))
    failing = runs[24]  # FAILING: its shard 4 failed
    four = dict(rows)["4"]
    assert f'href="/runs/{quote(failing, safe="")}/tasks/shard/4" title' in four
    shown_failing = [i for i in FAILING if i >= 5]
    assert four.count('data-state="FAILED"') == len(shown_failing)  # those runs' instance 4
    assert dict(rows)["3"].count('data-state="FAILED"') == 0
    # Capped, not refused: more than 100 runs asked for.
    status, html = http_get(page_url(dag_ui, "?runs=100000"))
    assert status == 200 and grid_of(html)[0] == runs


@pytest.mark.parametrize(
    "query",
    ["?runs=abc", "?runs=0", "?runs=-3", "?runs=1.5", "?before=garbage", "?before=12",
     "?before=nan,x", "?before=1e400,x", "?before=1.5,", "?before=1.5,%00",
     "?expand=%00", "?fold=%00", "?" + "&".join(f"fold=g{i}" for i in range(51))],
)  # fmt: skip
def test_a_bad_query_value_is_a_400_with_one_line(dag_ui, query):
    for url in (page_url(dag_ui, query), f"{dag_ui['base']}/api/live/dags/griddy{query}"):
        status, body = http_get(url)
        assert status == 400, (url, body)
        assert "\n" not in body.strip() and body.startswith(("runs", "before", "expand", "fold")), (
            body
        )


def test_an_unknown_dag_is_a_404_and_markup_in_an_id_is_text(dag_ui):
    status, html = http_get(f"{dag_ui['base']}/dags/no-such-dag")
    assert status == 404 and "There is no DAG &#39;no-such-dag&#39;" in html
    status, html = http_get(f"{dag_ui['base']}/dags/{quote('<b>x</b>', safe='')}")
    assert status == 404 and "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    # A DAG with runs and no catalogue row (started from a file) has a page; its id is text.
    status, html = http_get(f"{dag_ui['base']}/dags/{quote(SCRIPT_ID, safe='')}")
    assert status == 200
    assert '<h1 class="dag-id" id="dag-title">&lt;script&gt;alert(1)&lt;/script&gt;</h1>' in html
    assert 'id="not-catalogued"' in html and SCRIPT_ID not in html
    assert html.count("<script>") == 1  # the page's own live script only


def test_the_live_poll_renders_the_same_grid(dag_ui):
    _, html = http_get(page_url(dag_ui))
    with urllib.request.urlopen(f"{dag_ui['base']}/api/live/dags/griddy", timeout=10) as resp:
        live = json.loads(resp.read())
    assert live["live"] is True and set(live["blocks"]) == {"live_grid", "live_durations"}
    # The same columns and states as the page (durations of the running run move on).
    assert grid_of(live["blocks"]["live_grid"])[:2] == grid_of(html)[:2]


def test_the_api_grid_and_calendar(dag_ui):
    runs, base = dag_ui["runs"], dag_ui["base"]
    seen: list[str] = []
    before = ""
    while True:
        query = "?runs=7" + (f"&before={quote(before)}" if before else "")
        with urllib.request.urlopen(f"{base}/api/v1/dags/griddy/grid{query}", timeout=10) as r:
            grid = json.loads(r.read())
        seen = [run["run_id"] for run in grid["runs"]] + seen
        if grid["older"] is None:
            break
        before = grid["older"]
    assert seen == runs
    with urllib.request.urlopen(f"{base}/api/v1/dags/griddy/grid", timeout=10) as r:
        grid = json.loads(r.read())
    assert [t["task_id"] for t in grid["tasks"]] == TASKS and grid["catalogued"]
    shard = next(t for t in grid["tasks"] if t["task_id"] == "shard")
    assert shard["mapped"] and shard["cells"][-1]["instances"] == {"PENDING": 6}
    assert shard["cells"][19]["instances"] == {"SUCCESS": 5, "FAILED": 1}  # run 24
    for bad, field in (("?runs=abc", "runs"), ("?before=garbage", "before")):
        status, body = http_get(f"{base}/api/v1/dags/griddy/grid{bad}")
        assert status == 400 and json.loads(body)["field"] == field
    status, body = http_get(f"{base}/api/v1/dags/nope/calendar")
    assert status == 404 and json.loads(body)["field"] == "dag_id"
    with urllib.request.urlopen(f"{base}/api/v1/dags/griddy/calendar", timeout=10) as r:
        cal = json.loads(r.read())
    assert cal["basis"] == "logical_date" and len(cal["days"]) == 30
    assert cal["days"][0] == {"day": "2026-10-01", "runs": 1, "states": {"SUCCESS": 1},
                              "status": "success"}  # fmt: skip
    with urllib.request.urlopen(f"{base}/api/v1/openapi.json", timeout=10) as r:
        doc = json.loads(r.read())
    validate(doc)
    assert {"/api/v1/dags/{dag_id}/grid", "/api/v1/dags/{dag_id}/calendar"} <= set(doc["paths"])


async def test_in_chromium_a_cell_opens_its_task_and_the_grid_pages_back(dag_ui):
    runs, db = dag_ui["runs"], dag_ui["db"]
    async with devtools(dag_ui["tmp"], page_url(dag_ui)) as page:
        drawn = await page.eval_when(
            """(() => {
                const cols = [...document.querySelectorAll('#grid th.run a.sq')]
                    .map(a => a.dataset.run);
                const rows = [...document.querySelectorAll('#grid tbody tr')].map(tr =>
                    [tr.dataset.task, [...tr.querySelectorAll('td')].map(td => {
                        const a = td.querySelector('a.cell');
                        return a ? a.dataset.state : null;
                    })]);
                return cols.length && {cols, rows};
            })()""",
            "the grid",
        )
        assert drawn["cols"] == runs[-25:]
        want = store_states(dag_ui, drawn["cols"])
        assert [task for task, _ in drawn["rows"]] == TASKS
        for task, states in drawn["rows"]:
            assert states == [want[(run, task)] for run in drawn["cols"]], task
        # A failed mapped cell is drawn mixed: its background stacks two colours.
        background = await page.eval(
            "getComputedStyle(document.querySelector('#grid a.cell.mixed')).backgroundImage"
        )
        assert background.startswith("linear-gradient") and "rgb(229, 57, 53)" in background
        # A picture of it for people (test-artifacts/, as the other pages' tests keep theirs).
        shot = await page.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "web-dag-page.png").write_bytes(base64.b64decode(shot["data"]))
        # Click the failed shard of the oldest failing run shown: its task page opens.
        failing = runs[10]
        selector = (
            f'#grid tr[data-task="shard"] a.cell[href="/runs/{quote(failing, safe="")}'
            '/tasks/shard"]'
        )
        await page.click_on(selector)
        path = f"/runs/{quote(failing, safe='')}/tasks/shard"
        title = await page.eval_when(
            f"location.pathname === {json.dumps(path)} && document.readyState === 'complete'"
            " && document.querySelector('h1').textContent",
            "the task page",
        )
        assert title.startswith("shard") and "FAILED" in title
        [row] = sql(db, "SELECT state FROM task WHERE run_id = ? AND task_id = 'shard'"
                        " AND map_index = -1", failing)  # fmt: skip
        assert row["state"] == "FAILED"
        # Back on the DAG's page, "older runs" shows the five oldest, "newer" the rest again.
        await page.send("Page.navigate", url=page_url(dag_ui))
        await page.click_on("#older")
        older = await page.eval_when(
            """location.search.includes('before=') && document.readyState === 'complete'
               && [...document.querySelectorAll('#grid th.run a.sq')].map(a => a.dataset.run)""",
            "the older runs",
        )
        assert older == runs[:5]
        await page.click_on("#newer")
        newer = await page.eval_when(
            """!location.search.includes('before=') && document.readyState === 'complete'
               && [...document.querySelectorAll('#grid th.run a.sq')].map(a => a.dataset.run)""",
            "the newer runs",
        )
        assert newer == runs[-25:]
