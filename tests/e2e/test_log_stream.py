"""A task's log streamed live: a real `slotless worker` (process isolation: the child's
lines go through its pipe) runs a task that writes lines until the test says stop, a real
`slotless ui` serves its log page, and headless Chromium shows the new lines as they are
written without a reload; "follow" unticked keeps the view where the reader left it; a
line holding markup is text; the download and the API give the whole log, each entry
once."""

from __future__ import annotations

import json
import urllib.request
from urllib.parse import quote

import pytest
from support.browser import devtools
from support.helpers import (
    async_wait_until,
    cli,
    sql,
    start_cli,
    stop_process,
    write_dag,
)
from support.ops import http_get, ui_process

pytestmark = pytest.mark.slow

XSS = "<script>window.__xss = 1</script><img src=x onerror='window.__xss = 2'>"
CHATTY = """
import time
from pathlib import Path
from executor import DAG

STOP = Path({stop!r})
dag = DAG("chatty")


@dag.task
def talk(ctx):
    ctx.log({xss!r})
    for i in range(60):  # more than the view shows at once: it scrolls
        ctx.log(f"warm-up line {{i}}")
    n = 0
    while not STOP.exists() and n < 2000:
        ctx.log(f"tick {{n}}")
        n += 1
        time.sleep(0.1)
    ctx.log(f"done after {{n}} ticks")
    return n


@dag.task
def items(ctx):
    return ["a", "b"]


@dag.task(expand=items)
def each(ctx):
    ctx.log(f"item {{ctx.item}} of {{ctx.total}}")
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("log-stream")
    db = tmp / "l.db"
    url = f"sqlite:///{db}"
    folder = tmp / "dags"
    folder.mkdir()
    stop = tmp / "stop"
    write_dag(folder, CHATTY.format(stop=str(stop), xss=XSS), "chatty.py")
    listed = cli("dags", "list", "--db", url, "--dags", str(folder), "--parse-timeout", "10")
    assert listed.returncode == 0, listed.stderr
    started = cli("trigger", "chatty", "--db", url, "--parse-timeout", "10")
    assert started.returncode == 0, started.stderr
    [run] = sql(db, "SELECT run_id FROM dag_run WHERE dag_id = 'chatty'")
    worker_log = tmp / "worker.log"
    worker = start_cli("worker", "--db", url, "--isolation", "process", log=worker_log)
    with ui_process(url, tmp / "ui.log", "--refresh", "0.5") as base:
        yield {"base": base, "run_id": run["run_id"], "db": db, "stop": stop, "tmp": tmp}
        stop.touch()
        assert stop_process(worker) == 0, worker_log.read_text()


def task_url(s: dict) -> str:
    return f"{s['base']}/runs/{quote(s['run_id'], safe='')}/tasks/talk"


def api_url(s: dict) -> str:
    return f"{s['base']}/api/v1/runs/{quote(s['run_id'], safe='')}/tasks/talk/log"


def read_api(s: dict, since: int, limit: int = 1000) -> dict:
    status, body = http_get(f"{api_url(s)}?since={since}&limit={limit}")
    assert status == 200, body
    return dict(json.loads(body))


def whole_log(s: dict, limit: int) -> list[dict]:
    out: list[dict] = []
    since = 0
    while True:
        page = read_api(s, since, limit)
        out += page["entries"]
        since = page["next"]
        if not page["more"]:
            return out


ROWS = "document.querySelectorAll('.logstream tbody tr').length"
AT_BOTTOM = (
    "(() => { const b = document.querySelector('.logbox');"
    " return b.scrollTop + b.clientHeight >= b.scrollHeight - 4; })()"
)


async def test_a_log_grows_while_its_page_is_open(stack):
    s = stack
    # The task is running and has written lines: the worker flushes them as they come.
    await async_wait_until(
        lambda: any(e["message"].startswith("tick") for e in read_api(s, 0)["entries"]),
        timeout=60,
        what="the running task's first ticks in its log",
    )
    assert not read_api(s, 0)["finished"]
    async with devtools(s["tmp"], task_url(s) + "/log") as page:
        await page.eval_when(
            "document.querySelector('.logstream') && document.readyState === 'complete'",
            "the log page",
        )
        await page.eval("window.__marker = 'same page'")  # gone if the page reloads
        first = await page.eval(ROWS)
        assert first > 60
        # New lines arrive with no reload, and "follow" keeps the newest in view.
        await page.eval_when(f"{ROWS} >= {first + 5}", "five more lines without a reload")
        assert await page.eval("window.__marker") == "same page"
        await page.eval_when(AT_BOTTOM, "the view at the newest line (follow)")
        # Pausing: untick follow, read from the top; new lines come, the view stays.
        await page.click_on("#log-follow")
        assert await page.eval("document.querySelector('#log-follow').checked") is False
        await page.eval("document.querySelector('.logbox').scrollTop = 0")
        now = await page.eval(ROWS)
        await page.eval_when(f"{ROWS} >= {now + 5}", "more lines while paused")
        assert await page.eval("document.querySelector('.logbox').scrollTop") == 0
        # The line holding markup is text: no script ran, no element was made of it.
        assert await page.eval("window.__xss") is None
        cells = await page.eval(
            "Array.from(document.querySelectorAll('.logstream td.msg')).map(c => c.textContent)"
        )
        assert XSS in cells
        assert await page.eval("document.querySelectorAll('.logstream img').length") == 0
        # The task ends: one last read brings its last lines, and the viewer stops.
        s["stop"].touch()
        await page.eval_when(
            "document.querySelector('.logstream').dataset.finished === '1'",
            "the viewer to see the task finished",
        )
        ids = await page.eval(
            "Array.from(document.querySelectorAll('.logstream tbody tr')).map(r => r.dataset.id)"
        )
        shown = await page.eval(
            "Array.from(document.querySelectorAll('.logstream tr.k-log td.msg'))"
            ".map(c => c.textContent)"
        )
    everything = whole_log(s, 1000)
    assert ids == [str(e["id"]) for e in everything]  # every entry once, in order
    lines = [e["message"] for e in everything if e["kind"] == "log"]
    assert shown == lines
    assert lines[-1].startswith("done after")
    n = int(lines[-1].split()[2])
    assert n >= 10  # it really wrote while the page was open
    assert lines[1:] == [f"warm-up line {i}" for i in range(60)] + [
        f"tick {i}" for i in range(n)
    ] + [lines[-1]]
    # Read in pages of 7, the API gives the same entries, each once.
    assert whole_log(s, 7) == everything
    last = read_api(s, 0)
    assert last["finished"] and last["state"] == "SUCCESS"
    assert read_api(s, last["next"]) == {**last, "entries": [], "more": False}


async def test_the_download_is_the_whole_log(stack):
    s = stack
    s["stop"].touch()
    await async_wait_until(lambda: read_api(s, 0)["finished"], timeout=60, what="the task ended")
    with urllib.request.urlopen(task_url(s) + "/log.txt", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert r.headers["Content-Disposition"].startswith("attachment; filename=")
        text = r.read().decode()
    everything = whole_log(s, 1000)
    got = text.splitlines()
    assert len(got) == len(everything)
    for line, e in zip(got, everything, strict=True):
        assert line.endswith(e["message"]) or e["kind"] == "transition", line
    assert XSS in text  # as written: a text file, not a page
    # A mapped task's instance: its own log, by its index.
    inst = f"{s['base']}/api/v1/runs/{quote(s['run_id'], safe='')}/tasks/each/1/log"
    await async_wait_until(
        lambda: any(
            e["message"] == "item b of 2" for e in json.loads(http_get(inst)[1])["entries"]
        ),
        timeout=60,
        what="the mapped instance's line",
    )
    page_url = f"{s['base']}/runs/{quote(s['run_id'], safe='')}/tasks/each/1/log"
    status, html = http_get(page_url)
    assert status == 200 and "item b of 2" in html and "item a of 2" not in html
    status, text = http_get(page_url + ".txt")
    assert status == 200
    assert len(text.splitlines()) == len(json.loads(http_get(inst)[1])["entries"])
    assert "item b of 2" in text and "item a of 2" not in text
    status, body = http_get(inst.replace("/1/log", "/x/log"))
    assert status == 400 and json.loads(body)["field"] == "map_index"
    status, body = http_get(inst.replace("/1/log", "/7/log"))
    assert status == 404 and json.loads(body)["field"] == "task_id"
    # An unknown task: 404s everywhere, no traceback.
    status, body = http_get(f"{s['base']}/runs/{quote(s['run_id'], safe='')}/tasks/nope/log")
    assert status == 404 and "has no task" in body
    status, body = http_get(f"{s['base']}/runs/no-run/tasks/talk/log.txt")
    assert status == 404 and "There is no run" in body
    status, body = http_get(f"{s['base']}/api/v1/runs/no-run/tasks/talk/log")
    assert status == 404 and json.loads(body)["field"] == "run_id"
    status, body = http_get(api_url(s) + "?since=-1")
    assert status == 400 and json.loads(body)["field"] == "since"
    status, body = http_get(f"{s['base']}/api/v1/openapi.json")
    paths = json.loads(body)["paths"]
    assert "/api/v1/runs/{run_id}/tasks/{task_id}/log" in paths
    assert "/api/v1/runs/{run_id}/tasks/{task_id}/{map_index}/log" in paths
