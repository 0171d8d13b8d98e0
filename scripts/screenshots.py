"""Screenshots of every page of the web UI, for README.md and docs/operations.md.

    .venv/bin/python scripts/screenshots.py            # writes docs/images/web-*.png

It builds a demo database in /tmp/slotless-demo (made afresh), opened by a relative path
(``sqlite:///demo.db``, which the page's header prints), from copies of the DAGs in
examples/ plus a few written here (an hourly DAG with params, two DAGs waiting on the
settlement file), and drives real processes on it, each started in that folder: ``slotless
ui`` with tokens, ``slotless worker`` and ``slotless triggerer --dags dags``. History is
made by the processes themselves (schedules caught up, sensors deferred, a task retried, a
run failed) and by writes over HTTP as a signed-in person would make them (pause, the
trigger form, retry, an event, a refused write), so the audit list has rows. Then headless
Chromium, driven over the DevTools protocol as tests/support/browser.py does, signs in and
captures each page at 1280 px wide.

Everything waits on a condition with a deadline; nothing sleeps blindly. Needs Chromium
(tests/support/browser.py finds it) and the dev install (``make .venv/.installed``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the DevTools driver and helpers the tests use

from support.browser import DevTools, devtools  # noqa: E402
from support.helpers import free_port, wait_until  # noqa: E402

IMAGES = REPO / "docs" / "images"
DB = "sqlite:///demo.db"  # relative: the header shows it, and no path of this machine
ADMIN = "SECRET"
VIEWER = "VIEWSECRET"
TOKENS = f"alice:admin:{ADMIN},viv:viewer:{VIEWER}"
WIDTH = 1280
STOP_BEFORE = "Pools and queues"  # the front page's last sections: empty in the demo
MARKER = ".slotless-screenshots"
DEADLINE = 240.0  # seconds for any one condition: the machine may be busy

# An hourly DAG caught up over the last hours: a mapped task, a task that fails its first
# attempt in every third hour and succeeds on its retry, and a publish step that fails in
# two of the hours (one of them fixed and retried from the page later).
WAREHOUSE = '''"""Every hour, copy the hour's orders into the warehouse (a demo of
scripts/screenshots.py)."""

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from executor import DAG

FAIL_HOURS = {fail_hours!r}


class Params(BaseModel):
    target: Literal["warehouse", "lake"] = Field("warehouse", description="where the rows go")
    batch_size: int = Field(5000, ge=100, le=100_000, description="rows per INSERT")
    full_refresh: bool = Field(False, description="reload the whole day, not the hour")
    tables: list[str] = ["orders", "payments", "refunds"]


dag = DAG(
    "warehouse_sync",
    schedule="@hourly",
    start_date=datetime({start.year}, {start.month}, {start.day}, {start.hour}),
    catchup=True,
    params=Params,
    description="orders of the hour -> warehouse",
)


def hour_of(ctx):
    """A scheduled run's hour; a run by hand copies the hour it was started in."""
    if ctx.data_interval_start is not None:
        return ctx.data_interval_start, ctx.data_interval_end
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    return now, now + timedelta(hours=1)


@dag.task
def extract(ctx):
    start, end = hour_of(ctx)
    time.sleep(0.2 + (start.hour % 4) * 0.15)
    ctx.log(f"orders from {{start:%H:%M}} to {{end:%H:%M}} UTC: 4 partitions")
    return ["eu-1", "eu-2", "us-1", "ap-1"]


@dag.task(expand=extract)
def load_partition(ctx):
    time.sleep(0.1 + 0.1 * ctx.index)
    ctx.log(f"partition {{ctx.item}}: batches of {{ctx.params.batch_size}} rows")
    return {{"partition": ctx.item, "rows": 1000 + 250 * ctx.index}}


# Every third hour the quota API is slow: the first attempt passes its timeout, the
# retry succeeds. (A timeout, not an exception: a traceback would print this machine's paths.)
@dag.task(parents=[load_partition], retries=2, retry_delay="2s", execution_timeout="1s")
def check_quota(ctx):
    if hour_of(ctx)[0].hour % 3 == 0 and ctx.attempt == 1:
        ctx.log("asking the quota API ...")
        time.sleep(1.5)
    ctx.log("quota: 61% of the day used")
    return {{"used": 0.61}}


