"""Every page shows what a DAG, a task or a person wrote as text: `<script>` in a DAG id, a
run's conf, a log line, a run's reason comes out escaped, in the page and in its live
JSON; and in headless Chromium a run page's live block turns with the store, no reload."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer
from markupsafe import escape
from support.browser import devtools
from support.exchanging import claim, complete
from support.helpers import attempt_of, raw_sql, write_dag

from executor.loader import load_dag
from executor.outcomes import Failed, Succeeded
from executor.store import Store, open_store
from slotless.web.app import make_app

pytestmark = pytest.mark.slow

TOKEN = "escaping-token"
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
DAG = """
from executor import DAG

dag = DAG("plain")


@dag.task
def shout(ctx):
    return 1


@dag.task
def calm(ctx):
    return 1


@dag.task(parents=[shout, calm])
def after(ctx):
    return 1
"""


@pytest.fixture
async def served(tmp_path: Path, db_url: str) -> AsyncIterator[dict[str, Any]]:
    """A run whose conf holds markup, whose task failed with markup in its log, whose DAG id
    (written behind the store's back, as an old or a hand-edited database may hold) is
    markup; the page served from this process, signed in."""
    store = await open_store(db_url)
    dag = load_dag(str(write_dag(tmp_path, DAG, "plain.py")), None)
    run_id = await store.runs.create_run(dag, date(2026, 7, 1), conf={"note": XSS})
    rows = await claim(store, "test", 2)
    shout = next(r for r in rows if r.task_id == "shout")
    calm = next(r for r in rows if r.task_id == "calm")
    await complete(
        store,
        [
            Failed(**attempt_of(shout), message=f"RuntimeError: {XSS}"),
            Succeeded(**attempt_of(calm), output_json="1"),
        ],
    )
    await store.runs.clear(run_id, ["shout"], who="test")  # its log kept; the run goes on
    await raw_sql(db_url, f"UPDATE dag_run SET dag_id = '{XSS}' WHERE run_id = '{run_id}'")
    client = TestClient(TestServer(make_app(store, token=TOKEN, refresh=0.3)))
    await client.start_server()
    r = await client.post("/login", data={"token": TOKEN, "back": "/"})
    assert r.status == 200
    try:
        yield {"client": client, "store": store, "run_id": run_id, "tmp": tmp_path}
    finally:
        await client.close()
        await store.close()


async def test_markup_is_text_on_every_page_and_in_its_live_json(served: dict[str, Any]):
    client: TestClient = served["client"]
    run = f"/runs/{quote(served['run_id'], safe='')}"
    pages = {
        "/": [escape(XSS)],  # the run list's row: its DAG id
        run: [escape(XSS), escape(json.dumps({"note": XSS}))],  # DAG id, conf
        run + "/tasks/shout": [escape(f"RuntimeError: {XSS}")],  # the log line
        "/dags": [],
        "/needs-you": [],
    }
    for path, shown in pages.items():
        for url in (path, "/api/live" + path):
            resp = await client.get(url)
            text = await resp.text()
            if url.startswith("/api/live"):
                if resp.status == 404:  # Needs you is not live: no poll
                    continue
                text = "".join((await resp.json())["blocks"].values())
            assert resp.status == 200, url
            assert "<script>window" not in text and "<img src=x" not in text, url
            for piece in shown:
                assert piece in text, (url, piece)


async def test_a_form_in_a_live_block_comes_back_to_its_page(served: dict[str, Any]):
    """The poll renders the run's "cancel run" form again: it returns to the page, not to
    the poll's URL."""
    client: TestClient = served["client"]
    run = f"/runs/{quote(served['run_id'], safe='')}"
    resp = await client.get("/api/live" + run)
    [block] = (await resp.json())["blocks"].values()
    assert 'action="/actions/cancel"' in block
    back = f"/runs/{served['run_id']}"  # the page's path, as the request had it
    assert f'<input type="hidden" name="back" value="{back}">' in block
    assert "/api/live" not in block


async def test_in_chromium_markup_stays_text_and_a_live_block_turns_without_reload(
    served: dict[str, Any],
):
    client: TestClient = served["client"]
    store: Store = served["store"]
    run_id = served["run_id"]
    run_page = "/runs/" + quote(run_id, safe="")
    url = str(client.make_url(f"/login?back={quote(run_page)}"))
    async with devtools(served["tmp"], url) as page:
        await page.eval_when("!!document.querySelector('input[name=token]')", "sign-in")
        await page.eval(f"document.querySelector('input[name=token]').value = {TOKEN!r}")
        await page.click_on("form.login button")
        await page.eval_when(
            "!!document.querySelector('#run-title .badge') && document.body.dataset.live === '1'",
            "the run's page, live",
        )
        assert await page.eval("document.querySelectorAll('main script, main img').length") == 0
        assert await page.eval("window.__xss === undefined")
        assert XSS in await page.eval("document.querySelector('main').textContent")
        assert await page.eval("!!document.querySelector('.actions button[value=cancel]')")
        await page.eval("window.notReloaded = true")

        # The store moves on; the page follows through its poll, not by reloading.
        await store.runs.mark(run_id, "shout", "success", who="test")
        await store.runs.mark(run_id, "after", "success", who="test")
        shown = await page.eval_when(
            """(() => {
                const badge = document.querySelector('#run-title .badge');
                return badge && badge.textContent.includes('SUCCESS') && [
                    badge.textContent,
                    !!document.querySelector('.actions button[value=cancel]'),
                    document.querySelector('#run-took b').textContent,
                    document.querySelector('a[data-task="after"]').dataset.state,
                    document.body.dataset.live,
                    window.notReloaded,
                ];
            })()""",
            "the run's SUCCESS, live",
        )
        # The badge, the buttons, the duration's label and the graph, from one read.
        assert shown == ["\u2713 SUCCESS", False, "ran", "SUCCESS", "0", True]
        assert await page.eval("window.__xss === undefined")
