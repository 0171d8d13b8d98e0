"""The runs list and a run's Gantt chart, tested live: a real `slotless ui` process over a
database of runs on several dates and in several states, driven in headless Chromium.

The form is submitted by clicking (a state ticked, a date range set) and the rows shown
are checked against the database; a run that failed once, retried and succeeded under a
real worker has its bars at its attempts' recorded times; a run id and key holding
``<script>`` are shown as text; bad filters are 400s naming their field."""

from __future__ import annotations

import asyncio
import json
import textwrap
from datetime import date, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from support.browser import devtools
from support.exchanging import claim, complete
from support.helpers import (
    REPO,
    attempt_of,
    run_to_end,
    sql,
    write_dag,
)
from support.ops import http_get, ui_process

from executor import DAG
from executor.loader import load_dag
from executor.outcomes import Failed, Succeeded
from executor.runnames import RunType
from executor.store import open_store

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"
DAY = date(2026, 11, 1)
SCRIPT_ID = "plain:<script>alert(1)</script>"
SCRIPT_KEY = "<script>alert(2)</script>"

RETRY_DAG = """
from executor import DAG

dag = DAG("retrier")


@dag.task(retries=1, retry_delay=0.3)
def flaky(ctx):
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return "ok"


@dag.task(parents=[flaky])
def done(ctx):
    return 1
"""


def noop(ctx: Any) -> None:
    return None


@pytest.fixture(scope="module")
def runs_ui(tmp_path_factory: pytest.TempPathFactory):
    """Runs of two DAGs on six logical dates, SUCCESS, FAILED and RUNNING; a run that
    retried; `slotless ui` serving them."""
    tmp = tmp_path_factory.mktemp("runs")
    db_path = tmp / "runs.db"
    url = f"sqlite:///{db_path}"
    dag_path = write_dag(tmp, textwrap.dedent(RETRY_DAG), "retry_dag.py")

    async def prepare() -> str:
        store = await open_store(url)
        try:
            retrier = load_dag(str(dag_path), None)
            run_id = await store.runs.create_run(retrier, DAY, dag_file=str(dag_path))
            await run_to_end(store, run_id, dags={"retrier": retrier})
            plain = DAG("plain")
            plain.task(noop, task_id="only")
            made = []
            for i in range(18):
                started = await store.runs.start_run(
                    plain, DAY + timedelta(days=i % 6), run_key=f"k{i:02d}",
                    run_type=(RunType.MANUAL, RunType.SCHEDULED, RunType.BACKFILL)[i % 3],
                    run_id=SCRIPT_ID if i == 7 else None,
                )  # fmt: skip
                made.append(started.run_id)
            await store.runs.start_run(plain, DAY, run_key=SCRIPT_KEY)
            # FAILED: 11-02, 11-06, 11-04, 11-02, 11-06; SUCCESS: 11-04, 11-02, 11-06, 11-04.
            ending = {r: ("FAILED" if i % 4 == 1 else "SUCCESS") for i, r in enumerate(made)
                      if i % 2}  # fmt: skip
            outcomes = []
            for row in await claim(store, "w", 100):
                if row.run_id in ending:
                    outcomes.append(
                        Succeeded(**attempt_of(row))
                        if ending[row.run_id] == "SUCCESS"
                        else Failed(**attempt_of(row), message="no")
                    )
            await complete(store, outcomes)
            return run_id
        finally:
            await store.close()

    run_id = asyncio.run(prepare())
    with ui_process(url, tmp / "ui.log", ready="/runs") as base:
        yield {"base": base, "db": db_path, "tmp": tmp, "retried": run_id}


def expected(db: Path, where: str, *args: Any) -> list[str]:
    order = "ORDER BY created_at DESC, run_id DESC"
    rows = sql(db, f"SELECT run_id FROM dag_run WHERE {where} {order}", *args)
    return [r["run_id"] for r in rows]


ROWS = "[...document.querySelectorAll('#runs tr[data-run]')].map(tr => tr.dataset.run)"


