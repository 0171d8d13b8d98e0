"""`slotless ui` tested live: the run list, a run's graph with a DEFERRED task, a task's log,
the DAGs page (schedules, runs as squares, broken files), 404s, a database it cannot open, a
port already taken; in headless Chromium (screenshots saved under test-artifacts/; a square
clicked through the DevTools protocol); and `slotless up` starting and stopping the stack
together."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from datetime import date
from html import escape
from pathlib import Path
from urllib.parse import quote

import pytest
from support.browser import HEADLESS, chromium, devtools
from support.exchanging import claim, complete
from support.helpers import (
    REPO,
    attempt_of,
    cli,
    cli_env,
    free_port,
    sql,
    start_cli,
    stop_process,
    write_dag,
)
from support.ops import (
    SETTLED,
    http_get,
    poll,
    settle_ops_run,
    ui_process,
    wait_for_http,
    write_ops_dag,
)

from executor.loader import load_dag
from executor.outcomes import Failed, Succeeded
from executor.store import open_store

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def live_ui(tmp_path_factory: pytest.TempPathFactory):
    """A database holding the ops run in every state, and `slotless ui` serving it."""
    tmp = tmp_path_factory.mktemp("web")
    db_path = tmp / "ops.db"
    url = f"sqlite:///{db_path}"
    dag_path, inbox = write_ops_dag(tmp)

    async def prepare() -> str:
        store = await open_store(url)
        try:
            return await settle_ops_run(store, dag_path)
        finally:
            await store.close()

    run_id = asyncio.run(prepare())
    with ui_process(url, tmp / "ui.log") as base:
        yield {"base": base, "run_id": run_id, "db": db_path, "inbox": inbox, "tmp": tmp}


def run_url(ui: dict) -> str:
    return f"{ui['base']}/runs/{quote(ui['run_id'], safe='')}"


def test_the_run_list(live_ui):
    status, html = http_get(live_ui["base"] + "/")
    assert status == 200
    run_id = live_ui["run_id"]
    assert f'href="/runs/{quote(run_id, safe="")}"' in html
    assert "st-RUNNING" in html and 'data-live="1"' in html  # a live run: it refreshes
    assert "Waiting tasks" in html
    assert f"file://{live_ui['inbox']}/ready.flag" in html  # what the deferred ones wait for
    assert "upstream API answered 503" in html  # why the retrying one retries


def test_a_runs_graph_shows_deferred_apart_from_retrying_and_failed(live_ui):
    status, html = http_get(run_url(live_ui))
    assert status == 200
    boxes = dict(re.findall(r'data-task="([^"]+)" data-state="([A-Z_]+)"', html))
    assert boxes == SETTLED  # one box per task, in the state the run settled in
    assert 'class="box st-DEFERRED"' in html and 'class="box st-RETRYING"' in html
    # The mapped task is one box, folded, with its instances counted.
    assert "mapped \u00d73" in html and "3\u2713" in html
    # Waiting is drawn dashed and cool, trouble heavy and warm: not the same style.
    rules = dict(re.findall(r"svg rect\.box\.st-([A-Z_]+) \{([^}]*)\}", html))
    assert "dasharray" in rules["DEFERRED"] and "dasharray" in rules["SENSING"]
    assert "dasharray" not in rules["RETRYING"] and "dasharray" not in rules["FAILED"]
    assert len({rules[s] for s in ("DEFERRED", "SENSING", "RETRYING", "FAILED")}) == 4


def test_a_deferred_tasks_page_shows_its_trigger_and_shared_check(live_ui):
    (row,) = sql(
        live_ui["db"],
        "SELECT g.* FROM task t JOIN trigger g ON g.id = t.trigger_id"
        " WHERE t.task_id = 'wait_for_file'",
    )
    status, html = http_get(run_url(live_ui) + "/tasks/wait_for_file")
    assert status == 200
    assert "Waiting in the triggerer" in html
    assert row["poke_hash"] in html
    assert "triggers.files.FileTrigger" in html
    assert f"file://{live_ui['inbox']}/ready.flag" in html
    assert "1 other task waits on the same check" in html
    assert "no live triggerer holds this shard" in html


def test_a_failed_tasks_log_has_its_traceback(live_ui):
    status, html = http_get(run_url(live_ui) + "/tasks/broken")
    assert status == 200
    tb = re.search(r'<pre class="tb">(.*?)</pre>', html, re.DOTALL)
    assert tb is not None
    assert "Traceback (most recent call last)" in tb.group(1)
    assert "KeyError: &#39;row 42&#39;" in tb.group(1)
    assert 'data-live="0"' in html  # a finished task does not refresh


def test_a_retrying_and_a_mapped_task(live_ui):
    status, html = http_get(run_url(live_ui) + "/tasks/flaky")
    assert status == 200
    assert "Retrying" in html and "attempt 1 of 4 failed: RuntimeError" in html
    status, html = http_get(run_url(live_ui) + "/tasks/shard")
    assert status == 200 and "Mapped instances (3)" in html
    assert f'href="/runs/{quote(live_ui["run_id"], safe="")}/tasks/shard/2"' in html
    status, html = http_get(run_url(live_ui) + "/tasks/shard/1")
    assert status == 200 and "shard[1]" in html and "shard 1 of 3" in html


def test_unknown_pages_are_404_pages(live_ui):
    base, run = live_ui["base"], run_url(live_ui)
    for url, says in [
        (f"{base}/runs/no-such-run", "There is no run &#39;no-such-run&#39;."),
        (f"{base}/runs/no-such-run/tasks/extract", "There is no run"),
        (f"{run}/tasks/nope", "has no task &#39;nope&#39;."),
        (f"{run}/tasks/shard/99", "has no task &#39;shard[99]&#39;."),
        # past 64 bits: no database integer holds it, so it is no instance (not a 500)
        (f"{run}/tasks/shard/{2**63}", f"There is no task instance &#39;{2**63}&#39;."),
        (f"{base}/nowhere", "There is no page &#39;/nowhere&#39;."),
    ]:
        status, html = http_get(url)
        assert status == 404, url
        assert says in html, (url, html[-600:])
        assert "<h1>Not found</h1>" in html


def test_it_is_read_only(live_ui):
    before = sql(live_ui["db"], "SELECT count(*) AS n FROM task_event")[0]["n"]
    for method in ("POST", "PUT", "DELETE"):
        req = urllib.request.Request(live_ui["base"] + "/", data=b"x", method=method)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 405
    status, body = http_get(live_ui["base"] + "/api/status")
    assert status == 200 and '"DEFERRED"' in body
    assert sql(live_ui["db"], "SELECT count(*) AS n FROM task_event")[0]["n"] == before


# -- the DAGs page ----------------------------------------------------------------------

NIGHTLY = """
from executor import DAG

