"""The web page's writes, tested live: read-only without a token; with one, signing in (a
wrong token refused), CSRF (a POST without its form's token refused, nothing changed), pause
and unpause through the forms, trigger with a bad conf (shown, no run) and a good one; in
headless Chromium, signing in, triggering, a new run's square arriving through the live
poll without a reload, pausing; and a task output holding markup shown as text everywhere."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from markupsafe import escape
from support.browser import devtools
from support.exchanging import claim, complete
from support.helpers import (
    async_wait_until,
    attempt_of,
    cli,
    free_port,
    sql,
    start_cli,
    stop_process,
    write_dag,
)
from support.ops import ui_process, wait_for_http
from yarl import URL

from executor.loader import load_dag
from executor.outcomes import Failed, Succeeded
from executor.store import open_store

pytestmark = pytest.mark.slow

TOKEN = "s3cret-operator-token"
HELLO = """
from executor import DAG

dag = DAG("hello", params={"n": 1, "who": "world"})


@dag.task
def greet(ctx):
    return ctx.params
"""
# A task whose output and failure are markup: the page must show them as text.
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
SHOUTY = """
from executor import DAG

dag = DAG("shouty")


@dag.task
def shout(ctx):
    return {xss!r}


@dag.task
def fail(ctx):
    raise RuntimeError({xss!r})
