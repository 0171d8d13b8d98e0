"""Bad input at every way in, end to end, on SQLite and PostgreSQL: a real ``slotless ui``
process over real HTTP, and the real CLI.

* a payload nested 990 or 100,000 deep, a lone surrogate, a number JSON cannot hold: a
  400 naming the field, or one CLI line and exit 2; nothing stored;
* a row stored behind the store's back with such a payload still lists (API and CLI);
* ``events send --payload-file`` and ``--payload -`` take a payload that argv cannot;
* a write whose body is not ``application/json``: 415;
* fuzz: hostile bodies and hypothesis-drawn ones at every write route and the reads'
  parameters: never a 5xx, never a traceback, always one JSON error; nothing changes but
  what a 2xx said it stored.
"""

from __future__ import annotations

import asyncio
import json
import string
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import pg
from support.exchanging import claim, complete
from support.helpers import attempt_of, cli, cli_env
from support.ops import ui_process

from executor import DAG
from executor.outcomes import Deferred
from executor.sensing import deferral
from executor.store import open_store
from executor.store.events import UNREADABLE
from triggers.limits import MAX_DEPTH, MAX_PATH_SHOWN
from triggers.people import Approval

pytestmark = pytest.mark.slow
pg_server, pg_url, db_url = pg.pg_server, pg.pg_url, pg.db_url  # fixtures

TOKEN = "s3cret-token"
DAY = date(2026, 11, 24)


@pytest.fixture
def ui(db_url: str, tmp_path: Path) -> Iterator[str]:
    """A ``slotless ui`` with a write token (alice's) on a fresh database; its base URL."""
    asyncio.run(_create(db_url))
    # No request, however hostile, may make the server log a traceback (ui_process checks).
    with ui_process(db_url, tmp_path / "ui.log", "--token", f"alice:{TOKEN}",
                    ready="/api/v1/openapi.json") as base:  # fmt: skip
        yield base


async def _create(db: str) -> None:
    store = await open_store(db)
    await store.close()


def request(
    url: str, body: bytes | None = None, *, method: str = "POST",
    content_type: str | None = "application/json", token: str | None = TOKEN,
) -> tuple[int, Any]:  # fmt: skip
    """(status, the JSON body): every answer of the API is JSON, a refusal too."""
    req = urllib.request.Request(url, data=body, method=method)
    if content_type is not None:
        req.add_header("Content-Type", content_type)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    return status, json.loads(text)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def stored_events(db: str) -> list[tuple[int, str, Any]]:
    store = await open_store(db)
    try:
        return [(e.id, e.name, e.payload) for e in await store.events.list_events(limit=1000)]
    finally:
        await store.close()


# ------------------------------------------------------------------------ deep and odd


async def test_deep_odd_and_unholdable_payloads_are_a_400_or_one_line_and_store_nothing(
    ui: str, db_url: str
) -> None:
    url = ui + "/api/v1/events"
    for raw, field in [
        (f'{{"name": "a", "payload": {nested(MAX_DEPTH + 1)}}}', "payload[0]"),
        # Past some 900 levels Python's parser itself gives up: the body is named then.
        (f'{{"name": "a", "payload": {nested(990)}}}', ("payload[0]", "body")),
        (f'{{"name": "a", "payload": {nested(1000)}}}', "body"),
        (f'{{"name": "a", "payload": {nested(100_000)}}}', "body"),
        ('{"name": "a", "payload": {"x": "\\ud800"}}', "payload.x"),
        ('{"name": "a", "payload": {"\\udfff": 1}}', "payload"),
        ('{"events": [{"name": "a"}, {"name": "a", "payload": ["\\ud800"]}]}',
         "events[1].payload[0]"),
        ('{"name": "a", "payload": {"n": 1e999}}', "payload.n"),
        ('{"name": "a", "payload": {"n": NaN}}', "payload.n"),
        ('{"name": "a", "payload": ' + "9" * 5000 + "}", "body"),
    ]:  # fmt: skip
        status, body = await asyncio.to_thread(request, url, raw.encode())
        assert status == 400 and body["field"].startswith(field), (raw[:80], body)
        assert len(body["field"]) <= MAX_PATH_SHOWN and len(body["error"]) < 400, body
        assert "\n" not in body["error"], body
    for args, says in [
        (["--payload", nested(MAX_DEPTH + 1)], "payload[0]"),
        (["--payload", nested(990)], "payload"),
        (["--payload", nested(1000)], "--payload nests too deep"),
        (["--payload", '{"x": "\\ud800"}'], "payload.x"),
        (["--payload", '{"n": 1e999}'], "payload.n"),
    ]:
        done = await asyncio.to_thread(cli, "events", "send", "a", *args, "--db", db_url)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.startswith("slotless: error:") and says in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr  # one line, no traceback
    assert await stored_events(db_url) == []
    # The limit itself is taken, by both.
    status, _ = await asyncio.to_thread(
        request, url, f'{{"name": "a", "payload": {nested(MAX_DEPTH)}}}'.encode()
    )
    done = cli("events", "send", "a", "--payload", nested(MAX_DEPTH), "--db", db_url)
    assert status == 201 and done.returncode == 0, done.stderr
    assert len(await stored_events(db_url)) == 2