dag = DAG("nightly", schedule="0 6 * * *", timezone="Europe/Paris")


@dag.task
def work(ctx):
    return 1
"""
WEEKLY = """
from executor import DAG

dag = DAG("weekly", schedule="@weekly")
"""
LANDING = """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG("landing", start_when=FileTrigger(path="/srv/inbox/*.csv"))


@dag.task
def load(ctx):
    return 1
"""
# Errors are user input on the page: they must come out as text, not markup.
BROKEN = 'raise RuntimeError("<b>boom</b> & co")\n'
# The squares' colours (assets.CSS), as the browser computes them.
SQUARE_RGB = {
    "SUCCESS": "rgb(67, 160, 71)",
    "FAILED": "rgb(229, 57, 53)",
    "RUNNING": "rgb(30, 136, 229)",
}


@pytest.fixture(scope="module")
def dags_ui(tmp_path_factory: pytest.TempPathFactory):
    """A catalogued folder: a scheduled DAG with three runs (SUCCESS, FAILED, RUNNING,
    oldest first), a paused DAG whose file broke after it was catalogued, a file that
    never parsed; and `slotless ui` serving them."""
    tmp = tmp_path_factory.mktemp("dags-web")
    url = f"sqlite:///{tmp / 'dags.db'}"
    folder = tmp / "dags"
    folder.mkdir()
    nightly = write_dag(folder, NIGHTLY, "nightly.py")
    weekly = write_dag(folder, WEEKLY, "weekly.py")
    write_dag(folder, BROKEN, "broken.py")
    write_dag(folder, LANDING, "landing.py")
    listing = ("dags", "list", "--db", url, "--dags", str(folder), "--parse-timeout", "10")
    listed = cli(*listing)
    assert listed.returncode == 0, listed.stderr
    write_dag(folder, WEEKLY + "raise ValueError('<i>typo</i>')\n", "weekly.py")
    os.utime(weekly, (1.0, 1.0))  # an mtime the catalogue has not seen: parsed again
    listed = cli(*listing, "--json")
    assert listed.returncode == 0, listed.stderr
    assert cli("dags", "pause", "weekly", "--db", url).returncode == 0
    runs = asyncio.run(_nightly_runs(url, nightly))
    with ui_process(url, tmp / "ui.log", ready="/dags") as base:
        yield {
            "base": base,
            "runs": runs,
            "folder": folder.resolve(),
            "tmp": tmp,
            "listed": json.loads(listed.stdout)["dags"],
        }


async def _nightly_runs(url: str, path: Path) -> list[tuple[str, str, str]]:
    """(run_id, logical date, state) of three runs: one succeeded, one failed, one running."""
    store = await open_store(url)
    try:
        dag = load_dag(str(path), None)
        runs = []
        for day, ending in ((1, "SUCCESS"), (2, "FAILED"), (3, "RUNNING")):
            run_id = await store.runs.create_run(dag, date(2026, 4, day), dag_file=str(path))
            if ending != "RUNNING":
                [row] = await claim(store, "test", 1)
                await complete(
                    store,
                    [
                        Succeeded(**attempt_of(row), output_json="1")
                        if ending == "SUCCESS"
                        else Failed(**attempt_of(row), message="boom")
                    ],
                )
            info = await store.views.run_info(run_id)
            assert info is not None and info["state"] == ending
            runs.append((run_id, f"2026-04-0{day}", ending))
        return runs
    finally:
        await store.close()


def test_the_dags_page_lists_each_dag_with_its_runs_and_the_broken_files(dags_ui):
    status, html = http_get(dags_ui["base"] + "/dags")
    assert status == 200
    assert '<a href="/dags">DAGs</a>' in html  # the nav links to it
    # One row, for the DAG the good file declares: schedule in words and as written, when
    # it runs next (as `slotless dags list` says), active, its runs oldest first.
    rows = dict(re.findall(r'<tr data-dag="([^"]+)"(.*?)</tr>', html, re.DOTALL))
    assert list(rows) == ["landing", "nightly", "weekly"]
    # A DAG started by a condition says what it waits for.
    assert 'when <span class="mono">file:///srv/inbox/*.csv</span>' in rows["landing"]
    row = rows["nightly"]
    assert "every day at 06:00 Europe/Paris" in row
    assert '<div class="mono muted">0 6 * * *</div>' in row  # as written, not as stored
    listed = {d["dag_id"]: d for d in dags_ui["listed"]}
    assert listed["nightly"]["next_run"]
    assert f"<td>{escape(listed['nightly']['next_run'])}</td>" in row
    assert '<span class="active">active</span>' in row
    squares = re.findall(r'<a class="sq st-([A-Z]+)" href="([^"]+)" title="([^"]+)"', row)
    assert squares == [
        (state, f"/runs/{quote(run_id, safe='')}", f"{day} \u00b7 {state}")
        for run_id, day, state in dags_ui["runs"]
    ]
    assert 'data-live="1"' in html  # a run is RUNNING: the page refreshes
    # A DAG whose file broke keeps its row, with the error on it.
    assert rows["weekly"].startswith(' class="broken">')
    assert '<span class="paused">paused</span>' in rows["weekly"]
    assert "file broken: " in rows["weekly"] and '<span class="empty">no runs yet' in rows["weekly"]
    # Both broken files, in the box at the top, their errors escaped.
    box = re.search(r'<div class="panel errors">(.*?)</ul></div>', html, re.DOTALL)
    assert box is not None and "2 broken DAG files</h2>" in box.group(1)
    files = re.findall(r'<li><span class="mono">([^<]+)</span>', box.group(1))
    assert files == [str(dags_ui["folder"] / name) for name in ("broken.py", "weekly.py")]
    assert "RuntimeError: &lt;b&gt;boom&lt;/b&gt; &amp; co" in box.group(1)
    assert rows["weekly"].count("ValueError: &lt;i&gt;typo&lt;/i&gt;") == 1
    assert "<b>boom" not in html and "<i>typo" not in html


# -- in a real browser -----------------------------------------------------------------


def browse(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [
            chromium(),
            *HEADLESS,
            f"--user-data-dir={profile}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_in_chromium_the_graph_shows_a_deferred_task(live_ui):
    tmp = live_ui["tmp"]
    done = browse(tmp, run_url(live_ui), "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-task="wait_for_file" data-state="DEFERRED"' in dom
    assert "<svg" in dom and "\u25f7 DEFERRED" in dom

    ARTIFACTS.mkdir(exist_ok=True)
    for name, url in [
        ("web-run-graph.png", run_url(live_ui)),
        ("web-runs.png", live_ui["base"] + "/"),
        ("web-task-deferred.png", run_url(live_ui) + "/tasks/wait_for_file"),
        ("web-task-failed.png", run_url(live_ui) + "/tasks/broken"),
    ]:
        shot = ARTIFACTS / name
        shot.unlink(missing_ok=True)
        done = browse(tmp, url, f"--screenshot={shot}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert shot.stat().st_size > 10_000
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with the dev extras
        return
    # DEFERRED boxes (lilac #e1bee7) and the RETRYING one (orange #ffe0b2) are on screen.
    with Image.open(ARTIFACTS / "web-run-graph.png") as img:
        colours = {c for _, c in img.convert("RGB").getcolors(1_000_000) or []}
    assert (0xE1, 0xBE, 0xE7) in colours
    assert (0xFF, 0xE0, 0xB2) in colours


async def test_in_chromium_the_dags_page_colours_runs_and_a_square_opens_its_run(dags_ui):
    tmp, base = dags_ui["tmp"], dags_ui["base"]
    async with devtools(tmp, base + "/dags") as page:
        squares = await page.eval_when(
            """(() => {
                const sq = [...document.querySelectorAll('tr[data-dag="nightly"] a.sq')];
                return sq.length && sq.map(a => [
                    a.className.replace('sq st-', ''), a.title,
                    getComputedStyle(a).backgroundColor]);
            })()""",
            "the nightly row's squares",
        )
        assert squares == [
            [state, f"{day} \u00b7 {state}", SQUARE_RGB[state]] for _, day, state in dags_ui["runs"]
        ]
        # The errors box is drawn at the top, above the table.
        assert await page.eval(
            "document.querySelector('.errors').getBoundingClientRect().bottom"
            " <= document.querySelector('table.dags').getBoundingClientRect().top"
        )
        run_id = next(r for r, _, state in dags_ui["runs"] if state == "FAILED")
        x, y = await page.eval(
            """(() => {
                const r = document.querySelector('a.sq.st-FAILED')
                    .getBoundingClientRect();
                return [r.x + r.width / 2, r.y + r.height / 2];
            })()"""
        )
        await page.click(x, y)
        path = f"/runs/{quote(run_id, safe='')}"
        assert (
            await page.eval_when(
                f"location.pathname === {json.dumps(path)} && document.readyState === 'complete'"
                " && document.querySelector('h1').textContent",
                "the run's page",
            )
            == f"{run_id} \u2717 FAILED"
        )

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "web-dags.png"
    shot.unlink(missing_ok=True)
    done = browse(tmp, base + "/dags", f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- starting it wrong ------------------------------------------------------------------


def test_a_database_it_cannot_open_is_one_line(tmp_path: Path):
    missing = tmp_path / "missing.db"
    done = cli("ui", "--db", f"sqlite:///{missing}", "--port", str(free_port()), timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"slotless: error: cannot open database sqlite:///{missing}: {missing} does not exist "
        "(a worker, `slotless run` or `slotless up` creates it)"
    ]
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database, just some bytes" * 100)
    done = cli("ui", "--db", f"sqlite:///{garbage}", "--port", str(free_port()), timeout=30)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"slotless: error: cannot open database sqlite:///{garbage}: ")
    assert not missing.exists()  # the page never creates a database


def test_a_port_already_taken(tmp_path: Path, db_path: Path, db_url: str):
    asyncio.run(_create(db_url))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("ui", "--db", db_url, "--port", str(port), timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"slotless: error: port {port} is already in use on 127.0.0.1 (pick another --port)"
    ]


async def _create(url: str) -> None:
    store = await open_store(url)
    await store.close()


# -- slotless up ------------------------------------------------------------------------

UP_DAG = """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG("up_demo")
wait = dag.sensor("wait", FileTrigger(path={flag!r}, poke_interval=0.1), timeout="1h")


