"""Run policies with real worker and triggerer processes, on SQLite and on PostgreSQL (a
schema of its own): fail_fast with 100 running and deferred tasks, pause then resume from
the CLI to SUCCESS, a late file (noticed at expected_by, the sensor still succeeding when
the file lands), a deadline noticed once, a dagrun_timeout that cancels. Clocks are
shrunk: times of day a few seconds ahead, a timeout of seconds."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, date, datetime
from html import escape
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from support import backends
from support.exchanging import claim, complete
from support.helpers import (
    async_wait_until,
    attempt_of,
    cli,
    free_port,
    pid_alive,
    start_cli,
    start_worker,
    stop_process,
    write_dag,
)
from support.ops import http_get, wait_for_http
from support.receivers import HttpReceiver, SmtpReceiver, mail_text

from executor.loader import load_dag
from executor.outcomes import Failed
from executor.store import Store, open_store

pytestmark = pytest.mark.slow
backend, url = backends.backend, backends.url  # fixtures: SQLite, and PostgreSQL
pg_server = backends.pg_server  # fixture

FAIL_FAST = """
import os
import time
from pathlib import Path
from executor import DAG
from triggers.files import FileTrigger

GATE = Path({gate!r})
dag = DAG("ff", on_task_failure="fail_fast")
# Sensors first (they defer at once and give their slot back), then the long tasks and
# the one that breaks; the rest wait for a slot that never frees.
for i in range(88):
    dag.sensor(f"s{{i}}", FileTrigger(path=f"{{GATE}}/never-{{i}}", poke_interval=0.5),
               priority=10)


def slow(ctx):
    (GATE / f"pid-{{ctx.task_id}}").write_text(str(os.getpid()))
    while not (GATE / "open").exists():
        time.sleep(0.05)
    return 1


def breaker(ctx):
    while not (GATE / "break").exists():
        time.sleep(0.05)
    raise RuntimeError("the settlement file is corrupt")


for k in range(12):
    dag.task(slow, task_id=f"slow{{k}}", priority=5)
dag.task(breaker, task_id="breaker", priority=5)
for k in range(30):
    dag.task(slow, task_id=f"later{{k}}")
"""

PAUSE = """
from pathlib import Path
from executor import DAG

FIXED = Path({fixed!r})
dag = DAG("paused", on_task_failure="pause", notify={hook!r})


@dag.task
def extract(ctx):
    if not FIXED.exists():
        raise RuntimeError("the bank file is late")
    return 1


@dag.task(parents=[extract])
def load(ctx):
    return ctx.inputs["extract"] + 1


@dag.task
def report(ctx):
    return "r"
"""

TIMES = """
import time
from pathlib import Path
from executor import DAG
from triggers.files import FileTrigger

GATE = Path({gate!r})
dag = DAG("times", deadline={deadline!r}, dagrun_timeout={timeout!r},
          notify={{"late": [{mail!r}], "deadline_missed": [{hook!r}]}})
wait = dag.sensor("wait_for_file", FileTrigger(path=f"{{GATE}}/settlements.csv",
                  poke_interval=0.2), expected_by={expected_by!r}, timeout="60s")


@dag.task(parents=[wait])
def load(ctx):
    return 1
"""

SLOW = """
import os
import time
from pathlib import Path
from executor import DAG

GATE = Path({gate!r})
dag = DAG("slowrun", dagrun_timeout="3s")


@dag.task
def crunch(ctx):
    (GATE / "pid").write_text(str(os.getpid()))
    while not (GATE / "open").exists():
        time.sleep(0.05)
    return 1


@dag.task(parents=[crunch])
def after(ctx):
    return 2