"""


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory):
    """A catalogued folder (hello, with params; shouty, with a finished run whose output and
    error are markup) and two pages on it: one with a token, one without."""
    tmp = tmp_path_factory.mktemp("web-actions")
    db = tmp / "w.db"
    url = f"sqlite:///{db}"
    folder = tmp / "dags"
    folder.mkdir()
    write_dag(folder, HELLO, "hello.py")
    shouty = write_dag(folder, SHOUTY.format(xss=XSS), "shouty.py")
    listed = cli("dags", "list", "--db", url, "--dags", str(folder), "--parse-timeout", "10")
    assert listed.returncode == 0, listed.stderr
    shouty_run = asyncio.run(_shouty_run(url, shouty))
    # An admin's token: pausing is the admin role's (a bare token is an operator).
    admin = ("--token", f"operator:admin:{TOKEN}")
    with (
        ui_process(url, tmp / "ui.log", "--refresh", "0.5", *admin, ready="/dags") as base,
        ui_process(url, tmp / "ui-ro.log", "--refresh", "0.5", ready="/dags") as ro,
    ):
        yield {"base": base, "ro": ro, "db": db, "url": url, "tmp": tmp, "shouty": shouty_run}


async def _shouty_run(url: str, path: Path) -> str:
    store = await open_store(url)
    try:
        run_id = await store.runs.create_run(load_dag(str(path), None), date(2026, 5, 1))
        for _ in range(2):
            [row] = await claim(store, "test", 1)
            await complete(
                store,
                [
                    Succeeded(**attempt_of(row), output_json=json.dumps(XSS))
                    if row.task_id == "shout"
                    else Failed(**attempt_of(row), message=f"RuntimeError: {XSS}")
                ],
            )
        return run_id
    finally:
        await store.close()


def paused(ui: dict, dag_id: str = "hello") -> int:
    return int(sql(ui["db"], "SELECT paused FROM dag WHERE dag_id = ?", dag_id)[0]["paused"])


def runs_of(ui: dict, dag_id: str = "hello") -> list[dict[str, Any]]:
    return sql(ui["db"], "SELECT run_id, conf FROM dag_run WHERE dag_id = ?", dag_id)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # unsafe: keep cookies set by an IP address (127.0.0.1), as a browser does
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        yield session


async def signed_in(http: aiohttp.ClientSession, base: str) -> None:
    async with http.post(base + "/login", data={"token": TOKEN, "back": "/dags"}) as r:
        assert r.status == 200 and r.url.path == "/dags"
        assert "signed in" in await r.text()


def form_of(html: str, action: str, dag_id: str) -> dict[str, str]:
    """The hidden fields of the ``action`` form for ``dag_id`` on the DAGs page."""
    for form in re.findall(r'<form class="act [^"]*" method="post" action="([^"]+)">(.*?)</form>',
                           html, re.DOTALL):  # fmt: skip
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form[1]))
        if form[0] == f"/actions/{action}" and action == "trigger":
            return fields | {"dag_id": dag_id}  # the DAG is chosen in the form's <select>
        if form[0] == f"/actions/{action}" and fields.get("dag_id") == dag_id:
            return fields
    raise AssertionError(f"no {action} form for {dag_id}")


async def dags_html(http: aiohttp.ClientSession, base: str) -> str:
    async with http.get(base + "/dags") as r:
        assert r.status == 200
        return await r.text()


async def post(http: aiohttp.ClientSession, url: str, data: dict[str, str]) -> tuple[int, str]:
    async with http.post(url, data=data) as r:
        return r.status, await r.text()


def flash(html: str) -> str:
    m = re.search(r'<div class="flash (\w+)" role="status" id="flash">(.*?)</div>', html, re.S)
    assert m is not None, "no flash message"
    return f"{m.group(1)}: {m.group(2)}"


# -- over HTTP ----------------------------------------------------------------------------


async def test_without_a_token_it_is_read_only_and_says_so(ui, http):
    html = await dags_html(http, ui["ro"])
    assert 'id="read-only"' in html and "Read-only" in html
    assert "<form" not in html and "sign in" not in html
    for path, data in [
        ("/login", {"token": TOKEN}),
        ("/actions/pause", {"dag_id": "hello"}),
        ("/actions/trigger", {"dag_id": "hello", "conf": "{}"}),
        ("/logout", {}),
    ]:
        status, body = await post(http, ui["ro"] + path, data)
        assert status == 403, path
        assert "nothing was changed" in body or "read-only" in body
    assert not http.cookie_jar.filter_cookies(URL(ui["ro"]))
    async with http.post(ui["ro"] + "/dags", data={"x": "1"}) as r:
        assert r.status == 405  # no route writes anything but the ones above
    assert paused(ui) == 0 and runs_of(ui) == []


async def test_a_wrong_token_is_refused_and_sets_nothing(ui, http):
    async with http.post(ui["base"] + "/login", data={"token": TOKEN + "x"}) as r:
        assert r.status == 403
        assert "Set-Cookie" not in r.headers
        assert "Wrong token" in await r.text()
    html = await dags_html(http, ui["base"])
    assert "sign in" in html and 'action="/actions/' not in html


async def test_a_post_without_its_csrf_token_is_refused(ui, http):
    await signed_in(http, ui["base"])
    html = await dags_html(http, ui["base"])
    pause = form_of(html, "pause", "hello")
    for csrf in (None, "0" * 64, form_of(html, "trigger", "hello")["csrf"]):  # another form's
        data = {"dag_id": "hello", "back": "/dags"} | ({} if csrf is None else {"csrf": csrf})
        status, body = await post(http, ui["base"] + "/actions/pause", data)
        assert status == 403 and "missing or wrong CSRF token" in body
    assert paused(ui) == 0
    # Not signed in (another client), even with a good form token: refused.
    async with aiohttp.ClientSession() as stranger:
        status, _ = await post(stranger, ui["base"] + "/actions/pause", pause)
        assert status == 403
    assert paused(ui) == 0


async def test_pause_then_unpause_through_the_forms(ui, http):
    await signed_in(http, ui["base"])
    status, html = await post(
        http,
        ui["base"] + "/actions/pause",
        form_of(await dags_html(http, ui["base"]), "pause", "hello"),
    )
    assert status == 200 and flash(html) == "ok: hello paused"
    assert paused(ui) == 1
    assert '<span class="paused">paused</span>' in html
    status, html = await post(
        http, ui["base"] + "/actions/unpause", form_of(html, "unpause", "hello")
    )
    assert status == 200 and flash(html) == "ok: hello unpaused"
    assert paused(ui) == 0


async def test_trigger_refuses_a_bad_conf_on_the_page_and_starts_a_good_one(ui, http):
    await signed_in(http, ui["base"])
    html = await dags_html(http, ui["base"])
    before = runs_of(ui)
    for conf, says in [
        ('{"nope": 1}', "error: bad conf for DAG &#39;hello&#39;: unknown"),
        ("[1, 2]", "error: --conf must be a JSON object"),
        ("{not json", "error: --conf is not JSON"),
    ]:
        status, html = await post(
            http,
            ui["base"] + "/actions/trigger",
            form_of(html, "trigger", "hello") | {"conf": conf},
        )
        assert status == 200 and flash(html).startswith(says), flash(html)
        assert "no run was created" in flash(html)
        assert f">{escape(conf)}</textarea>" in html  # kept for the next try
        assert '<option value="hello" selected>' in html
    assert runs_of(ui) == before
    status, html = await post(
        http,
        ui["base"] + "/actions/trigger",
        form_of(html, "trigger", "hello") | {"conf": '{"n": 7}'},
    )
    assert status == 200 and flash(html).startswith("ok: hello:"), flash(html)
    [new] = [r for r in runs_of(ui) if r not in before]
    assert json.loads(new["conf"]) == {"n": 7}
    assert f"ok: {new['run_id']} created" == flash(html)
    # A paused DAG is refused, with nothing created.
    html = (await post(http, ui["base"] + "/actions/pause", form_of(html, "pause", "hello")))[1]
    status, html = await post(
        http, ui["base"] + "/actions/trigger", form_of(html, "trigger", "hello") | {"conf": "{}"}
    )
    assert flash(html) == "error: hello is paused: unpause it first; no run was created"
    assert len(runs_of(ui)) == len(before) + 1
    await post(http, ui["base"] + "/actions/unpause", form_of(html, "unpause", "hello"))
    assert paused(ui) == 0


async def test_markup_in_a_tasks_output_is_text_everywhere_over_http(ui, http):
    run = f"{ui['base']}/runs/{quote(ui['shouty'], safe='')}"
    for url in (run + "/tasks/shout", run + "/tasks/fail", run, ui["base"] + "/"):
        async with http.get(url) as r:
            html = await r.text()
        assert "<script>window" not in html and "<img src=x" not in html, url
    async with http.get(run + "/tasks/shout") as r:
        assert escape(json.dumps(XSS)) in await r.text()
    async with http.get(
        ui["base"] + "/api/live" + f"/runs/{quote(ui['shouty'], safe='')}/tasks/shout"
    ) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        block = (await r.json())["blocks"]["live_task"]
        assert escape(json.dumps(XSS)) in block and "<script>window" not in block


# -- in a real browser ----------------------------------------------------------------------


async def test_in_chromium_sign_in_trigger_see_the_run_arrive_live_and_pause(ui):
    base = ui["base"]
    async with devtools(ui["tmp"], base + "/login?back=/dags") as page:
        await page.eval_when("!!document.querySelector('input[name=token]')", "the sign-in form")
        await page.eval(f"document.querySelector('input[name=token]').value = {TOKEN!r}")
        await page.click_on("form.login button")
        await page.eval_when(
            "location.pathname === '/dags' && document.querySelector('#flash')"
            " && document.querySelector('#flash').textContent.startsWith('signed in')",
            "signed in, on the DAGs page",
        )
        before = len(runs_of(ui))
        await page.click_on('tr[data-dag="hello"] a.trigger')
        # The page signed in on has the same form, hello maybe first in its list: wait for
        # the page the link opens, parsed, not for a select that the old one satisfies.
        await page.eval_when(
            "new URLSearchParams(location.search).get('trigger') === 'hello'"
            " && document.readyState !== 'loading'"
            " && document.querySelector('form.trigger textarea') !== null"
            " && document.querySelector('form.trigger select').value === 'hello'",
            "the trigger form, hello chosen",
        )
        await page.eval("""document.querySelector('form.trigger textarea').value = '{"n": 2}'""")
        await page.click_on("form.trigger button")
        said = await page.eval_when(
            "(document.querySelector('#flash') || {}).textContent?.endsWith(' created')"
            " && document.querySelector('#flash').textContent",
            "the trigger's message",
        )
        run_id = said.removesuffix(" created")
        assert len(runs_of(ui)) == before + 1
        sq = f'tr[data-dag="hello"] a.sq[href="/runs/{quote(run_id, safe="")}"]'
        await page.eval_when(f"!!document.querySelector({json.dumps(sq)})", "the new square")
        assert await page.eval("document.body.dataset.live") == "1"  # a run is RUNNING

        # A run started elsewhere arrives through the poll: the page is not reloaded.
        await page.eval("window.notReloaded = true")
        done = cli("trigger", "hello", "--db", ui["url"], "--conf", '{"n": 3}', "--json")
        assert done.returncode == 0, done.stderr
        other = json.loads(done.stdout)["run_id"]
        sq = f'tr[data-dag="hello"] a.sq[href="/runs/{quote(other, safe="")}"]'
        assert await page.eval_when(
            f"""(() => {{
                const a = document.querySelector({json.dumps(sq)});
                return a && [a.className, a.textContent, window.notReloaded];
            }})()""",
            "the other run's square, live",
        ) == ["sq st-RUNNING", "\u25b6", True]

        await page.click_on('tr[data-dag="hello"] form.act button[value="pause"]')
        assert (
            await page.eval_when(
                """(() => {
                    const s = document.querySelector('tr[data-dag="hello"] .paused');
                    return s && s.textContent === 'paused'
                        && document.querySelector('#flash').textContent;
                })()""",
                "hello paused",
            )
            == "hello paused"
        )
        assert paused(ui) == 1
        await page.click_on('tr[data-dag="hello"] form.act button[value="unpause"]')
        await page.eval_when(
            """document.querySelector('tr[data-dag="hello"] .active')?.textContent === 'active'""",
            "hello active again",
        )
    assert paused(ui) == 0


async def test_in_chromium_markup_in_an_output_stays_text(ui):
    run = f"{ui['base']}/runs/{quote(ui['shouty'], safe='')}"
    async with devtools(ui["tmp"], run + "/tasks/shout") as page:
        shown = await page.eval_when(
            "document.readyState === 'complete'"
            " && document.querySelector('pre.output').textContent",
            "the output",
        )
        assert shown == json.dumps(XSS)
        # The live poll's answer for this page, applied as the poll applies it.
        result = await page.send(
            "Runtime.evaluate",
            expression="fetch(document.body.dataset.poll).then(r => r.json())"
            ".then(d => { slotless.apply(d); return d.blocks.live_task; })",
            awaitPromise=True,
            returnByValue=True,
        )
        assert escape(json.dumps(XSS)) in result["result"]["value"]
        assert await page.eval("document.querySelector('pre.output').textContent") == json.dumps(
            XSS
        )
        for url in (None, run + "/tasks/fail", run):
            if url is not None:
                await page.send("Page.navigate", url=url)
                await page.eval_when(
                    f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
                    url,
                )
            # The page's own scripts (the log viewer's) are there; none holding the markup.
            injected = (
                "Array.from(document.querySelectorAll('main script'))"
                ".filter(s => s.textContent.includes('__xss')).length"
                " + document.querySelectorAll('main img').length"
            )
            assert await page.eval(injected) == 0
            assert await page.eval("window.__xss === undefined")
            if url == run + "/tasks/fail":  # the error, in the log, as text
                assert XSS in await page.eval("document.querySelector('main').textContent")


FLIP = """
from pathlib import Path
from executor import DAG

