"""The waits page live: `slotless up` (worker, triggerer, web page as processes) runs a DAG
whose two sensors wait for the same file, so the triggerer holds ONE check for both; in
headless Chromium the page shows that check once with its two tasks, and the sidebar shows
the triggerer with its shards and held waits. The file's path holds ``<script>``: shown as
text, never run. Bad filters are one-line 400s; the JSON twins are in the OpenAPI document.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import textwrap
import urllib.request
from pathlib import Path

import pytest
from support.browser import devtools
from support.helpers import REPO, free_port, sql, start_cli, stop_process
from support.ops import http_get, poll, wait_for_http

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"

SHARED = """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG("shared_wait")
# Equal conditions (the same file), different intervals: one check, at the shorter one.
a = dag.sensor("wait_a", FileTrigger(path={flag!r}, poke_interval=0.5), timeout="1h")
b = dag.sensor("wait_b", FileTrigger(path={flag!r}, poke_interval=2), timeout="2h")


@dag.task(parents=[a, b])
def after(ctx):
    return "done"
"""


def _json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


async def test_two_tasks_sharing_one_check_are_one_row(tmp_path: Path) -> None:
    # "<script>alert(1)</script>.flag": its directory is "<script>alert(1)<".
    inbox = tmp_path / "<script>alert(1)<"
    inbox.mkdir()
    flag = tmp_path / "<script>alert(1)</script>.flag"
    dag_file = tmp_path / "shared_dag.py"
    dag_file.write_text(textwrap.dedent(SHARED.format(flag=str(flag))))
    db_path = tmp_path / "waits.db"
    port, wport = free_port(), free_port()
    log = tmp_path / "up.log"
    up = start_cli(
        "up", str(dag_file), "--db", f"sqlite:///{db_path}", "--port", str(port),
        "--worker-metrics-port", str(wport), log=log,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base + "/", up, log)
        poll(
            lambda: (
                sql(db_path, "SELECT count(*) AS n FROM task WHERE state = 'DEFERRED'")[0]["n"] == 2
            ),
            what="both sensors to defer",
        )
        poll(
            lambda: sql(db_path, "SELECT count(*) AS n FROM task_event WHERE kind = 'check'")[0][
                "n"
            ],
            what="the triggerer to check the file",
        )
        poll(
            lambda: any(t["waits"] == 2 for t in _json(base + "/api/v1/triggerers/history")[
                "triggerers"]),
            what="the triggerer's heartbeat to say it holds both waits",
        )  # fmt: skip

        # The JSON twin: one condition, two waiters, its shard held by the live triggerer.
        listed = _json(base + "/api/v1/waits")
        assert (listed["conditions"], listed["waits"]) == (1, 2)
        (item,) = listed["items"]
        assert item["waiters"] == 2 and item["lease_live"] and item["triggerer"]
        assert {t["task_id"] for t in item["tasks"]} == {"wait_a", "wait_b"}
        assert item["interval"] in (0.5, 2.0) and item["last_check_at"] is not None
        assert item["timeout_share"] is not None and 0 <= item["timeout_share"] < 0.1
        (trig,) = _json(base + "/api/v1/triggerers/history")["triggerers"]
        assert trig["live"] and len(trig["shards"]) == 64 and trig["samples"]
        assert trig["id"] == item["triggerer"]

        # Filters: a DAG with no waits shows none; bad values are one line and a 400.
        none = _json(base + "/api/v1/waits?dag=nope")
        assert (none["conditions"], none["items"]) == (0, [])
        for query, says in [
            ("limit=lots", "limit must be a number"),
            ("limit=0", "limit must be between 1 and 500"),
            ("class=%3Cscript%3E", "class must be a trigger's dotted class path"),
            ("order=newest", "order must be one of: waiters, oldest"),
        ]:
            status, text = http_get(f"{base}/waits?{query}")
            assert status == 400 and text.startswith(says) and "\n" not in text.strip(), text
            status, text = http_get(f"{base}/api/v1/waits?{query}")
            assert status == 400 and json.loads(text)["error"].startswith(says)
        paths = _json(base + "/api/v1/openapi.json")["paths"]
        assert "/api/v1/waits" in paths and "/api/v1/triggerers/history" in paths

        url = base + "/waits?class=triggers.files.FileTrigger&dag=shared_wait"
        async with devtools(tmp_path, url) as page:
            rows = await page.eval_when(
                """(() => {
                    const rows = document.querySelectorAll('#waits tr.group');
                    if (!rows.length) return null;
                    return Array.from(rows).map(r => ({
                        waiters: r.querySelector('b.waiters').textContent,
                        tasks: Array.from(r.querySelectorAll('ul.tasks a')).map(
                            a => [a.textContent, a.getAttribute('href')]),
                        text: r.textContent,
                    }));
                })()""",
                "the waits table",
            )
            assert len(rows) == 1, rows  # two tasks, one check
            (row,) = rows
            assert row["waiters"] == "2"
            hrefs = sorted(h for _, h in row["tasks"])
            assert len(hrefs) == 2
            assert all(re.fullmatch(r"/runs/[^/]+/tasks/wait_[ab]", h) for h in hrefs), hrefs
            assert "<script>alert(1)</script>.flag" in row["text"]  # the kwargs, as text
            assert "shard " in row["text"] and "every 0.5 s" in row["text"]
            # The only script is the page's own live poll; the kwargs' ran nowhere.
            assert await page.eval("document.scripts.length") == 1
            assert await page.eval("typeof window.alerted") == "undefined"
            form = await page.eval(
                "[document.querySelector('input[name=class]').value,"
                " document.querySelector('input[name=dag]').value]"
            )
            assert form == ["triggers.files.FileTrigger", "shared_wait"]  # the URL holds them
            card = await page.eval_when(
                """(() => {
                    const c = document.querySelector('#triggerers section.tcard');
                    return c && {id: c.dataset.triggerer, text: c.textContent,
                                 charts: c.querySelectorAll('figure.spark svg').length};
                })()""",
                "the triggerer in the sidebar",
            )
            assert card["id"] == trig["id"] and "live" in card["text"]
            assert re.search(r"shards\s*64", card["text"]) and card["charts"] == 4
            # The live poll re-renders both blocks from the same template.
            live = _json(base + "/api/live/waits?class=triggers.files.FileTrigger&dag=shared_wait")
            assert set(live["blocks"]) == {"live_waits", "live_triggerers"}
            assert "<script>alert" not in live["blocks"]["live_waits"]
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in live["blocks"]["live_waits"]
            ARTIFACTS.mkdir(exist_ok=True)
            shot = await page.send("Page.captureScreenshot", format="png")
            (ARTIFACTS / "web-waits.png").write_bytes(base64.b64decode(shot["data"]))

        # The file lands: the one check fires both waits, and the page empties.
        flag.write_text("go")
        poll(
            lambda: _json(base + "/api/v1/waits")["conditions"] == 0,
            what="the condition to leave the page once the file is there",
        )
    finally:
        code = stop_process(up, signal.SIGINT)
    assert code == 0, log.read_text()