"""


async def states_of(store: Store, run_id: str) -> dict[str, str]:
    return {r["task_id"]: r["state"] for r in await store.views.run_tasks(run_id)}


async def run_row(store: Store, run_id: str) -> dict:
    info = await store.views.run_info(run_id)
    assert info is not None
    return dict(info)


async def held(store: Store, n: int) -> bool:
    rows = await store.views.list_triggerers()
    return len(rows) == 1 and rows[0].triggers == n


def services(url: str, tmp_path: Path, *worker_args: str) -> list:
    return [
        start_worker(url, "--heartbeat-interval", "0.5", *worker_args, log=tmp_path / "w.log"),
        start_cli("triggerer", "--db", url, "--lease-ttl", "2", log=tmp_path / "t.log"),
    ]


async def new_run(store: Store, path: Path, dag_id: str, day: date | None = None) -> str:
    when = day or datetime.now(UTC).date()
    return await store.runs.create_run(load_dag(str(path), dag_id), when, dag_file=str(path))


async def events(store: Store, run_id: str, task_id: str, kind: str) -> list[dict]:
    return [dict(e) for e in await store.views.task_log(run_id, task_id) or [] if e["kind"] == kind]


async def test_fail_fast_with_100_running_and_deferred_tasks(url: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    path = write_dag(tmp_path, FAIL_FAST.format(gate=str(gate)), "ff.py")
    store = await open_store(url)
    procs = services(url, tmp_path, "--slots", "13", "--isolation", "process")
    try:
        run_id = await new_run(store, path, "ff")

        async def all_waiting() -> bool:
            states = list((await states_of(store, run_id)).values())
            pid_files = [gate / f"pid-slow{k}" for k in range(12)]
            started = all(f.exists() and f.read_text().strip() for f in pid_files)
            return states.count("DEFERRED") == 88 and states.count("RUNNING") == 13 and started

        await async_wait_until(all_waiting, 90, interval=0.2, what="88 deferred, 13 running")
        await async_wait_until(lambda: held(store, 88), 30, interval=0.1, what="88 waits held")
        pids = [int((gate / f"pid-slow{k}").read_text()) for k in range(12)]
        (gate / "break").touch()

        async def failed() -> bool:
            return (await run_row(store, run_id))["state"] == "FAILED"

        await async_wait_until(failed, 5, interval=0.05, what="the run FAILED by fail_fast")
        run = await run_row(store, run_id)
        assert run["state_reason"] == "fail_fast: breaker failed"
        states = await states_of(store, run_id)
        assert states["breaker"] == "FAILED"
        assert {states[f"s{i}"] for i in range(88)} == {"SKIPPED"}
        assert {states[f"slow{k}"] for k in range(12)} == {"FAILED"}  # stopped
        assert {states[f"later{k}"] for k in range(30)} == {"SKIPPED"}  # never started
        # Nothing started after the failure: no claim is logged after it.
        [failure] = [e for e in await events(store, run_id, "breaker", "transition")
                     if e["to_state"] == "FAILED"]  # fmt: skip
        async with store.db.read() as tx:
            rows = await tx.fetch("run_tasks", run_id=run_id)
            started_after = []
            for r in rows:
                for e in await tx.fetch("task_events", task_row=r["id"]):
                    if e["to_state"] == "RUNNING" and e["ts"] > failure["ts"]:
                        started_after.append(r["task_id"])
        assert started_after == []
        # Within seconds: the stopped attempts' processes are gone, the waits dropped.
        await async_wait_until(
            lambda: not any(pid_alive(p) for p in pids), 5, interval=0.05,
            what="the stopped attempts' processes gone",
        )  # fmt: skip
        await async_wait_until(lambda: held(store, 0), 5, interval=0.05, what="no wait held")
        assert all(
            s not in ("RUNNING", "PENDING") for s in (await states_of(store, run_id)).values()
        )
    finally:
        (gate / "open").touch()
        (gate / "break").touch()  # failed before the break: let the breaker end too
        for p in procs:
            stop_process(p)
        await store.close()


async def test_pause_then_resume_from_the_cli_to_success(
    url: str, tmp_path: Path, http_receiver: HttpReceiver
) -> None:
    fixed = tmp_path / "fixed"
    hook = http_receiver.json_url("paused")
    path = write_dag(tmp_path, PAUSE.format(fixed=str(fixed), hook=hook), "paused.py")
    store = await open_store(url)
    procs = services(url, tmp_path)
    try:
        run_id = await new_run(store, path, "paused")

        async def paused() -> bool:
            return (await run_row(store, run_id))["state"] == "PAUSED"

        await async_wait_until(paused, 30, interval=0.05, what="the run PAUSED")
        # Someone is told, with why (a bare notify= URL gets the alerts: a pause is one).
        [told] = http_receiver.wait_for(1, lambda r: "run paused" in r.json["title"])
        assert "extract failed (on_task_failure=pause)" in told.json["message"]
        assert (await states_of(store, run_id))["load"] == "PENDING"  # held, not upstream-failed
        status = cli("status", "--db", url, "--json")
        assert status.returncode == 0, status.stderr
        [need] = json.loads(status.stdout)["attention"]
        assert need["run_id"] == run_id and "extract failed" in need["why"]
        assert f"slotless resume {run_id}" in need["todo"]

        fixed.touch()
        out = cli("resume", run_id, "--db", url, "--reason", "bank file landed")
        assert out.returncode == 0, out.stderr
        assert "resumed; cleared extract" in out.stdout

        async def succeeded() -> bool:
            return (await run_row(store, run_id))["state"] == "SUCCESS"

        await async_wait_until(succeeded, 30, interval=0.05, what="the run SUCCESS")
        assert set((await states_of(store, run_id)).values()) == {"SUCCESS"}
        again = cli("resume", run_id, "--db", url)
        assert again.returncode == 2 and "not PAUSED" in again.stderr
    finally:
        for p in procs:
            stop_process(p)
        await store.close()


def clock_in(seconds: float) -> tuple[str, date]:
    """A time of day ``seconds`` from now (UTC), and the date it falls on."""
    at = datetime.fromtimestamp(datetime.now(UTC).timestamp() + seconds, UTC)
    return at.strftime("%H:%M:%S"), at.date()


async def test_a_late_file_is_noticed_at_expected_by_and_the_sensor_still_succeeds(
    url: str, tmp_path: Path, smtp_receiver: SmtpReceiver, http_receiver: HttpReceiver
) -> None:
    """The "late" mail arrives at expected_by (a real SMTP server), the deadline's notice
    once (a real HTTP receiver), and the sensor succeeds when the file lands after both."""
    gate = tmp_path / "gate"
    gate.mkdir()
    expected_by, day = clock_in(4)
    deadline, _ = clock_in(6)
    source = TIMES.format(
        gate=str(gate), deadline=deadline, timeout="1h", expected_by=expected_by,
        mail=smtp_receiver.mailto_url(), hook=http_receiver.json_url("deadline"),
    )  # fmt: skip
    path = write_dag(tmp_path, source, "times.py")
    store = await open_store(url)
    procs = services(url, tmp_path)
    try:
        run_id = await new_run(store, path, "times", day)
        run = await run_row(store, run_id)
        late_at = json.loads(run["late_at"])["wait_for_file"]

        async def late() -> list[dict]:
            return await events(store, run_id, "wait_for_file", "late")

        [notice] = await async_wait_until(late, 30, interval=0.1, what="the late notice")
        assert notice["ts"] >= late_at
        assert "it keeps waiting until its timeout" in notice["message"]
        [mail] = await asyncio.to_thread(smtp_receiver.wait_for, 1, 60)
        assert time.time() >= late_at
        text = mail_text(mail)
        assert "wait_for_file" in text and "late" in text and "expected_by" in text

        async def still_waiting() -> bool:
            # Its first check may still be running on a worker on a loaded machine.
            return (await states_of(store, run_id))["wait_for_file"] == "DEFERRED"

        await async_wait_until(still_waiting, 30, interval=0.1, what="the sensor deferred")

        async def missed() -> bool:
            return (await run_row(store, run_id))["deadline_missed_at"] is not None

        await async_wait_until(missed, 30, interval=0.1, what="the deadline noticed")
        run = await run_row(store, run_id)
        assert run["deadline_missed_at"] >= run["deadline_at"] and run["state"] == "RUNNING"
        await asyncio.to_thread(http_receiver.wait_for, 1, None, 60)

        (gate / "settlements.csv").write_text("merchant,amount\n")

        async def succeeded() -> bool:
            return (await run_row(store, run_id))["state"] == "SUCCESS"

        await async_wait_until(succeeded, 30, interval=0.1, what="the run SUCCESS")
        # Once each: the waits fired once and are gone, each notice delivered and done.
        assert len(await late()) == 1
        async with store.db.read() as tx:
            assert await tx.fetch("run_waits_of", run_id=run_id) == []

        async def delivered() -> list[str]:
            rows = await store.callbacks.run_callbacks(run_id)
            done = all(r["state"] == "DONE" for r in rows)
            return sorted(r["event"] for r in rows) if done else []

        events_sent = await async_wait_until(delivered, 30, interval=0.1, what="notices done")
        assert events_sent == ["deadline_missed", "late"]
        assert len(smtp_receiver.messages) == 1 and len(http_receiver.received) == 1
    finally:
        for p in procs:
            stop_process(p)
        await store.close()


async def test_dagrun_timeout_cancels_the_run_with_its_reason(url: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    path = write_dag(tmp_path, SLOW.format(gate=str(gate)), "slow.py")
    store = await open_store(url)
    procs = services(url, tmp_path, "--isolation", "process")
    try:
        # The 3 s count from the run's creation: on a loaded machine a worker still starting
        # would let them pass before crunch runs (then it is SKIPPED, not killed).
        await async_wait_until(
            lambda: store.exchange.other_workers(""), 30, interval=0.05, what="a worker up"
        )
        run_id = await new_run(store, path, "slowrun")

        async def cancelled() -> bool:
            return (await run_row(store, run_id))["state"] == "CANCELLED"

        await async_wait_until(cancelled, 30, interval=0.05, what="the run CANCELLED")
        run = await run_row(store, run_id)
        assert run["state_reason"] == "cancelled by dagrun_timeout: the run did not end within 3s"
        assert run["ended_at"] - run["created_at"] >= 3
        assert await states_of(store, run_id) == {"crunch": "FAILED", "after": "SKIPPED"}
        pid = int((gate / "pid").read_text())
        await async_wait_until(lambda: not pid_alive(pid), 5, interval=0.05, what="crunch killed")
    finally:
        (gate / "open").touch()
        for p in procs:
            stop_process(p)
        await store.close()


async def test_the_web_page_shows_a_paused_run_as_needing_attention_and_resumes_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    fixed = tmp_path / "fixed"
    path = write_dag(tmp_path, PAUSE.format(fixed=str(fixed), hook="json://127.0.0.1:9/x"),
                     "paused.py")  # fmt: skip
    store = await open_store(url)
    run_id = await new_run(store, path, "paused")
    for row in await claim(store, "test", 5):
        await complete(store, [Failed(**attempt_of(row), message="the bank file is late")])
    assert (await run_row(store, run_id))["state"] == "PAUSED"
    await store.close()
    port = free_port()
    log = tmp_path / "ui.log"
    proc = start_cli("ui", "--db", url, "--port", str(port), "--token", "s3cret", log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base + "/", proc, log)
        status, html = http_get(base + "/")
        assert status == 200 and "Needs attention" in html
        assert escape(f"slotless resume {run_id}") in html and "st-PAUSED" in html
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            async with http.post(base + "/login", data={"token": "s3cret", "back": "/"}) as r:
                assert r.status == 200
            async with http.get(base + f"/runs/{quote(run_id, safe='')}") as r:
                page = await r.text()
            assert 'class="attention"' in page and "extract failed (on_task_failure=pause)" in page
            form = re.search(r'action="/actions/resume">(.*?)</form>', page, re.S)
            assert form is not None, "no resume button"
            fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', form.group(1)))
            fixed.touch()
            async with http.post(base + "/actions/resume", data=fields) as r:
                assert r.status == 200, await r.text()
        info = json.loads(cli("status", "--db", url, "--json").stdout)
        assert info["attention"] == [] and info["runs"][0]["state"] == "RUNNING"
        assert info["runs"][0]["reason"].startswith("resumed by ")
    finally:
        assert stop_process(proc) == 0, log.read_text()
