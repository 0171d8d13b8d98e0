"""The trigger form drawn from a DAG's params, tested live on `slotless ui`: one field per
param with its type, default, description and choices; a bad value refused beside its
field by the params' own check (status 400, what was typed kept, no run); a good one
starting a run with that conf (303 to the run's page); the JSON box; the CSRF check of
every write; in headless Chromium, signing in, a refusal, then a run started; markup in
a default and in a conf shown as text."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from html import unescape
from typing import Any
from urllib.parse import quote, unquote

import aiohttp
import pytest
from pydantic import BaseModel, ConfigDict
from support.browser import devtools
from support.helpers import cli, sql, write_dag
from support.ops import ui_process

from slotless.web.render import environment
from slotless.web.trigger_form import conf_text, param_fields

pytestmark = pytest.mark.slow

TOKEN = "form-operator-token"
XSS = "<script>window.__xss = 1</script>"
LOADER = """
from typing import Literal

from pydantic import BaseModel, Field

from executor import DAG


class Params(BaseModel):
    rows: int = Field(10, ge=1, le=1000, description="how many rows to load")
    ratio: float = 0.5
    dry_run: bool = False
    region: Literal["eu", "us"] = "eu"
    tags: list[str] = []
    note: str = {xss!r}


dag = DAG("loader", params=Params)


@dag.task
def load(ctx):
    return ctx.params.rows
