"""People in the loop end to end: real ``slotless worker``, ``triggerer`` and ``ui``
processes, answers by the CLI, over real HTTP, and clicked in headless Chromium.

* Chromium: the "Needs you" list (a count in the header) shows the pending requests, a
  ``<script>`` in a body as text; a Form with an invalid value shows the field's error and
  changes nothing; Approve turns the task green and runs its downstream; Reject skips it;
* two answers racing (the CLI and the API at once): one wins, the other is told it was
  answered (by whom, only to the one who answered); the task's log names the respondent
  (SQLite and PostgreSQL);
* bad input: unknown run or task, a task not waiting for a person, bad JSON, a missing or
  wrong token or CSRF token, a respondent not allowed: one clear error, exit 2 or a 4xx,
  nothing changed (SQLite and PostgreSQL);
* a person's wait past its timeout takes its default answer, or fails without one, by the
  triggerer (SQLite and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from support import pg
from support.browser import devtools
from support.helpers import async_wait_until, cli, free_port, start_cli, stop_process, write_dag
from support.ops import wait_for_http

from executor.loader import load_dag
from executor.store import Store, open_store
from triggers.limits import short_path

pytestmark = pytest.mark.slow
pg_server, pg_url, db_url = pg.pg_server, pg.pg_url, pg.db_url  # fixtures

DAY = date(2026, 11, 24)
TOKENS = {"alice": "alice-s3cret", "bob": "bob-s3cret", "mallory": "mallory-s3cret"}
TOKEN_ARG = ",".join(f"{n}:{t}" for n, t in TOKENS.items())

GATED = """
from pydantic import BaseModel, Field

from executor import DAG
from triggers.people import Approval, Form


class Settlement(BaseModel):
    amount: int = Field(ge=0, description="in cents")
    currency: str = "EUR"


dag = DAG("gated")
sign_off = dag.sensor(
    "sign_off",
    Approval(
        subject="Publish the {{ ds }} file?",
        body="**Check** the totals.\\n\\n<script>window.pwned = 1</script>",
        respondents=["alice", "bob"],
    ),
    timeout="1h",
)


@dag.task(parents=[sign_off])
def publish(ctx):
    return {"published": ctx.inputs["sign_off"]["approved"]}


details = dag.sensor("details", Form(subject="Settlement details", model=Settlement),
                     timeout="1h")


@dag.task(parents=[details])
def book(ctx):
    return ctx.inputs["details"]["form"]["amount"]
"""

TIMED = """
from executor import DAG
from triggers.people import Approval, Choice

dag = DAG("timed")
a = dag.sensor("defaulted", Choice(subject="Which?", options=["x", "y"], default={"choose": "y"}),
               timeout=2)
b = dag.sensor("unanswered", Approval(subject="Anyone?"), timeout=2)


@dag.task(parents=[a])
def after_a(ctx):
    return ctx.inputs["defaulted"]["chosen"]


@dag.task(parents=[b])
def after_b(ctx):
    return 1