async def test_in_chromium_the_form_filters_by_state_and_date(runs_ui) -> None:
    base, db = runs_ui["base"], runs_ui["db"]
    async with devtools(runs_ui["tmp"], base + "/runs") as page:
        everything = await page.eval_when(f"document.readyState === 'complete' && {ROWS}",
                                          "the runs list")  # fmt: skip
        assert everything == expected(db, "1 = 1")
        await page.click_on('input[name="state"][value="FAILED"]')
        await page.eval(
            "document.getElementById('f-from').value = '2026-11-02';"
            "document.getElementById('f-to').value = '2026-11-04'; true"
        )
        await page.click_on("#f-submit")
        query = await page.eval_when(
            "location.search.includes('state=FAILED') && document.readyState === 'complete'"
            " && location.search",
            "the filtered page",
        )
        assert "from=2026-11-02" in query and "to=2026-11-04" in query
        shown = await page.eval(ROWS)
        want = expected(
            db, "state = 'FAILED' AND logical_date BETWEEN '2026-11-02' AND '2026-11-04'"
        )
        assert shown == want and want  # not empty: the filter found some, and only those
        assert await page.eval(
            "[...document.querySelectorAll('#runs tr[data-run]')].every(tr =>"
            " tr.dataset.state === 'FAILED' && tr.dataset.logicalDate >= '2026-11-02'"
            " && tr.dataset.logicalDate <= '2026-11-04')"
        )
        # The form shows the filter it applied: the URL is the whole state of the page.
        assert await page.eval(
            "document.querySelector('input[name=state][value=FAILED]').checked"
            " && document.getElementById('f-from').value === '2026-11-02'"
        )
        # A DAG and a type from the URL, paged two at a time by the page's own links.
        await page.send("Page.navigate", url=base + "/runs?dag=plain&type=backfill&limit=2")
        want = expected(db, "dag_id = 'plain' AND run_type = 'backfill'")
        seen: list[str] = []
        while True:
            shown = await page.eval_when(
                f"document.readyState === 'complete' && location.search.includes('limit=2')"
                f" && {ROWS}",
                "a page of two",
            )
            assert 1 <= len(shown) <= 2
            seen += shown
            if not await page.eval("!!document.getElementById('older')"):
                break
            href = await page.eval("document.getElementById('older').href")
            await page.click_on("#older")
            await page.eval_when(f"location.href === {json.dumps(href)}", "the older page")
        assert seen == want and len(want) == 6

    ARTIFACTS.mkdir(exist_ok=True)
    async with devtools(runs_ui["tmp"], base + "/runs?state=FAILED&state=RUNNING") as page:
        await page.eval_when("document.readyState === 'complete'", "the page")
        shot = await page.send("Page.captureScreenshot", format="png")
        import base64

        (ARTIFACTS / "web-runs-list.png").write_bytes(base64.b64decode(shot["data"]))


async def test_in_chromium_the_gantt_bars_are_the_attempts(runs_ui) -> None:
    base, db, run_id = runs_ui["base"], runs_ui["db"], runs_ui["retried"]
    events = sql(
        db,
        "SELECT e.ts, e.from_state, e.to_state, e.attempt FROM task t"
        " JOIN task_event e ON e.task_row = t.id"
        " WHERE t.run_id = ? AND t.task_id = 'flaky' AND e.kind = 'transition' ORDER BY e.id",
        run_id,
    )
    moves = [(e["from_state"], e["to_state"]) for e in events]
    assert moves == [
        ("PENDING", "RUNNING"), ("RUNNING", "RETRYING"), ("RETRYING", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]  # fmt: skip
    ts = [e["ts"] for e in events]
    url = f"{base}/runs/{quote(run_id, safe='')}/gantt"
    async with devtools(runs_ui["tmp"], url) as page:
        bars = await page.eval_when(
            """(() => {
                const g = document.querySelector('g.line[data-task="flaky"]');
                return g && [...g.querySelectorAll('rect.seg')].map(r => [
                    r.dataset.kind, Number(r.dataset.start), Number(r.dataset.end),
                    r.dataset.attempt, r.querySelector('title').textContent,
                    r.getBoundingClientRect().width > 0]);
            })()""",
            "flaky's bars",
        )
        kinds = [(k, s, e, a) for k, s, e, a, _, _ in bars]
        assert kinds[1:] == [
            ("running", ts[0], ts[1], "1"),
            ("retrying", ts[1], ts[2], ""),
            ("running", ts[2], ts[3], "2"),
        ]
        assert kinds[0][0] == "queued" and kinds[0][2] == ts[0]  # waited for a slot first
        assert all(visible for *_, visible in bars)
        assert bars[3][4].startswith("running, attempt 2: ") and "then SUCCESS" in bars[3][4]
        # The two attempts are drawn apart, in time order, left to right.
        xs = await page.eval(
            "[...document.querySelectorAll('g.line[data-task=\"flaky\"] rect.seg')]"
            ".map(r => Number(r.getAttribute('x')))"
        )
        assert xs == sorted(xs) and len(set(xs)) == 4
        # done waited for flaky: its bars start no earlier than flaky's success.
        starts = await page.eval(
            "[...document.querySelectorAll('g.line[data-task=\"done\"] rect.seg')]"
            ".map(r => Number(r.dataset.start))"
        )
        assert starts and min(starts) == ts[3]
        assert await page.eval("document.body.dataset.live") == "0"  # the run ended
        shot = await page.send("Page.captureScreenshot", format="png")
        import base64

        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "web-gantt.png").write_bytes(base64.b64decode(shot["data"]))
    # The API gives the same segments.
    status, text = http_get(f"{base}/api/v1/runs/{quote(run_id, safe='')}/gantt")
    assert status == 200
    flaky = next(t for t in json.loads(text)["tasks"] if t["task_id"] == "flaky")
    assert [(s["kind"], s["start"], s["end"], s["attempt"]) for s in flaky["segments"]][1:] == [
        ("running", ts[0], ts[1], 1), ("retrying", ts[1], ts[2], None),
        ("running", ts[2], ts[3], 2),
    ]  # fmt: skip


