"""Token roles and the audit list, end to end on SQLite and PostgreSQL: a real ``slotless
ui`` process with a viewer's, an operator's and an admin's token, over real HTTP (and the
page's role check past its CSRF check over the aiohttp test client, in process: only the
server can sign a form's CSRF token, and it draws no form a role cannot use).

* a viewer is refused a write on the page and through the API: 403 naming both roles,
  nothing changed, one log line, an audit row ``refused``; it is not offered the forms;
* an operator's trigger, mark and clear are recorded under its name, in the task log and
  in the audit list (page and API); pause is refused to it (admin only);
* an admin pauses and unpauses;
* the audit list (``GET /api/v1/audit``, ``GET /audit``) needs a token;
* a malformed token list: ``slotless ui`` and ``slotless up`` refuse at start, one line
  naming the entry and never the secret, exit 2.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from support import pg
from support.helpers import cli, cli_env, free_port, raw_sql, write_dag
from support.ops import ui_process

from executor.store import open_store
from executor.store.audit import AuditRow
from slotless.web.app import make_app
from slotless.web.auth import COOKIE, csrf_token
from slotless.web.keys import AUTH

pytestmark = pytest.mark.slow
pg_server, pg_url, db_url = pg.pg_server, pg.pg_url, pg.db_url  # fixtures

SECRETS = {"viv": "v1ewer-s3cret", "olga": "0perator-s3cret", "ada": "adm1n-s3cret"}
TOKENS = f"viv:viewer:{SECRETS['viv']},olga:operator:{SECRETS['olga']},ada:admin:{SECRETS['ada']}"
HELLO = """
from executor import DAG

dag = DAG("hello", params={"n": 1})


@dag.task
def greet(ctx):
    return ctx.params
"""


@pytest.fixture
def catalogued(db_url: str, tmp_path: Path) -> str:
    """``db_url`` with ``hello`` catalogued (its file in a folder of its own)."""
    folder = tmp_path / "dags"
    folder.mkdir()
    write_dag(folder, HELLO, "hello.py")
    listed = cli("dags", "list", "--db", db_url, "--dags", str(folder), "--parse-timeout", "10")
    assert listed.returncode == 0, listed.stderr
    return db_url


@pytest.fixture
def ui(catalogued: str, tmp_path: Path) -> Iterator[str]:
    """``slotless ui`` with the three tokens over a catalogued ``hello``; its base URL."""
    log = tmp_path / "ui.log"
    with ui_process(catalogued, log, "--token", TOKENS, ready="/dags") as base:
        yield base
    text = log.read_text()
    for secret in SECRETS.values():
        assert secret not in text


@pytest.fixture
async def sessions() -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    """One browser-like client per token (cookies kept, as a browser does for 127.0.0.1)."""
    out = {n: aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) for n in SECRETS}
    try:
        yield out
    finally:
        for s in out.values():
            await s.close()


async def sign_in(http: aiohttp.ClientSession, base: str, name: str) -> str:
    async with http.post(base + "/login", data={"token": SECRETS[name], "back": "/dags"}) as r:
        text = await r.text()
        assert r.status == 200 and r.url.path == "/dags", text[-500:]
        return text


def forms(html: str) -> list[tuple[str, dict[str, str]]]:
    """Every action form on a page: (its action path, its hidden fields)."""
    found = []
    for action, body in re.findall(
        r'<form class="act [^"]*" method="post" action="([^"]+)">(.*?)</form>', html, re.S
    ):
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', body))
        found.append((action, fields))
    return found


def form(html: str, action: str, **match: str) -> dict[str, str]:
    for path, fields in forms(html):
        if path == action and all(fields.get(k) == v for k, v in match.items()):
            return fields
    raise AssertionError(f"no {action} form matching {match}")


async def get(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as r:
        assert r.status == 200, url
        return await r.text()


async def post(http: aiohttp.ClientSession, url: str, data: dict[str, str]) -> tuple[int, str]:
    async with http.post(url, data=data) as r:
        return r.status, await r.text()


def api(
    http: aiohttp.ClientSession, method: str, url: str, who: str | None, body: Any = None
) -> Any:
    headers = {"Authorization": f"Bearer {SECRETS[who]}"} if who else {}
    return http.request(method, url, json=body, headers=headers)


async def audit_rows(db_url: str) -> list[AuditRow]:
    store = await open_store(db_url)
    try:
        return list(reversed(await store.audit.since()))  # oldest first
    finally:
        await store.close()


async def runs(db_url: str) -> list[str]:
    rows = await raw_sql(db_url, "SELECT run_id FROM dag_run WHERE dag_id = 'hello'")
    return sorted(r["run_id"] for r in rows)


async def paused(db_url: str) -> int:
    [row] = await raw_sql(db_url, "SELECT paused FROM dag WHERE dag_id = 'hello'")
    return int(row["paused"])


async def task_log(db_url: str, run_id: str) -> list[str]:
    store = await open_store(db_url)
    try:
        rows = await store.views.task_log(run_id, "greet")
        return [r["message"] for r in rows or []]
    finally:
        await store.close()


def own_csrf(client: TestClient, app: web.Application, action: str) -> str:
    """The CSRF token the server signs for ``/actions/<action>`` (or a path) in this
    client's session."""
    [cookie] = [c for c in client.session.cookie_jar if c.key == COOKIE]
    request = make_mocked_request("GET", "/", headers={"Cookie": f"{COOKIE}={cookie.value}"})
    session = app[AUTH].session(request)
    assert session is not None
    return csrf_token(session, action if action.startswith("/") else f"/actions/{action}")