@dag.task(parents=[check_quota])
def publish(ctx):
    hour = hour_of(ctx)[0].strftime("%H")
    if hour in FAIL_HOURS and not Path(f"demo-data/warehouse/fixed-{{hour}}").exists():
        raise ValueError(f"orders_{{hour}} has 12 rows with a NULL merchant_id")
    time.sleep(0.3)
    return f"published orders_{{hour}}"
'''

# Two DAGs that wait on the day's settlement file: their sensors share one check.
RECONCILE = '''"""Match the bank's settlement file against the ledger (a demo of
scripts/screenshots.py)."""

from executor import DAG
from triggers.files import FileTrigger

dag = DAG("reconcile", schedule="@daily", catchup=False)

settlement_file = dag.sensor(
    "settlement_file",
    FileTrigger(path="demo-data/settlements/{{ ds }}.csv", poke_interval=30),
    mode="deferrable",
    timeout="14h",
)


@dag.task(parents=[settlement_file])
def match(ctx):
    return "matched"
'''

FEES = '''"""The day's fee report, once the settlement file and the FX rates are in (a demo of
scripts/screenshots.py)."""

from executor import DAG
from triggers.files import FileTrigger

dag = DAG("fees_report", schedule="@daily", catchup=False)

settlement_file = dag.sensor(
    "settlement_file",
    FileTrigger(path="demo-data/settlements/{{ ds }}.csv", poke_interval=60),
    mode="deferrable",
    timeout="14h",
)
fx_rates = dag.sensor(
    "fx_rates",
    FileTrigger(path="demo-data/fx/{{ ds }}.json", poke_interval=60),
    mode="deferrable",
    timeout="12h",
)


@dag.task(parents=[settlement_file, fx_rates])
def report(ctx):
    return "sent"