@dag.task(parents=[wait])
def after(ctx):
    return "done"
"""


def test_up_runs_the_stack_and_stops_it_together(tmp_path: Path, db_path: Path, db_url: str):
    flag = tmp_path / "go.flag"
    dag_file = tmp_path / "up_dag.py"
    dag_file.write_text(textwrap.dedent(UP_DAG.format(flag=str(flag))))
    port, wport = free_port(), free_port()
    log = tmp_path / "up.log"
    up = start_cli(
        "up", str(dag_file), "--db", db_url, "--port", str(port),
        "--worker-metrics-port", str(wport), log=log,
    )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/", up, log)
        pids = poll(
            lambda: [int(p) for p in re.findall(r"\(pid (\d+)\)", log.read_text())],
            what="the three pids",
        )
        assert len(pids) == 3
        # The sensor defers (the triggerer holds it), the file lands, the run ends.
        poll(
            lambda: (
                sql(db_path, "SELECT state FROM task WHERE task_id = 'wait'")[0]["state"]
                == "DEFERRED"
            ),
            what="the sensor to defer",
        )
        poll(
            lambda: sql(db_path, "SELECT count(*) AS n FROM task_event WHERE kind = 'check'")[0][
                "n"
            ],
            what="the triggerer to check the missing file once",
        )
        flag.write_text("go")
        poll(
            lambda: sql(db_path, "SELECT state FROM dag_run")[0]["state"] == "SUCCESS",
            what="the run to succeed",
        )
        status, html = http_get(f"http://127.0.0.1:{port}/")
        assert status == 200 and "up_demo" in html
        # The sensor's log has the triggerer's checks and the event that ended the wait.
        (run_id,) = [r["run_id"] for r in sql(db_path, "SELECT run_id FROM dag_run")]
        status, html = http_get(f"http://127.0.0.1:{port}/runs/{quote(run_id, safe='')}/tasks/wait")
        assert status == 200
        assert re.search(r'<tr class="k-check"[^>]*>.*?checked file://\S*go\.flag: not yet', html)
        assert "trigger fired: file://" in html
        assert http_get(f"http://127.0.0.1:{wport}/metrics")[0] == 200
    finally:
        code = stop_process(up, signal.SIGINT)
    out = log.read_text()
    assert code == 0, out
    assert "slotless up: stopped" in out
    for pid in pids:
        assert not _alive(pid), f"pid {pid} still runs:\n{out}"


def _alive(pid: int) -> bool:
    from support.helpers import pid_alive

    return pid_alive(pid)


TICKING = """
from datetime import datetime, timedelta, timezone
from executor import DAG

