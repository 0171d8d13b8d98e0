"""Assets through the real processes, on both backends: events from ``slotless assets
send`` and ``POST /api/v1/assets/events`` (a retried request records nothing more, bad
input is one line / a 4xx), an asset's watcher held by a real ``slotless triggerer``, the
``/assets`` page and its lineage graph; and examples/assets_pair.py run end to end."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from support import pg
from support.catalogued import all_runs, catalogue_file
from support.helpers import (
    REPO,
    async_wait_until,
    cli,
    run_to_end,
    start_cli,
    stop_process,
    write_dag,
)
from support.ops import ui_process

from executor.loader import load_dag
from executor.store import open_store

pytestmark = pytest.mark.slow
pg_server, pg_url, db_url = pg.pg_server, pg.pg_url, pg.db_url  # fixtures

TOKEN = "s3cret-token"
A, B, C = "s3://lake/a", "s3://lake/b", "file://flags/c"


def dags_source(flag: Path) -> str:
    return f"""
from executor import DAG, Asset
from triggers.files import FileTrigger

a, b = Asset("{A}"), Asset("{B}")
c = Asset("{C}", name="flag", watchers=[FileTrigger(path="{flag}", poke_interval=0.2)])
both = DAG("both", schedule=a & b)
on_c = DAG("on_c", schedule=[c])
maker = DAG("maker")

@maker.task(outlets=[a])
def make(ctx):
    return 1

for d in (both, on_c):
    @d.task(task_id="see")
    def see(ctx):
        return sorted(ctx.triggering_asset_events)
"""


@pytest.fixture
def services(db_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A ``slotless ui`` (alice's token) and a ``slotless triggerer`` over a DAG folder."""
    dags = tmp_path / "dags"
    dags.mkdir()
    flag = tmp_path / "c.flag"
    write_dag(dags, dags_source(flag), "assets_dags.py")
    trig_log = tmp_path / "triggerer.log"
    with ui_process(db_url, tmp_path / "ui.log", "--token", f"alice:{TOKEN}", "--dags",
                    str(dags), ready="/api/v1/openapi.json") as base:  # fmt: skip
        triggerer = start_cli("triggerer", "--db", db_url, "--dags", str(dags), log=trig_log)
        try:
            yield base, flag
        finally:
            stop_process(triggerer)
            assert "Traceback" not in trig_log.read_text(), trig_log.read_text()[-3000:]


def request(
    url: str, body: Any = None, *, method: str = "POST", token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:  # fmt: skip
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    return status, text.decode()


async def runs_of(db_url: str, dag_id: str) -> list[dict]:
    store = await open_store(db_url, create=False)
    try:
        return [r for r in await all_runs(store) if r["dag_id"] == dag_id]
    finally:
        await store.close()


async def test_cli_api_watcher_and_page(services: tuple[str, Path], db_url: str) -> None:
    base, flag = services

    async def catalogued() -> bool:
        status, text = request(base + "/api/v1/assets", method="GET", token=None)
        return status == 200 and {"both", "on_c"} <= {
            d for a in json.loads(text)["assets"] for d in a["consumers"]
        }

    await async_wait_until(catalogued, timeout=60)

    # The CLI: a alone starts nothing; bad input is one line and exit 2.
    done = await asyncio.to_thread(cli, "assets", "send", A, "--extra", '{"n": 1}', "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert "started no run" in done.stdout
    for bad in (["nope"], [A, "--extra", "{oops"], [A, "--extra", "[1]"]):
        out = await asyncio.to_thread(cli, "assets", "send", *bad, "--db", db_url)
        assert out.returncode == 2 and out.stdout == "", out
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr

    # The API: b completes `both`; the same request again records nothing more.
    key = {"Idempotency-Key": "req-7"}
    status, text = request(base + "/api/v1/assets/events", {"uri": B, "extra": {"n": 2}},
                           headers=key)  # fmt: skip
    assert status == 201, text
    [run_id] = json.loads(text)["runs"]
    status, text = request(base + "/api/v1/assets/events", {"uri": B, "extra": {"n": 2}},
                           headers=key)  # fmt: skip
    assert status == 200 and json.loads(text)["created"] is False and json.loads(text)["runs"] == []
    assert [r["run_id"] for r in await runs_of(db_url, "both")] == [run_id]
    status, text = request(f"{base}/api/v1/runs/{run_id}", method="GET", token=None)
    assert status == 200 and json.loads(text)["run_type"] == "asset", text
    assert request(base + "/api/v1/assets/events", {"uri": B}, token=None)[0] == 401
    status, text = request(base + "/api/v1/assets/events", {"uri": "not a uri"})
    assert status == 400 and "URI" in json.loads(text)["error"]
    status, _ = request(base + "/api/v1/assets/events", {"uri": A, "extra": {"x": "y" * 70_000}})
    assert status == 413

    # The watcher: held by the triggerer, its fire records an event that starts on_c.
    assert await runs_of(db_url, "on_c") == []
    flag.write_text("here")

    async def on_c_started() -> bool:
        return bool(await runs_of(db_url, "on_c"))

    await async_wait_until(on_c_started, timeout=60)
    flag.unlink()
    [run, *_] = await runs_of(db_url, "on_c")
    events = json.loads(run["start_event"])["triggering_asset_events"]
    assert [e["source"] for e in events[C]] == ["watcher"]

    # The page: every asset, its producers and consumers, and the lineage graph; a URI is
    # text, never markup.
    hostile = "s3://x/<b>bold</b>"
    status, _ = request(base + "/api/v1/assets/events", {"uri": hostile, "extra": {"<i>": "</td>"}})
    assert status == 201
    status, html = request(base + "/assets", method="GET", token=None)
    assert status == 200
    assert "<b>bold" not in html and '</td>"' not in html and "&lt;b&gt;bold" in html
    for text in (A, B, C, "maker", "both", "on_c", "<svg", "lineage"):
        assert text in html, text
    # The DAGs list says what starts a DAG scheduled on assets, in its words.
    status, html = request(base + "/dags", method="GET", token=None)
    assert status == 200
    assert f"when its assets are updated: {A} &amp; {B}" in html


async def test_the_example_pair_runs(tmp_path: Path) -> None:
    """examples/assets_pair.py, as docs/migrating-from-airflow.md shows it: the producer's
    run ends, the consumer's run is there and sees the producer's extra."""
    path = REPO / "examples" / "assets_pair.py"
    store = await open_store(f"sqlite:///{tmp_path / 'pair.db'}")
    try:
        await catalogue_file(store, path)
        orders = load_dag(path, "orders")
        started = await store.runs.start_run(orders, date(2026, 11, 26), dag_file=str(path))
        assert (await run_to_end(store, started.run_id))["state"] == "SUCCESS"
        [report] = [r for r in await all_runs(store) if r["dag_id"] == "report"]
        assert (await run_to_end(store, report["run_id"]))["state"] == "SUCCESS"
        [task] = await store.views.run_tasks(report["run_id"])
        assert json.loads(task["output"]) == 2
    finally:
        await store.close()