async def test_a_row_stored_behind_the_stores_back_still_lists(ui: str, db_url: str) -> None:
    store = await open_store(db_url)
    try:
        async with store.db.write() as tx:
            await tx.fetch(
                "store_events",
                events=json.dumps(
                    [["deep", nested(990)], ["odd", '{"x":"\\ud800"}'], ["fine", '{"a":1}']]
                ),
                now=store.clock(),
                source="by hand",
            )
    finally:
        await store.close()
    status, body = await asyncio.to_thread(request, ui + "/api/v1/events", method="GET",
                                           token=None)  # fmt: skip
    assert status == 200, body
    payloads = {e["name"]: e["payload"] for e in body["events"]}
    assert payloads["fine"] == {"a": 1}
    assert UNREADABLE in payloads["deep"] and UNREADABLE in payloads["odd"], payloads
    for e in body["events"]:
        status, one = await asyncio.to_thread(
            request, f"{ui}/api/v1/events/{e['id']}", method="GET", token=None
        )
        assert status == 200 and one["payload"] == e["payload"], one
    listed = await asyncio.to_thread(cli, "events", "list", "--db", db_url)
    assert listed.returncode == 0 and "deep" in listed.stdout, listed.stderr


# ------------------------------------------------------------------------ large payloads


async def test_a_payload_from_a_file_or_stdin_that_argv_could_not_carry(
    db_url: str, tmp_path: Path
) -> None:
    await _create(db_url)
    # 1 MB as written (indented), under 64 KiB stored compact: argv holds at most 128 KiB.
    payload = {"rows": [{"id": i, "v": "x" * 20} for i in range(1500)]}
    text = json.dumps(payload, indent=400)
    assert len(text) > 1_000_000
    path = tmp_path / "payload.json"
    path.write_text(text)
    done = cli("events", "send", "big.file", "--payload-file", str(path), "--db", db_url)
    assert done.returncode == 0, done.stderr
    piped = subprocess.run(
        [sys.executable, "-m", "slotless", "events", "send", "big.stdin", "--payload", "-",
         "--db", db_url],
        input=text, capture_output=True, text=True, env=cli_env(), timeout=60,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    got = {name: p for _, name, p in await stored_events(db_url)}
    assert got == {"big.file": payload, "big.stdin": payload}
    # Over 64 KiB compact: one line, nothing stored.
    path.write_text(json.dumps({"blob": "x" * 1_000_000}))
    done = cli("events", "send", "big.file", "--payload-file", str(path), "--db", db_url)
    assert done.returncode == 2 and "64 KiB" in done.stderr and done.stderr.count("\n") == 1
    missing = cli("events", "send", "a", "--payload-file", str(tmp_path / "no"), "--db", db_url)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert len(await stored_events(db_url)) == 2


# ------------------------------------------------------------------------- content type


async def test_a_write_whose_body_is_not_json_by_its_content_type_is_a_415(
    ui: str, db_url: str
) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        status, body = await asyncio.to_thread(
            request, ui + "/api/v1/events", b'{"name": "a"}', content_type=content_type
        )
        assert (status, body["field"]) == (415, "Content-Type"), (content_type, body)
    status, _ = await asyncio.to_thread(
        request, ui + "/api/v1/events", b'{"name": "a"}',
        content_type="application/json; charset=utf-8",
    )  # fmt: skip
    assert status == 201
    assert len(await stored_events(db_url)) == 1


# -------------------------------------------------------------------------------- fuzz


HOSTILE: list[tuple[bytes, str | None]] = [
    (nested(1000).encode(), "application/json"),
    (nested(200_000).encode(), "application/json"),
    (b'{"a":' * 5000 + b"1" + b"}" * 5000, "application/json"),
    (b'"\\ud800"', "application/json"),
    (b'{"name": "a", "payload": "\\udc00\\ud800"}', "application/json"),
    (b'{"approve": "\\ud800"}', "application/json"),
    (b'{"name": "\\ud800"}', "application/json"),
    (b"9" * 10_000, "application/json"),
    (b"1e999", "application/json"),
    (b'{"name": "a", "payload": -Infinity}', "application/json"),
    (b'{"name": "a", "name": "b c"}', "application/json"),  # duplicate keys: the last wins
    (b'{"approve": true, "approve": "yes"}', "application/json"),
    (b'{"approve": "yes"}', "application/json"),
    (b'{"approve": 1}', "application/json"),
    (b'{"approve": true, "map_index": "0"}', "application/json"),
    (b'{"choose": [[[]]]}', "application/json"),
    (b'{"form": ' + nested(300).encode() + b"}", "application/json"),
    (b'{"form": {"a": ' + nested(300).encode() + b"}}", "application/json"),
    (b'{"events": []}', "application/json"),
    (b'{"events": {"name": "a"}}', "application/json"),
    (b'{"conf": ' + b'{"a":' * 300 + b"1" + b"}" * 301, "application/json"),
    (b'{"logical_date": "2026-02-30"}', "application/json"),
    (b'{"run_key": "\\u0000"}', "application/json"),
    (b'{"conf": {"a": "\\ud800"}}', "application/json"),
    (b"\xff\xfe\x00", "application/json"),
    (b"", "application/json"),
    (b"null", "application/json"),
    (b"[]", "application/json"),
    (b'{"name": "a"}', "text/plain"),
    (b'{"name": "a"}', "multipart/form-data; boundary=x"),
    (b'{"name": "a"}', None),
]


async def person_waiting(db: str) -> str:
    """A run whose ``gate`` waits for alice's approval (set up in this process: the fuzz
    needs a task to answer, not a worker); its run id."""
    dag = DAG("gated")
    dag.task(_noop, task_id="gate")
    dag.task(_noop, task_id="after", parents=["gate"])
    store = await open_store(db)
    try:
        run_id = await store.runs.create_run(dag, DAY)
        (row,) = [r for r in await claim(store, "w", 5) if r.run_id == run_id]
        wait = Approval(subject="Publish?", respondents=["alice"])
        d = deferral(wait, method=None, method_kwargs={}, wait_started_at=store.clock(),
                     timeout=3600.0)  # fmt: skip
        await complete(store, [Deferred(**attempt_of(row), deferral=d)])
        return run_id
    finally:
        await store.close()


def _noop(ctx: Any) -> None:
    return None


async def everything(db: str, run_id: str) -> tuple[Any, ...]:
    """What a write could change: the events, the run's tasks (state, output), its log."""
    store = await open_store(db)
    try:
        events = [(e.id, e.name, e.payload) for e in await store.events.list_events(limit=1000)]
        tasks = [
            (t["task_id"], t["state"], t["output"]) for t in await store.views.run_tasks(run_id)
        ]
        log = [e["message"] for e in await store.views.task_log(run_id, "gate", -1) or []]
        needs = (await store.answers.needs_you())[0]
        return events, tasks, log, needs
    finally:
        await store.close()


# JSON values hypothesis draws: any text (lone surrogates included), numbers of any size,
# nesting; sent as JSON text, with NaN and Infinity among the floats.
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
_keys = st.sampled_from(["name", "payload", "events", "approve", "choose", "form", "comment",
                         "map_index", "conf", "logical_date", "run_key", "x"])  # fmt: skip
_bodies = _json | st.dictionaries(_keys, _json, max_size=4)
_params = st.text(alphabet=string.printable + "\u00e9\ud800\x00", max_size=30)


def test_fuzzing_the_api_finds_no_5xx_no_traceback_and_changes_nothing(
    ui: str, db_url: str
) -> None:
    run_id = asyncio.run(person_waiting(db_url))
    response = f"{ui}/api/v1/runs/{quote(run_id, safe='')}/tasks/gate/response"
    writes = [ui + "/api/v1/events", response, ui + "/api/v1/dags/gated/runs",
              ui + "/api/v1/dags/nope/runs"]  # fmt: skip
    before = asyncio.run(everything(db_url, run_id))
    stored: list[int] = []

    def check(status: int, body: Any, what: str) -> None:
        assert status < 500, (what, body)
        assert isinstance(body, dict), (what, body)
        if status >= 400:
            assert isinstance(body.get("error"), str) and body["error"], (what, body)
            assert "Traceback" not in body["error"] and len(body["error"]) < 1000, (what, body)

    # PostgreSQL's text holds no NUL: a lookup by one finds nothing, it does not fail.
    for read in ("/api/v1/events?name=%00", "/api/v1/events?name=%ED%A0%80", "/api/v1/runs/%00",
                 "/api/v1/events/%00", "/api/v1/events?limit=1e999",
                 f"/api/v1/events/{2**63}"):  # fmt: skip
        status, body = request(ui + read, method="GET", token=None)
        check(status, body, read)
        assert status in (400, 404), (read, body)
    for url in (f"{ui}/api/v1/runs/%00/tasks/gate/response",
                f"{ui}/api/v1/runs/{quote(run_id, safe='')}/tasks/%00/response",
                f"{ui}/api/v1/dags/%00/runs"):  # fmt: skip
        status, body = request(url, b'{"approve": true}')
        check(status, body, url)
        assert status in (400, 404), (url, body)
    for raw, content_type in HOSTILE:
        for url in writes:
            status, body = request(url, raw, content_type=content_type)
            check(status, body, f"{url} {raw[:60]!r} {content_type}")
            assert status >= 400, (url, raw[:60], body)

    @settings(max_examples=120, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(body=_bodies, which=st.integers(0, len(writes) - 1), param=_params)
    def fuzz(body: Any, which: int, param: str) -> None:
        url = writes[which]
        if url == response and isinstance(body, dict) and isinstance(body.get("approve"), bool):
            body = {**body, "approve": None}  # a valid approval would change the task
        raw = json.dumps(body, allow_nan=True).encode()
        status, out = request(url, raw)
        check(status, out, f"{url} {raw[:200]!r}")
        if status == 201 and url.endswith("/events"):
            stored.extend(e["id"] for e in out["events"])
        else:
            assert status >= 400, (url, raw[:200], out)
        q = quote(param.encode("utf-8", "surrogatepass"), safe="")
        for read in (f"/api/v1/events?limit={q}", f"/api/v1/events?name={q}",
                     f"/api/v1/events/{q}", f"/api/v1/runs/{q}"):  # fmt: skip
            status, out = request(ui + read, method="GET", token=None)
            check(status, out, read)

    fuzz()
    after = asyncio.run(everything(db_url, run_id))
    # Nothing changed but the events a 201 said it stored (hypothesis may draw a valid one).
    kept = [e for e in after[0] if e[0] not in stored]
    assert (kept, *after[1:]) == before, (after, before)