async def test_in_chromium_a_script_in_a_run_id_or_key_is_text(runs_ui) -> None:
    base = runs_ui["base"]
    async with devtools(runs_ui["tmp"], base + "/runs?" + urlencode({"q": "<script>"})) as page:
        shown = await page.eval_when(f"document.readyState === 'complete' && {ROWS}", "rows")
        assert len(shown) == 2 and SCRIPT_ID in shown
        texts = await page.eval(
            "[...document.querySelectorAll('#runs tr[data-run] td:first-child a')]"
            ".map(a => a.textContent)"
        )
        assert SCRIPT_ID in texts
        keys = await page.eval(
            "[...document.querySelectorAll('#runs tr[data-run] td:nth-child(3)')]"
            ".map(td => td.title)"
        )
        assert f"key: {SCRIPT_KEY}" in keys
        assert await page.eval("document.querySelectorAll('script').length") == 1  # live.js
        assert await page.eval("document.getElementById('f-q').value") == "<script>"
    status, html = http_get(base + "/runs?" + urlencode({"q": "<script>"}))
    assert status == 200 and "<script>alert" not in html and "&lt;script&gt;alert(1)" in html
    status, html = http_get(f"{base}/runs/{quote(SCRIPT_ID, safe='')}/gantt")
    assert status == 200 and "<script>alert" not in html


def test_bad_filters_are_400_naming_the_field(runs_ui) -> None:
    base = runs_ui["base"]
    for query, line in [
        ("state=NOPE", "state: &#39;NOPE&#39; is not a run state"),
        ("from=2026-13-45", "from: not a day (YYYY-MM-DD): &#39;2026-13-45&#39;"),
        ("limit=abc", "limit: not a number: &#39;abc&#39;"),
        ("limit=501", "limit: between 1 and 500, not 501"),
        ("type=cron", "type: &#39;cron&#39; is not a run type"),
        ("from=2026-11-05&to=2026-11-01", "from: 2026-11-05 is after to (2026-11-01)"),
        ("before=garbage", "before: not a cursor of this list"),
        ("q=a%00b", "q: text without NUL characters"),
    ]:
        status, html = http_get(f"{base}/runs?{query}")
        assert status == 400, query
        assert f'<p class="warn" id="bad-filter" role="alert">{line}' in html, (query, html[-3000:])
        assert 'id="runs-filter"' in html  # the form, to correct it
        status, text = http_get(f"{base}/api/v1/runs?{query}")
        assert status == 400, query
        assert json.loads(text)["field"] == query.split("=")[0]
    status, text = http_get(f"{base}/api/v1/runs?state=failed&limit=3")
    assert status == 200
    body = json.loads(text)
    assert [r["state"] for r in body["runs"]] == ["FAILED"] * 3 and body["older"]
    older = urlencode({"state": "FAILED", "before": body["older"]})
    status, text = http_get(f"{base}/api/v1/runs?{older}")
    assert status == 200 and all(r["state"] == "FAILED" for r in json.loads(text)["runs"])
    status, text = http_get(f"{base}/api/v1/openapi.json")
    paths = json.loads(text)["paths"]
    params = [p["name"] for p in paths["/api/v1/runs"]["get"]["parameters"]]
    assert params == ["dag", "state", "type", "from", "to", "q", "limit", "before", "after"]
    assert "/api/v1/runs/{run_id}/gantt" in paths and "/api/v1/runs/{run_id}" in paths


async def test_in_chromium_an_unfinished_runs_gantt_goes_on_growing(runs_ui) -> None:
    base = runs_ui["base"]
    status, text = http_get(f"{base}/api/v1/runs?state=RUNNING&limit=1")
    assert status == 200
    [run] = json.loads(text)["runs"]
    url = f"{base}/runs/{quote(run['run_id'], safe='')}/gantt"
    status, text = http_get(url.replace("/runs/", "/api/live/runs/", 1))
    live = json.loads(text)
    assert status == 200 and live["live"] is True
    assert 'data-open="1"' in live["blocks"]["live_gantt"]
    open_end = "Number(document.querySelector('rect.seg[data-open=\"1\"]').dataset.end)"
    async with devtools(runs_ui["tmp"], url) as page:
        first = await page.eval_when(f"document.readyState === 'complete' && {open_end}",
                                     "the open bar")  # fmt: skip
        assert await page.eval("document.body.dataset.live") == "1"
        # The live poll renders the chart again: the running bar now ends later.
        later = await page.eval_when(f"{open_end} > {first} && {open_end}", "a redrawn chart")
        assert later > first