"""


class Services:
    """The processes of one test, stopped at its end whatever happened."""

    def __init__(self, db: str, tmp: Path) -> None:
        self.db, self.tmp = db, tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        proc = start_cli(*args, "--db", self.db, log=self.tmp / f"{name}.log")
        self.procs.append(proc)
        return proc

    def ui(self) -> str:
        port = free_port()
        proc = self.start("ui", "ui", "--port", str(port), "--refresh", "0.5", "--token", TOKEN_ARG)
        base = f"http://127.0.0.1:{port}"
        wait_for_http(base + "/api/v1/openapi.json", proc, self.tmp / "ui.log")
        return base

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                stop_process(proc)


@pytest.fixture
def services(db_url: str, tmp_path: Path) -> Iterator[Services]:
    s = Services(db_url, tmp_path)
    try:
        yield s
    finally:
        s.stop()


def post(
    url: str, body: Any, token: str | None, raw: bytes | None = None,
    type: str | None = "application/json",
) -> tuple[int, Any]:  # fmt: skip
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    if type is not None:
        req.add_header("Content-Type", type)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def start_run(store: Store, path: Path, dag_id: str, day: date = DAY) -> str:
    return await store.runs.create_run(load_dag(str(path), dag_id), day, dag_file=str(path))


async def states(store: Store, run_id: str) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in await store.views.run_tasks(run_id)}


async def wait_states(store: Store, run_id: str, want: dict[str, str], timeout: float = 60) -> None:
    async def there() -> bool:
        got = await states(store, run_id)
        return all(got.get(k) == v for k, v in want.items())

    await async_wait_until(there, timeout, what=f"{run_id}: {want}")


async def answers_in_log(store: Store, run_id: str, task_id: str) -> list[str]:
    log = await store.views.task_log(run_id, task_id) or []
    return [e["message"] for e in log if "answered by" in e["message"]]


def response_url(base: str, run_id: str, task_id: str) -> str:
    return f"{base}/api/v1/runs/{quote(run_id, safe='')}/tasks/{quote(task_id, safe='')}/response"


# ---------------------------------------------------------------------------- Chromium


async def test_in_chromium_needs_you_approve_reject_and_a_bad_form_value(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'people.db'}"
    s = Services(db, tmp_path)
    path = write_dag(tmp_path, GATED, "gated.py")
    store = await open_store(db)
    try:
        s.start("worker", "worker", "--slots", "4", "--poll-interval", "0.1")
        approved = await start_run(store, path, "gated")
        rejected = await start_run(store, path, "gated", date(2026, 11, 25))
        for run_id in (approved, rejected):
            await wait_states(store, run_id, {"sign_off": "DEFERRED", "details": "DEFERRED"})
        base = s.ui()
        async with devtools(tmp_path, f"{base}/login?back=/needs-you") as page:
            await page.eval_when("!!document.querySelector('input[name=token]')", "sign-in")
            await page.eval(f"document.querySelector('input[name=token]').value = "
                            f"{TOKENS['alice']!r}")  # fmt: skip
            await page.click_on("form.login button")
            await page.eval_when("!!document.querySelector('#needs-count')", "the Needs you list")
            assert await page.eval("document.querySelector('#needs-you b').textContent") == "4"
            assert await page.eval("document.querySelectorAll('section.request').length") == 4
            assert await page.eval("document.querySelector('#who').textContent") == "alice"
            subjects = await page.eval(
                "[...document.querySelectorAll('.request .subject')].map(e => e.textContent)"
            )
            assert "Publish the 2026-11-24 file?" in subjects
            # The body's markup is text: no script element, nothing run, the tag shown.
            sign_off = (
                f"section.request[data-task=sign_off]:has(a[href*='{quote(approved, safe='')}'])"
            )
            body = await page.eval(f"document.querySelector({json.dumps(sign_off)} + ' .body')"
                                   ".textContent")  # fmt: skip
            assert "<script>window.pwned = 1</script>" in body
            assert await page.eval("document.querySelectorAll('.body script').length") == 0
            assert await page.eval("window.pwned === undefined")
            assert (
                await page.eval(
                    f"document.querySelector({json.dumps(sign_off)} + ' .body strong').textContent"
                )
                == "Check"
            )

            # A bad form value: the field's error beside it, nothing changed.
            form = f"section.request[data-task=details]:has(a[href*='{quote(approved, safe='')}'])"
            await page.eval(
                f"document.querySelector({json.dumps(form)} + ' input[name=\"form.amount\"]')"
                ".value = '-5'"
            )
            await page.click_on(f"{form} form.form button")
            error = await page.eval_when(
                "document.querySelector('.field-error')?.textContent", "the field's error"
            )
            assert "form.amount" in error and "minimum" in error, error
            assert (await states(store, approved))["details"] == "DEFERRED"
            assert await answers_in_log(store, approved, "details") == []

            # Approve: the task turns green and its downstream runs.
            await page.click_on(f"{sign_off} form.approve button")
            await page.eval_when(
                "document.querySelector('#flash')?.textContent.includes('answered by alice')",
                "the approval's flash",
            )
            await wait_states(store, approved, {"sign_off": "SUCCESS", "publish": "SUCCESS"})
            # Reject the other run's: its downstream is SKIPPED.
            other = (
                f"section.request[data-task=sign_off]:has(a[href*='{quote(rejected, safe='')}'])"
            )
            await page.click_on(f"{other} form.reject button")
            await wait_states(store, rejected, {"sign_off": "SUCCESS", "publish": "SKIPPED"})
            # A good form value now.
            await page.eval_when(f"!!document.querySelector({json.dumps(form)})", "the form")
            await page.eval(
                f"document.querySelector({json.dumps(form)} + ' input[name=\"form.amount\"]')"
                ".value = '120'"
            )
            await page.click_on(f"{form} form.form button")
            await wait_states(store, approved, {"details": "SUCCESS", "book": "SUCCESS"})
            task_page = f"{base}/runs/{quote(approved, safe='')}/tasks/sign_off"
            await page.send("Page.navigate", url=task_page)
            await page.eval_when(
                "document.querySelector('#task-title .badge')?.textContent.includes('SUCCESS')",
                "the approved task's page",
            )
            colour = await page.eval(
                "getComputedStyle(document.querySelector('#task-title .badge')).backgroundColor"
            )
        assert colour == "rgb(200, 230, 201)"  # .st-SUCCESS: green
        tasks = {t["task_id"]: t for t in await store.views.run_tasks(approved)}
        assert json.loads(tasks["publish"]["output"]) == {"published": True}
        assert json.loads(tasks["book"]["output"]) == 120
        assert json.loads(tasks["sign_off"]["output"])["by"] == "alice"
        assert len(await answers_in_log(store, approved, "sign_off")) == 1
        assert "answered by alice" in (await answers_in_log(store, rejected, "sign_off"))[0]
    finally:
        s.stop()
        await store.close()


# -------------------------------------------------------------------------- the race


async def test_the_cli_and_the_api_racing_one_wins_the_other_is_told_it_was_answered(
    services: Services, tmp_path: Path
) -> None:
    path = write_dag(tmp_path, GATED, "gated.py")
    store = await open_store(services.db)
    try:
        services.start("worker", "worker", "--slots", "4", "--poll-interval", "0.1")
        base = services.ui()
        run_id = await start_run(store, path, "gated")
        await wait_states(store, run_id, {"sign_off": "DEFERRED"})
        respond = subprocess.Popen(
            [sys.executable, "-m", "slotless", "respond", run_id, "sign_off", "--approve",
             "--as", "alice", "--comment", "looks right", "--db", services.db],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        status, body = await asyncio.to_thread(
            post, response_url(base, run_id, "sign_off"), {"approve": False}, TOKENS["bob"]
        )
        out, err = respond.communicate(timeout=60)
        assert (respond.returncode == 0) != (status == 201), (respond.returncode, err, body)
        if status == 201:
            winner = "bob"
            assert respond.returncode == 2 and "already answered" in err, err
            assert "already answered by bob at" in err, err
            assert body["output"]["approved"] is False and body["output"]["by"] == "bob"
        else:
            winner = "alice"
            assert status == 409 and body["field"] == "task_id", body
            assert body["error"].startswith("already answered"), body
            assert "answered by alice" in out
        log = await answers_in_log(store, run_id, "sign_off")
        assert len(log) == 1 and f"answered by {winner}" in log[0], log
        # A later answer from a respondent is told by whom and when (who could answer was
        # kept with the answer).
        for who in ("alice", "bob"):
            late = cli("respond", run_id, "sign_off", "--reject", "--as", who, "--db", services.db)
            told = f"already answered by {winner} at"
            assert late.returncode == 2 and told in late.stderr, late.stderr
    finally:
        await store.close()


# ------------------------------------------------------------------------- bad input


async def test_bad_answers_are_refused_with_one_clear_error_and_change_nothing(
    services: Services, tmp_path: Path
) -> None:
    path = write_dag(tmp_path, GATED, "gated.py")
    store = await open_store(services.db)
    try:
        services.start("worker", "worker", "--slots", "4", "--poll-interval", "0.1")
        base = services.ui()
        run_id = await start_run(store, path, "gated")
        await wait_states(store, run_id, {"sign_off": "DEFERRED", "details": "DEFERRED"})
        before = await states(store, run_id)
        url = response_url(base, run_id, "sign_off")
        for (status, body), want, field in [
            (post(response_url(base, "nope", "sign_off"), {"approve": True}, TOKENS["alice"]),
             404, "run_id"),
            (post(response_url(base, run_id, "nope"), {"approve": True}, TOKENS["alice"]),
             404, "task_id"),
            (post(response_url(base, run_id, "publish"), {"approve": True}, TOKENS["alice"]),
             409, "task_id"),
            (post(url, None, TOKENS["alice"], raw=b"{not json"), 400, "body"),
            (post(url, {"approve": "maybe"}, TOKENS["alice"]), 400, "approve"),
            (post(url, {"approve": "yes"}, TOKENS["alice"]), 400, "approve"),
            (post(url, {"approve": 1}, TOKENS["alice"]), 400, "approve"),
            (post(url, {"approve": True, "map_index": True}, TOKENS["alice"]), 400, "map_index"),
            (post(url, {"approve": True, "map_index": 2**63}, TOKENS["alice"]), 400, "map_index"),
            (post(url, None, TOKENS["alice"], raw=b'{"approve": true}', type="text/plain"),
             415, "Content-Type"),
            (post(url, None, TOKENS["alice"], raw=b'{"approve": true}', type=None),
             415, "Content-Type"),
            (post(url, None, TOKENS["alice"], raw=b'{"approve": true, "comment": "\\ud800"}'),
             400, "comment"),
            (post(response_url(base, run_id, "details"),
                  {"form": {"amount": 1, "currency": json.loads("[" * 300 + "]" * 300)}},
                  TOKENS["alice"]), 400, short_path("form.currency" + "[0]" * 63)),
            (post(response_url(base, run_id, "details"), None, TOKENS["alice"],
                  raw=b'{"form": ' + b"[" * 5000 + b"]" * 5000 + b"}"), 400, "body"),
            (post(url, {"choose": "x"}, TOKENS["alice"]), 400, "choose"),
            (post(url, {"approve": True, "extra": 1}, TOKENS["alice"]), 400, "extra"),
            (post(url, {"approve": True}, None), 401, "Authorization"),
            (post(url, {"approve": True}, "wrong"), 401, "Authorization"),
            (post(url, {"approve": True}, TOKENS["mallory"]), 403, "respondent"),
            (post(response_url(base, run_id, "details"), {"form": {"amount": -1}},
                  TOKENS["alice"]), 400, "form.amount"),
        ]:  # fmt: skip
            assert (status, body.get("field")) == (want, field), body
            assert body["error"], body
        for args, says in [
            (("respond", "nope", "sign_off", "--approve"), "no run 'nope'"),
            (("respond", run_id, "nope", "--approve"), "has no task 'nope'"),
            (("respond", run_id, "publish", "--approve"), "not waiting for a person"),
            (("respond", run_id, "details", "--form", "{bad"), "--form is not JSON"),
            (("respond", run_id, "details", "--form", '{"amount": "x"}'), "form.amount"),
            (("respond", run_id, "sign_off", "--choose", "x", "--as", "bob"), "choose"),
            (("respond", run_id, "sign_off", "--approve", "--as", "mallory"), "may not answer"),
        ]:
            done = cli(*args, "--db", services.db)
            assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
            assert done.stderr.count("\n") == 1, done.stderr  # one line
        # The page's form: without a session, or without its CSRF token, a 403.
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            data = {"run_id": run_id, "task_id": "sign_off", "approve": "true", "back": "/"}
            async with http.post(base + "/actions/respond", data=data) as r:
                assert r.status == 403
            async with http.post(base + "/login", data={"token": TOKENS["alice"]}) as r:
                assert r.status == 200
            async with http.post(base + "/actions/respond", data=data) as r:
                assert r.status == 403 and "CSRF" in await r.text()
            async with http.post(base + "/actions/respond", data={**data, "csrf": "x" * 64}) as r:
                assert r.status == 403
        assert await states(store, run_id) == before
        for task_id in ("sign_off", "details"):
            assert await answers_in_log(store, run_id, task_id) == []
        # ... and the one valid answer still wins after all that.
        status, body = post(url, {"approve": True}, TOKENS["bob"])
        assert status == 201 and body["state"] == "SUCCESS", body
        # A stranger is refused as before the answer: told nothing of the request's fate.
        status, body = post(url, {"approve": True}, TOKENS["mallory"])
        assert status == 403 and "answered" not in body["error"], body
    finally:
        await store.close()


# --------------------------------------------------------------------------- timeout


async def test_past_its_timeout_a_wait_takes_its_default_or_fails_by_the_triggerer(
    services: Services, tmp_path: Path
) -> None:
    path = write_dag(tmp_path, TIMED, "timed.py")
    store = await open_store(services.db)
    try:
        services.start("worker", "worker", "--slots", "4", "--poll-interval", "0.1")
        run_id = await start_run(store, path, "timed")
        await wait_states(store, run_id, {"defaulted": "DEFERRED", "unanswered": "DEFERRED"})
        services.start("triggerer", "triggerer", "--lease-ttl", "3")
        await wait_states(
            store, run_id,
            {"defaulted": "SUCCESS", "after_a": "SUCCESS", "unanswered": "FAILED",
             "after_b": "UPSTREAM_FAILED"},
        )  # fmt: skip
        tasks = {t["task_id"]: t for t in await store.views.run_tasks(run_id)}
        out = json.loads(tasks["defaulted"]["output"])
        assert out["chosen"] == "y" and out["by"] == "default" and out["default"] is True
        assert json.loads(tasks["after_a"]["output"]) == "y"
        log = [e["message"] for e in await store.views.task_log(run_id, "unanswered") or []]
        assert any(m.startswith("sensor timeout") for m in log), log
    finally:
        await store.close()


# ---------------------------------------------------------------------------- notify=

NOTIFIED = """
from executor import DAG
from triggers.people import Approval