"""


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("trigger-form")
    db = tmp / "t.db"
    url = f"sqlite:///{db}"
    folder = tmp / "dags"
    folder.mkdir()
    write_dag(folder, LOADER.format(xss=XSS), "loader.py")
    listed = cli("dags", "list", "--db", url, "--dags", str(folder), "--parse-timeout", "10")
    assert listed.returncode == 0, listed.stderr
    with ui_process(url, tmp / "ui.log", "--token", TOKEN) as base:
        yield {"base": base, "db": db, "tmp": tmp}


def runs(ui: dict) -> list[dict[str, Any]]:
    return sql(ui["db"], "SELECT run_id, conf FROM dag_run WHERE dag_id = 'loader' ORDER BY rowid")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        yield session


def form_page(ui: dict) -> str:
    return ui["base"] + "/dags/loader/trigger"


async def csrf(http: aiohttp.ClientSession, ui: dict) -> str:
    async with http.get(form_page(ui)) as r:
        assert r.status == 200
        html = await r.text()
    form = html[html.index('id="params-form"') :]  # the header's sign-out form has its own
    return re.findall(r'name="csrf" value="([0-9a-f]+)"', form)[0]


def error_for(html: str, name: str) -> str:
    found = re.search(rf'data-error-for="{re.escape(name)}">([^<]*)<', html)
    assert found, f"no error beside {name}"
    return unescape(found.group(1))


async def test_the_form_has_a_field_per_param(ui, http):
    async with http.get(form_page(ui)) as r:
        assert r.status == 200
        html = await r.text()
    assert re.findall(r'<tr data-param="([^"]+)"', html) == [
        "rows", "ratio", "dry_run", "region", "tags", "note",
    ]  # fmt: skip
    assert 'name="p:rows" value="10"' in html and "how many rows to load" in html
    assert 'type="checkbox" id="param-3" name="p:dry_run" value="1">' in html  # unticked
    assert '<option value="&#34;eu&#34;" selected>eu</option>' in html
    assert '<option value="&#34;us&#34;">us</option>' in html
    assert '<textarea id="param-5" name="p:tags" rows="3">[]</textarea>' in html
    assert XSS not in html and "&lt;script&gt;" in html  # a default holding markup: text
    assert 'id="json-form"' in html  # the free JSON box stays
    assert "Sign in" in html and 'name="csrf"' not in html  # not signed in: no way to post
    # Unknown DAG: a 404 page, no traceback.
    async with http.get(ui["base"] + "/dags/nope/trigger") as r:
        assert r.status == 404 and "no DAG &#39;nope&#39;" in await r.text()


async def test_a_post_without_its_csrf_token_is_refused(ui, http):
    async with http.post(form_page(ui), data={"mode": "fields", "p:rows": "5"}) as r:
        assert r.status == 403  # not signed in
    await signed_in(http, ui)
    async with http.post(form_page(ui), data={"mode": "fields", "p:rows": "5"}) as r:
        assert r.status == 403 and "CSRF" in await r.text()
    wrong = (await csrf(http, ui))[::-1]
    async with http.post(form_page(ui), data={"csrf": wrong, "p:rows": "5"}) as r:
        assert r.status == 403  # a token is the HMAC of this form's path, this session's
    assert runs(ui) == []


async def signed_in(http: aiohttp.ClientSession, ui: dict) -> None:
    async with http.post(ui["base"] + "/login", data={"token": TOKEN, "back": "/"}) as r:
        assert r.status == 200


async def test_a_bad_value_is_shown_beside_its_field(ui, http):
    await signed_in(http, ui)
    before = len(runs(ui))
    token = await csrf(http, ui)
    bad = {"csrf": token, "mode": "fields", "p:rows": "0", "p:ratio": "0.25",
           "p:region": '"us"', "p:tags": '["a"]', "p:note": "kept <b>"}  # fmt: skip
    async with http.post(form_page(ui), data=bad, allow_redirects=False) as r:
        assert r.status == 400
        html = await r.text()
    # pydantic's own words, from the params' check (executor.params.resolve)
    assert "greater than or equal to 1" in error_for(html, "rows")
    assert 'name="p:rows" value="0"' in html and 'value="kept &lt;b&gt;"' in html  # kept
    assert '<option value="&#34;us&#34;" selected>us</option>' in html
    assert 'data-error-for="ratio"' not in html
    # A field whose text is not its type, and JSON that is not JSON: beside them too.
    worse = {**bad, "p:rows": "ten", "p:tags": "[oops"}
    async with http.post(form_page(ui), data=worse, allow_redirects=False) as r:
        assert r.status == 400
        html = await r.text()
    assert error_for(html, "rows") == "not a whole number: 'ten'"
    assert error_for(html, "tags").startswith("not JSON")
    # A choice the params do not list, sent around the select.
    async with http.post(form_page(ui), data={**bad, "p:rows": "3", "p:region": '"mars"'},
                         allow_redirects=False) as r:  # fmt: skip
        assert r.status == 400
        assert "'eu' or 'us'" in error_for(await r.text(), "region")
    # The JSON box: refused as the API and the CLI refuse it.
    async with http.post(form_page(ui), data={"csrf": token, "mode": "json",
                         "conf": '{"rows": 5000}'}, allow_redirects=False) as r:  # fmt: skip
        assert r.status == 400
        assert "less than or equal to 1000" in error_for(await r.text(), "conf")
    async with http.post(form_page(ui), data={"csrf": token, "mode": "json",
                         "conf": '{"nope": 1}'}, allow_redirects=False) as r:  # fmt: skip
        assert r.status == 400
        assert "unknown param 'nope'" in error_for(await r.text(), "conf")
    assert len(runs(ui)) == before  # nothing started


async def test_a_good_value_starts_a_run_with_that_conf(ui, http):
    await signed_in(http, ui)
    token = await csrf(http, ui)
    good = {"csrf": token, "mode": "fields", "p:rows": "25", "p:ratio": "", "p:dry_run": "1",
            "p:region": '"us"', "p:tags": f'["a", "{XSS}"]', "p:note": ""}  # fmt: skip
    async with http.post(form_page(ui), data=good, allow_redirects=False) as r:
        assert r.status == 303
        where = r.headers["Location"]
    run = runs(ui)[-1]
    assert unquote(where) == f"/runs/{run['run_id']}"  # ':' needs no quoting in a path
    # Empty fields left out (their defaults apply); the rest typed as declared.
    assert json.loads(run["conf"]) == {
        "rows": 25, "dry_run": True, "region": "us", "tags": ["a", XSS],
    }  # fmt: skip
    async with http.get(ui["base"] + where) as r:
        assert r.status == 200 and f"{run['run_id']} created" in await r.text()
    # The JSON box starts one too.
    async with http.post(form_page(ui), data={"csrf": token, "mode": "json",
                         "conf": '{"rows": 3}'}, allow_redirects=False) as r:  # fmt: skip
        assert r.status == 303
    assert json.loads(runs(ui)[-1]["conf"]) == {"rows": 3}


def test_a_conf_is_shown_as_text() -> None:
    shown = (
        environment()
        .get_template("_conf.html")
        .render(conf_text=conf_text(json.dumps({"note": XSS, "n": 1})))
    )
    assert XSS not in shown and "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in shown
    assert unescape(shown).count('"n": 1') == 1
    assert "Started without a conf" in environment().get_template("_conf.html").render(
        conf_text=conf_text(None)
    )
    drawn = param_fields({"a": 1, "b": True, "c": [1], "d": "x", "e": 0.5})
    assert [f.kind for f in drawn or []] == ["integer", "boolean", "json", "string", "number"]
    assert param_fields(None) == []

    class Odd:
        pass

    class NoSchema(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        x: Odd | None = None

    assert param_fields(NoSchema) is None  # drawn as the JSON box only


async def test_in_a_browser_refused_then_started(ui):
    before = len(runs(ui))
    back = quote("/dags/loader/trigger", safe="")
    async with devtools(ui["tmp"], f"{ui['base']}/login?back={back}") as page:
        await page.eval_when("!!document.querySelector('input[name=token]')", "the sign-in form")
        await page.eval(f"document.querySelector('input[name=token]').value = {TOKEN!r}")
        await page.click_on("form.login button")
        await page.eval_when(
            "location.pathname === '/dags/loader/trigger' && !!document.querySelector"
            "('#trigger-fields')",
            "signed in, on the form",
        )
        await page.eval("document.querySelector('input[name=\"p:rows\"]').value = '-3'")
        await page.click_on("#trigger-fields")
        said = await page.eval_when(
            "(document.querySelector('[data-error-for=rows]') || {}).textContent",
            "the refusal beside rows",
        )
        assert "greater than or equal to 1" in said
        assert await page.eval("document.querySelector('input[name=\"p:rows\"]').value") == "-3"
        assert await page.eval("window.__xss") is None  # the default's markup stayed text
        assert len(runs(ui)) == before
        await page.eval("document.querySelector('input[name=\"p:rows\"]').value = '7'")
        await page.click_on("#trigger-fields")
        await page.eval_when("location.pathname.startsWith('/runs/')", "the new run's page")
    assert len(runs(ui)) == before + 1
    assert json.loads(runs(ui)[-1]["conf"])["rows"] == 7