dag = DAG("ticking", schedule=timedelta(seconds=2), catchup=False,
          start_date=datetime(2026, 1, 1, tzinfo=timezone.utc))


@dag.task
def tick(ctx):
    return ctx.data_interval_end.isoformat()
"""


def test_up_with_a_dags_folder_runs_its_schedules_parsed_once(tmp_path: Path, db_path: Path,
                                                             db_url: str):  # fmt: skip
    folder = tmp_path / "dags"
    folder.mkdir()
    write_dag(folder, TICKING, "ticking.py")
    log = tmp_path / "up.log"
    # $SLOTLESS_DAGS names the folder: the triggerer alone parses it, not the worker or page.
    env = cli_env(SLOTLESS_DAGS=str(folder))
    port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "slotless", "up", "--db", db_url, "--port", str(port),
         "--rescan", "0.5"],
        cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/", up, log)  # the schema is there, too
        poll(
            lambda: (
                sql(db_path, "SELECT count(*) AS n FROM dag_run WHERE state = 'SUCCESS'")[0]["n"]
                >= 2
            ),
            timeout=60,
            what="two scheduled runs, run by the worker",
        )
    finally:
        assert stop_process(up, signal.SIGINT) == 0, log.read_text()
    parsed = [line for line in log.read_text().splitlines() if "parsed 1 DAG file(s)" in line]
    assert parsed and all(line.startswith("[triggerer") for line in parsed), parsed