FIXED = Path({fixed!r})
dag = DAG("flip")


@dag.task
def work(ctx):
    if not FIXED.exists():
        raise RuntimeError("the input is not there yet")
    return "done"
"""


async def test_in_chromium_clear_a_failed_task_and_see_it_run_again_and_turn_green(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'flip.db'}"
    path = write_dag(tmp_path, FLIP.format(fixed=str(tmp_path / "fixed")), "flip.py")
    store = await open_store(url)
    procs = [(start_cli("worker", "--db", url, log=tmp_path / "worker.log"), "worker")]
    try:
        run_id = await store.runs.create_run(load_dag(str(path), "flip"), date(2026, 5, 1),
                                        dag_file=str(path))  # fmt: skip

        async def failed() -> bool:
            info = await store.views.run_info(run_id)
            return info is not None and info["state"] == "FAILED"

        await async_wait_until(failed, 30, what="the run's failure")
        port = free_port()
        log = tmp_path / "ui.log"
        ui_proc = start_cli("ui", "--db", url, "--port", str(port), "--refresh", "0.5",
                            "--token", TOKEN, log=log)  # fmt: skip
        procs.append((ui_proc, "ui"))
        base = f"http://127.0.0.1:{port}"
        wait_for_http(base + "/dags", ui_proc, log)
        task_page = f"/runs/{quote(run_id, safe='')}/tasks/work"
        async with devtools(tmp_path, f"{base}/login?back={quote(task_page)}") as page:
            await page.eval_when("!!document.querySelector('input[name=token]')", "sign-in")
            await page.eval(f"document.querySelector('input[name=token]').value = {TOKEN!r}")
            await page.click_on("form.login button")
            await page.eval_when(
                "document.querySelector('#task-title .badge')?.textContent.includes('FAILED')",
                "the failed task's page",
            )
            (tmp_path / "fixed").touch()  # the operator fixed the cause
            await page.click_on('.actions form.act button[value="clear"]')
            await page.eval_when(
                "document.querySelector('#task-title .badge')?.textContent.includes('SUCCESS')",
                "the cleared task, run again, green",
            )
            colour = await page.eval(
                "getComputedStyle(document.querySelector('#task-title .badge')).backgroundColor"
            )
        assert colour == "rgb(200, 230, 201)"  # .st-SUCCESS, #c8e6c9: the badge turned green
        info = await store.views.run_info(run_id)
        assert info is not None and info["state"] == "SUCCESS"
        log_rows = await store.views.task_log(run_id, "work")
        assert log_rows is not None
        # Recorded under the token's name (a bare token is named "operator"), not an address.
        assert any(e["message"].startswith("cleared by operator") for e in log_rows)
    finally:
        for proc, _ in procs:
            stop_process(proc)
        await store.close()