'''

# page name -> (path, or a key filled in once the runs exist; the most height to capture)
# (the waits page is wider: at 1280 px its table scrolls beside the triggerers' sidebar;
# the front page stops before its pools, so that no section is cut in half)
PAGES: list[tuple[str, str, int, int]] = [
    ("index", "/", WIDTH, 1400),
    ("dags", "/dags", WIDTH, 900),
    ("dag", "/dags/warehouse_sync", WIDTH, 1300),
    ("runs", "/runs", WIDTH, 900),
    ("run", "{run}", WIDTH, 900),
    ("gantt", "{gantt}/gantt", WIDTH, 900),
    ("task", "{gantt}/tasks/check_quota", WIDTH, 1300),
    ("task-wait", "{wait}/tasks/settlement_file", WIDTH, 1000),
    ("trigger", "/dags/warehouse_sync/trigger", WIDTH, 900),
    ("waits", "/waits", 1600, 900),
    ("needs-you", "/needs-you", WIDTH, 900),
    ("audit", "/audit", WIDTH, 900),
]


def say(line: str) -> None:
    print(f"screenshots: {line}", file=sys.stderr, flush=True)


def expect(holds: bool, *told: Any) -> None:
    """Stop the script, saying what was seen, unless ``holds``."""
    if not holds:
        raise SystemExit(f"screenshots: unexpected answer: {told}")


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    """``predicate``'s value once truthy; stops the script naming ``what`` after ``timeout`` s."""
    try:
        return wait_until(predicate, timeout, interval=0.25, what=what)
    except AssertionError as exc:  # the tests' failure: here, one line and a non-zero exit
        raise SystemExit(f"screenshots: {exc}") from None


def rows(query: str, *args: Any) -> list[dict[str, Any]]:
    """A read of the demo database (the current directory's demo.db)."""
    conn = sqlite3.connect("demo.db", timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(query, args).fetchall()]
    except sqlite3.OperationalError:  # no such table yet: the processes are starting
        return []
    finally:
        conn.close()


def run_states(dag_id: str) -> dict[str, str]:
    found = rows("SELECT run_id, state FROM dag_run WHERE dag_id = ?", dag_id)
    return {r["run_id"]: r["state"] for r in found}


def task_state(run_id: str, task_id: str) -> str | None:
    found = rows(
        "SELECT state FROM task WHERE run_id = ? AND task_id = ? AND map_index = -1",
        run_id,
        task_id,
    )
    return found[0]["state"] if found else None


def write_dags(folder: Path, now: datetime) -> tuple[datetime, list[str]]:
    """The demo's DAG folder: copies of examples/ (their inboxes made relative, so that no
    path of this machine shows) and the three DAGs above."""
    folder.mkdir()
    copies = {
        "settlements.py": ('.resolve() / "settlements"', ' / "settlements"'),
        "dags/on_file.py": ('Path("demo-data/inbox").resolve()', 'Path("demo-data/inbox")'),
        "dags/approval_gate.py": None,
        "dags/partner_callback.py": None,
        "dags/minutely_report.py": None,
    }
    for name, change in copies.items():
        text = (REPO / "examples" / name).read_text()
        if change is not None:
            old, new = change
            if text.count(old) != 1:
                raise SystemExit(f"screenshots: examples/{name} changed; update write_dags")
            text = text.replace(old, new)
        (folder / Path(name).name).write_text(text)
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=8)
    fail_hours = [f"{(start + timedelta(hours=h)).hour:02d}" for h in (2, 5)]
    (folder / "warehouse_sync.py").write_text(
        WAREHOUSE.format(start=start, fail_hours=set(fail_hours))
    )
    (folder / "reconcile.py").write_text(RECONCILE)
    (folder / "fees_report.py").write_text(FEES)
    return start, fail_hours


async def settlement_history(today: date) -> list[str]:
    """Two past runs of the settlements example, made by the store's API (its worker runs
    them: its own bank stand-in drops the file, the sensor defers, 1,247 merchants)."""
    from executor.loader import load_dag
    from executor.store import open_store

    store = await open_store(DB)
    try:
        dag = load_dag("dags/settlements.py", None)
        return [
            await store.runs.create_run(
                dag, today - timedelta(days=d), dag_file="dags/settlements.py"
            )
            for d in (3, 2)
        ]
    finally:
        await store.close()


def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    out = log.open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "slotless", *args], stdout=out, stderr=subprocess.STDOUT, env=env
    )


def stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for name, proc in procs.items():
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            say(f"{name} did not stop in 30 s; killed")
            proc.kill()
            proc.wait(5)


# -- writes over HTTP, as a person signed in on the page makes them -------------------------


def hidden_fields(html: str, action: str, **match: str) -> dict[str, str]:
    """The hidden fields of the first form posting to ``action`` whose fields hold ``match``."""
    for target, body in re.findall(r'<form [^>]*action="([^"]+)"[^>]*>(.*?)</form>', html, re.S):
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', body))
        if target == action and all(fields.get(k) == v for k, v in match.items()):
            return fields
    raise SystemExit(f"screenshots: no form posting to {action} with {match}")


async def writes(base: str, failed_run: str, fixed_hour: str, yesterday: date) -> str:
    """Alice (admin) pauses the minutely DAG, triggers the hourly one with the params form,
    fixes and retries a failed run and sends an event; Viv (a viewer) tries to trigger and
    is refused. Returns the triggered run's id."""
    jar = aiohttp.CookieJar(unsafe=True)  # keep 127.0.0.1's cookies, as a browser does
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(base + "/login", data={"token": ADMIN, "back": "/dags"}) as r:
            html = await r.text()
            expect(r.status == 200 and "signed in" in html, (r.status, html[-500:]))
        fields = hidden_fields(html, "/actions/pause", dag_id="minutely_report")
        async with http.post(base + "/actions/pause", data=fields) as r:
            expect(r.status == 200, await r.text())

        form = base + "/dags/warehouse_sync/trigger"
        async with http.get(form) as r:
            html = await r.text()
        csrf = re.findall(
            r'name="csrf" value="([0-9a-f]+)"', html[html.index('id="params-form"') :]
        )
        data = {
            "csrf": csrf[0],
            "mode": "fields",
            "p:target": '"lake"',
            "p:batch_size": "20000",
            "p:full_refresh": "1",
            "p:tables": '["orders", "refunds"]',
        }
        async with http.post(form, data=data, allow_redirects=False) as r:
            expect(r.status == 303, (r.status, await r.text()))
            triggered = r.headers["Location"].removeprefix("/runs/")

        Path("demo-data/warehouse").mkdir(parents=True, exist_ok=True)
        Path(f"demo-data/warehouse/fixed-{fixed_hour}").write_text("NULL merchant ids mapped\n")
        async with http.get(f"{base}/runs/{quote(failed_run, safe='')}") as r:
            html = await r.text()
        fields = hidden_fields(html, "/actions/retry")
        async with http.post(base + "/actions/retry", data=fields) as r:
            expect(r.status == 200, await r.text())

        payload = {
            "partner": "acme",
            "date": yesterday.isoformat(),
            "url": f"s3://acme/exports/{yesterday}.csv",
        }
        async with http.post(
            base + "/api/v1/events",
            json={"name": "export.ready", "payload": payload},
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as r:
            expect(r.status < 300, await r.text())
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            base + "/api/v1/dags/warehouse_sync/runs",
            json={"conf": {"full_refresh": True}},
            headers={"Authorization": f"Bearer {VIEWER}"},
        ) as r,
    ):
        expect(r.status == 403, r.status, await r.text())
    return unquote(triggered)


# -- the screenshots -------------------------------------------------------------------------


async def capture(page: DevTools, url: str, out: Path, width: int, most: int) -> None:
    """``url`` at ``width`` px, as tall as its content up to ``most`` px (and 300 at least)."""

    async def window(height: int) -> None:
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    await window(300)  # short, so that the page's height is its content's
    await page.send("Page.navigate", url=url)
    await page.eval_when(
        f"document.readyState === 'complete' && location.href === {json.dumps(url)}",
        f"{url} loaded",
    )
    height = int(await page.eval("document.documentElement.scrollHeight"))
    stop = await page.eval(
        "(() => { const h = [...document.querySelectorAll('h2')]"
        f".find(e => e.textContent.startsWith({json.dumps(STOP_BEFORE)}));"
        " return h ? Math.floor(h.getBoundingClientRect().top) - 8 : null; })()"
    )
    height = max(300, min(stop or height, height, most))
    await window(height)
    await page.eval("window.scrollTo(0, 0)")
    shot = await page.send("Page.captureScreenshot", format="png")
    png = base64.b64decode(shot["data"])
    out.write_bytes(small(png))
    say(f"{out.relative_to(REPO)}: {out.stat().st_size // 1024} KB, {width}x{height}")


def small(png: bytes) -> bytes:
    """The PNG re-encoded with at most 256 colours when Pillow is there (the pages are flat
    colours and text: 3-5 times smaller, no visible change); as taken otherwise."""
    try:
        from PIL import Image
    except ImportError:
        return png
    image = Image.open(io.BytesIO(png)).convert("RGB")
    out = io.BytesIO()
    image.quantize(256, method=Image.Quantize.MEDIANCUT).save(out, "PNG", optimize=True)
    return out.getvalue() if out.tell() < len(png) else png


async def screenshots(base: str, tmp: Path, paths: dict[str, str]) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    async with devtools(tmp, f"{base}/login?back=/") as page:
        await page.eval_when("!!document.querySelector('form.login input[name=token]')", "login")
        await page.eval(
            "document.querySelector('form.login input[name=token]').value = "
            f"{json.dumps(ADMIN)}; document.querySelector('form.login').submit()"
        )
        await page.eval_when(
            "location.pathname === '/' && document.readyState === 'complete'", "signed in"
        )
        for name, path, width, most in PAGES:
            url = base + path.format(**paths)
            await capture(page, url, IMAGES / f"web-{name}.png", width, most)


def demo_folder() -> Path:
    """A fresh /tmp/slotless-demo. The pages show the DAG files' resolved paths (and the
    waits page a watched folder's), so a fixed, plain folder keeps the images the same from
    one run to the next and names nothing of the machine. A folder of that name this script
    did not make is left alone."""
    folder = Path(tempfile.gettempdir()) / "slotless-demo"
    if folder.exists():
        if not (folder / MARKER).exists():
            raise SystemExit(f"screenshots: {folder} exists and is not this script's; move it")
        shutil.rmtree(folder)
    folder.mkdir()
    (folder / MARKER).write_text("made by scripts/screenshots.py; removed by its next run\n")
    return folder


def main() -> int:
    tmp = demo_folder()
    here = os.getcwd()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        os.chdir(tmp)  # every process opens demo.db and demo-data/ relative to it
        now = datetime.now(UTC)
        today = now.date()
        yesterday = today - timedelta(days=1)
        _, fail_hours = write_dags(Path("dags"), now)
        Path("demo-data/inbox").mkdir(parents=True)
        Path("demo-data/fx").mkdir(parents=True)
        settlements = asyncio.run(settlement_history(today))

        env = {k: v for k, v in os.environ.items() if k not in ("SLOTLESS_DB", "SLOTLESS_DAGS")}
        env["PYTHONPATH"] = str(REPO)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        procs["ui"] = start(
            ["ui", "--db", DB, "--port", str(port), "--token", TOKENS, "--refresh", "60"],
            tmp / "ui.log",
            env,
        )
        procs["worker"] = start(["worker", "--db", DB, "--slots", "8"], tmp / "worker.log", env)
        procs["triggerer"] = start(
            ["triggerer", "--db", DB, "--dags", "dags", "--rescan", "2"], tmp / "triggerer.log", env
        )

        def alive() -> None:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise SystemExit(
                        f"screenshots: {name} exited with {proc.returncode}:\n"
                        + (tmp / f"{name}.log").read_text()[-3000:]
                    )

        def checked(predicate: Callable[[], Any]) -> Callable[[], Any]:
            def check() -> Any:
                alive()
                return predicate()

            return check

        say(f"demo in {tmp}: waiting for the schedules, the sensors and the runs")
        wait_for(
            checked(
                lambda: all(run_states("settlements").get(r) == "SUCCESS" for r in settlements)
            ),
            "the two settlement runs to succeed",
        )
        # An on_file run: a file dropped into the inbox starts it.
        Path("demo-data/inbox/orders-0412.csv").write_text("order,amount\n0412,1999\n")
        hourly = wait_for(
            checked(
                lambda: (
                    (s := run_states("warehouse_sync"))
                    and len(s) >= 8
                    and all(v in ("SUCCESS", "FAILED") for v in s.values())
                    and s
                )
            ),
            "the hourly DAG's eight runs to end",
        )
        failed = sorted(r for r, s in hourly.items() if s == "FAILED")
        retried = [
            r
            for r in hourly
            if rows(
                "SELECT 1 FROM task WHERE run_id = ? AND task_id = 'check_quota' AND attempt > 1",
                r,
            )
        ]
        if len(failed) != 2 or not retried:
            raise SystemExit(f"screenshots: unexpected hourly runs: {hourly}")
        waiting = wait_for(
            checked(
                lambda: [
                    r["run_id"]
                    for r in rows("SELECT run_id FROM dag_run WHERE dag_id = 'reconcile'")
                    if task_state(r["run_id"], "settlement_file") == "DEFERRED"
                ]
            ),
            "reconcile's sensor to defer",
        )
        wait_for(
            checked(
                lambda: rows(
                    "SELECT 1 FROM task t JOIN dag_run r ON r.run_id = t.run_id"
                    " WHERE r.dag_id = 'fees_report' AND t.state = 'DEFERRED'"
                )
            ),
            "fees_report's sensors to defer",
        )
        wait_for(
            checked(
                lambda: rows(
                    "SELECT 1 FROM task t JOIN dag_run r ON r.run_id = t.run_id"
                    " WHERE r.dag_id = 'approval_gate' AND t.task_id = 'sign_off'"
                    " AND t.state = 'DEFERRED'"
                )
            ),
            "the approval to wait for a person",
        )
        wait_for(
            checked(
                lambda: rows(
                    "SELECT 1 FROM task t JOIN dag_run r ON r.run_id = t.run_id"
                    " WHERE r.dag_id = 'partner_callback' AND t.state = 'DEFERRED'"
                )
            ),
            "the partner callback to wait for its event",
        )
        wait_for(checked(lambda: run_states("on_file")), "the inbox file to start a run")

        fixed_run = failed[-1]
        fixed_hour = fixed_run.split("T")[1][:2] if "T" in fixed_run else fail_hours[1]
        triggered = asyncio.run(writes(base, fixed_run, fixed_hour, yesterday))
        wait_for(
            checked(
                lambda: (
                    run_states("warehouse_sync").get(triggered) == "SUCCESS"
                    and run_states("warehouse_sync").get(fixed_run) == "SUCCESS"
                    and all(s == "SUCCESS" for s in run_states("partner_callback").values())
                )
            ),
            "the triggered and the retried runs, and the partner's, to succeed",
        )
        # The triggerer writes a sample of its loop every 30 s: two make a line.
        wait_for(
            checked(lambda: len(rows("SELECT 1 FROM triggerer_sample")) >= 2),
            "two triggerer samples",
        )
        paths = {
            "run": "/runs/" + quote(triggered, safe=""),
            "gantt": "/runs/" + quote(sorted(retried)[-1], safe=""),
            "wait": "/runs/" + quote(waiting[0], safe=""),
        }
        asyncio.run(screenshots(base, tmp, paths))
        say("done")
        return 0
    finally:
        stop(procs)
        os.chdir(here)
        if os.environ.get("KEEP_DEMO"):
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