dag = DAG("notified")
dag.sensor("sign_off", Approval(subject="Sign off {{{{ ds }}}}", respondents=["alice"],
                                notify={url!r}), timeout="1h")
"""


async def test_notify_tells_the_respondents_with_a_link_to_the_page(
    tmp_path: Path, http_receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'people.db'}"
    path = write_dag(tmp_path, NOTIFIED.format(url=http_receiver.json_url("ask")), "notified.py")
    monkeypatch.setenv("SLOTLESS_UI_URL", "https://slotless.example.com")  # the worker's env
    s = Services(db, tmp_path)
    store = await open_store(db)
    try:
        s.start("worker", "worker", "--slots", "2", "--poll-interval", "0.1")
        run_id = await start_run(store, path, "notified")
        await wait_states(store, run_id, {"sign_off": "DEFERRED"})
        [got] = await asyncio.to_thread(http_receiver.wait_for, 1)
        assert got.path == "/ask"
        text = got.json["title"] + "\n" + got.json["message"]
        assert "needs answer" in text and "Sign off 2026-11-24" in text, text
        row = (await store.views.run_tasks(run_id))[0]["id"]
        assert f"https://slotless.example.com/needs-you#task-{row}" in text, text
        assert "alice" in text
    finally:
        s.stop()
        await store.close()