def flash(html: str) -> str:
    m = re.search(r'<div class="flash (\w+)" role="status" id="flash">(.*?)</div>', html, re.S)
    assert m is not None, "no flash message"
    return f"{m.group(1)}: {m.group(2)}"


# ---------------------------------------------------------------------------------- tests


async def test_the_page_refuses_a_write_below_the_sessions_role_and_records_it(
    catalogued: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the CSRF check, on the role: each session posts with a CSRF token good for the
    action in its own session (the server would sign it; the page just never draws the
    form for a role that cannot use it). In process, over the aiohttp test client."""
    db_url = catalogued
    store = await open_store(db_url)
    app = make_app(store, token=TOKENS)
    try:
        async with TestClient(TestServer(app)) as client:
            for name, action, fields, says in [
                ("viv", "trigger", {"dag_id": "hello", "conf": "{}"},
                 "trigger needs the operator role; viv is a viewer"),
                ("olga", "pause", {"dag_id": "hello"},
                 "pause needs the admin role; olga is an operator"),
            ]:  # fmt: skip
                client.session.cookie_jar.clear()
                async with client.post(
                    "/login", data={"token": SECRETS[name], "back": "/dags"}
                ) as r:
                    html = await r.text()
                assert r.status == 200 and f"signed in as {name}" in html
                assert f'action="/actions/{action}"' not in html  # not offered
                async with client.get("/dags/hello") as r:  # the DAG's page: its template
                    assert r.status == 200
                    assert f'action="/actions/{action}"' not in await r.text()
                caplog.clear()
                data = {**fields, "back": "/dags", "csrf": own_csrf(client, app, action)}
                async with client.post(f"/actions/{action}", data=data) as r:
                    text = await r.text()
                    assert r.status == 403, text[-500:]
                assert says in text and "nothing was changed" in text
                refused = [m for m in caplog.messages if m.startswith("refused POST")]
                assert len(refused) == 1 and says in refused[0], caplog.messages
            assert await runs(db_url) == [] and await paused(db_url) == 0
            # The admin, through the form drawn for it: allowed.
            client.session.cookie_jar.clear()
            async with client.post("/login", data={"token": SECRETS["ada"], "back": "/dags"}) as r:
                html = await r.text()
            assert "signed in as ada, an admin" in html
            async with client.get("/dags/hello") as r:
                assert 'action="/actions/pause"' in await r.text()
            async with client.post(
                "/actions/pause", data=form(html, "/actions/pause", dag_id="hello")
            ) as r:
                assert r.status == 200 and flash(await r.text()) == "ok: hello paused"
            assert await paused(db_url) == 1
            # The audit page's live poll renders its rows again, from the same template.
            async with client.get("/api/live/audit") as r:
                assert r.status == 200
                blocks = (await r.json())["blocks"]
            assert blocks["live_audit"].count('<tr class="refused">') == 2
        # Without tokens nobody can sign in: the audit list is refused, saying why.
        async with TestClient(TestServer(make_app(store))) as client:
            async with client.get("/audit") as r:
                assert r.status == 403 and "--token NAME:ROLE:SECRET" in await r.text()
            async with client.get("/api/v1/audit") as r:
                assert r.status == 403 and (await r.json())["field"] == "Authorization"
    finally:
        await store.close()
    rows = await audit_rows(db_url)
    assert [(r.who, r.role, r.via, r.action, r.target, r.outcome) for r in rows] == [
        ("viv", "viewer", "web", "trigger", "dag:hello", "refused"),
        ("olga", "operator", "web", "pause", "dag:hello", "refused"),
        ("ada", "admin", "web", "pause", "dag:hello", "ok"),
    ]
    assert rows[1].detail == {"dag_id": "hello", "error": "pause needs the admin role; "
                              "olga is an operator"}  # fmt: skip
    assert rows[2].detail == {"dag_id": "hello", "result": "hello paused"}


async def test_the_trigger_form_page_checks_the_role_and_is_recorded(catalogued: str) -> None:
    """``POST /dags/{dag_id}/trigger`` (the form drawn from a DAG's params) is a page write
    outside ``/actions``: the same check (app._checked) refuses it to a viewer, and its
    row is written once its answer is known."""
    db_url = catalogued
    store = await open_store(db_url)
    app = make_app(store, token=TOKENS)
    try:
        async with TestClient(TestServer(app)) as client:
            for name, status in (("viv", 403), ("olga", 303)):
                client.session.cookie_jar.clear()
                async with client.post("/login", data={"token": SECRETS[name]}) as r:
                    assert r.status == 200
                async with client.get("/dags/hello/trigger") as r:
                    page = await r.text()
                csrf = own_csrf(client, app, "/dags/hello/trigger")
                assert (csrf in page) == (name == "olga")  # signed: the form only it may use
                data = {"csrf": csrf, "mode": "json", "conf": '{"n": 5}'}
                async with client.post("/dags/hello/trigger", data=data,
                                       allow_redirects=False) as r:  # fmt: skip
                    assert r.status == status, await r.text()
                    if name == "viv":
                        assert "trigger needs the operator role; viv is a viewer" in (
                            await r.text()
                        )
                        assert await runs(db_url) == []
    finally:
        await store.close()
    [run_id] = await runs(db_url)
    rows = await audit_rows(db_url)
    assert [(r.who, r.role, r.via, r.action, r.target, r.outcome) for r in rows] == [
        ("viv", "viewer", "web", "trigger", "dag:hello", "refused"),
        ("olga", "operator", "web", "trigger", "dag:hello", "ok"),
    ]
    assert rows[1].detail == {"conf": '{"n": 5}', "mode": "json", "result": f"{run_id} created"}


async def test_a_viewer_is_refused_writes_through_the_api_and_reads_the_audit_list(
    ui: str, db_url: str, sessions: dict[str, aiohttp.ClientSession]
) -> None:
    viv = sessions["viv"]
    html = await sign_in(viv, ui, "viv")
    assert "signed in as viv, a viewer" in html
    assert [path for path, _ in forms(html)] == ["/logout"]  # offered no write
    async with api(viv, "POST", f"{ui}/api/v1/dags/hello/runs", "viv", {"conf": {}}) as r:
        assert r.status == 403
        assert await r.json() == {
            "error": "trigger needs the operator role; viv is a viewer",
            "field": "Authorization",
            "errors": [],
        }
    async with api(viv, "POST", f"{ui}/api/v1/events", "viv", {"name": "x.y"}) as r:
        assert r.status == 403
        assert (await r.json())["error"] == "send_events needs the operator role; viv is a viewer"
    assert await runs(db_url) == []
    rows = await audit_rows(db_url)
    assert [(r.who, r.role, r.via, r.action, r.target, r.outcome) for r in rows] == [
        ("viv", "viewer", "api", "trigger", "dag:hello", "refused"),
        ("viv", "viewer", "api", "send_events", "", "refused"),
    ]
    assert rows[0].detail == {
        "status": 403, "error": "trigger needs the operator role; viv is a viewer",
    }  # fmt: skip
    # The audit list: a viewer's token reads it, newest first; none is a 401.
    async with api(viv, "GET", f"{ui}/api/v1/audit?limit=1", "viv") as r:
        assert r.status == 200
        [entry] = (await r.json())["entries"]
    assert (entry["who"], entry["role"], entry["action"], entry["outcome"]) == (
        "viv", "viewer", "send_events", "refused",
    )  # fmt: skip
    since = rows[1].ts + 1
    async with api(viv, "GET", f"{ui}/api/v1/audit?since={since}", "viv") as r:
        assert r.status == 200 and (await r.json())["entries"] == []
    async with api(viv, "GET", f"{ui}/api/v1/audit", None) as r:
        assert r.status == 401
    for bad in ("since=nan", "since=x", "limit=0"):
        async with api(viv, "GET", f"{ui}/api/v1/audit?{bad}", "viv") as r:
            assert r.status == 400 and (await r.json())["field"] == bad.split("=")[0]
    page = await get(viv, f"{ui}/audit")
    assert page.count('<tr class="refused">') == 2 and "send_events" in page
    async with aiohttp.ClientSession() as stranger, stranger.get(f"{ui}/audit") as r:
        assert r.url.path == "/login"  # not signed in: sent to sign in first


async def test_an_operators_writes_are_recorded_under_its_name(
    ui: str, db_url: str, sessions: dict[str, aiohttp.ClientSession]
) -> None:
    olga = sessions["olga"]
    html = await sign_in(olga, ui, "olga")
    assert "signed in as olga, an operator" in html
    paths = {path for path, _ in forms(html)}
    assert "/actions/trigger" in paths and "/actions/pause" not in paths
    trigger = form(html, "/actions/trigger") | {"dag_id": "hello"}  # chosen in its <select>
    status, html = await post(olga, f"{ui}/actions/trigger", {**trigger, "conf": '{"n": 2}'})
    assert status == 200 and flash(html).startswith("ok: "), flash(html)
    [run_id] = await runs(db_url)
    # Mark, then clear, the run's task through its page's forms.
    page = await get(olga, f"{ui}/runs/{quote(run_id, safe='')}/tasks/greet")
    status, page = await post(olga, f"{ui}/actions/mark", form(page, "/actions/mark",
                                                               outcome="success"))  # fmt: skip
    assert status == 200 and flash(page).startswith("ok: mark: greet"), flash(page)
    status, page = await post(olga, f"{ui}/actions/clear", form(page, "/actions/clear"))
    assert status == 200 and flash(page).startswith("ok: clear: greet"), flash(page)
    log = await task_log(db_url, run_id)
    assert any(m.startswith("marked SUCCESS by olga") for m in log), log
    assert any(m.startswith("cleared by olga") for m in log), log
    assert not any("127.0.0.1" in m or "web:" in m for m in log), log
    async with api(olga, "POST", f"{ui}/api/v1/dags/hello/runs", "olga",
                   {"conf": {"n": 3}, "run_key": "k1"}) as r:  # fmt: skip
        assert r.status == 201, await r.text()
        api_run = (await r.json())["run_id"]
    rows = await audit_rows(db_url)
    assert [(r.who, r.role, r.via, r.action, r.target, r.outcome) for r in rows] == [
        ("olga", "operator", "web", "trigger", "dag:hello", "ok"),
        ("olga", "operator", "web", "mark", f"task:{run_id}/greet", "ok"),
        ("olga", "operator", "web", "clear", f"task:{run_id}/greet", "ok"),
        ("olga", "operator", "api", "trigger", "dag:hello", "ok"),
    ]
    assert rows[0].detail["conf"] == '{"n": 2}' and run_id in rows[0].detail["result"]
    assert "csrf" not in rows[0].detail and "back" not in rows[0].detail
    assert rows[3].detail["run_id"] == api_run and rows[3].detail["status"] == 201


@pytest.mark.parametrize(
    ("tokens", "says"),
    [
        ("ada:admin:Adm1nPart,olga:sup3r:0pPart", "token entry 2 (olga): the role"),
        ("ada:admin:Adm1nPart,:0pPart", "token entry 2: the name is empty"),
        ("ada:Adm1nPart,ada:viewer:0pPart", "token entry 2 (ada): the name is given twice"),
    ],
)
def test_a_malformed_token_list_is_refused_at_start_with_one_line(
    tokens: str, says: str, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'never.db'}"
    for how, env in [
        (["--token", tokens], cli_env()),
        ([], cli_env(SLOTLESS_UI_TOKEN=tokens)),
    ]:
        for command in (["ui", "--port", str(free_port())], ["up", "--port", str(free_port())]):
            done = cli(*command, "--db", db, *how, env=env, timeout=60)
            assert done.returncode == 2, (command, done.stdout, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"slotless: error: {says}"), lines
            for part in ("Adm1nPart", "0pPart", "sup3r"):
                assert part not in done.stderr + done.stdout
    assert not (tmp_path / "never.db").exists()  # refused before anything started
