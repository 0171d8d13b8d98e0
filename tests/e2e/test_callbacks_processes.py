"""Callbacks and notifications with real worker processes, on SQLite and PostgreSQL.

* A task failing with retries=2 makes 2 on_retry calls and 1 on_failure call, each
  delivered exactly once to a real HTTP receiver, although the worker delivering
  on_failure is SIGKILLed in the middle of it: a second worker takes the row back and
  delivers it.
* A callback that raises, one that hangs past callback_timeout, and a notification to a
  target nobody listens on: each is retried with backoff, then logged in its task's log;
  the tasks' outcomes are unchanged and the worker serves the rest of the run. The
  notifications that can be delivered arrive, as JSON (json://) and as mail (mailto://,
  a real aiosmtpd server).
"""

from __future__ import annotations

import signal
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from support import backends
from support.helpers import async_wait_until, cli, start_worker, stop_process, write_dag
from support.receivers import HttpReceiver, SmtpReceiver, mail_text, unreachable_url

from executor.loader import load_dag
from executor.store import Store, open_store

pytestmark = pytest.mark.slow
backend, url = backends.backend, backends.url  # fixtures
pg_server = backends.pg_server  # fixture

# A stale-after of seconds, not minutes, so the killed worker's row comes back quickly; but
# not so short that a live worker's heartbeat, late on a loaded 2-core machine, reads as a
# death: that takes back a row whose handler already ran, and at-least-once shows as twice.
FAST = ("--poll-interval", "0.05", "--heartbeat-interval", "0.3", "--stale-after", "6")

KILL_DAG = """
import json
import os
import time
import urllib.request
from pathlib import Path

from executor import DAG

RECEIVER = {receiver!r}
MARKS = Path({marks!r})


def post(ctx):
    if ctx.event == "on_failure" and not (MARKS / "on_failure-started").exists():
        (MARKS / "on_failure-started").write_text(str(os.getpid()))
        time.sleep(120)  # the worker is SIGKILLed in here, before anything was sent
    body = {{
        "event": ctx.event,
        "task": ctx.task_id,
        "attempt": ctx.attempt,
        "error": ctx.error,
        "tail": ctx.log_tail,
        "run": ctx.run_id,
        "pid": os.getpid(),
    }}
    req = urllib.request.Request(
        RECEIVER + "/callback",
        data=json.dumps(body).encode(),
        headers={{"Content-Type": "application/json"}},
    )
    urllib.request.urlopen(req, timeout=10).read()


dag = DAG("callbacks_killed", on_retry=post, callback_timeout=300)


@dag.task(retries=2, retry_delay=0, on_failure=post)
def flaky(ctx):
    ctx.log(f"attempt {{ctx.attempt}} starts")
    raise RuntimeError(f"boom {{ctx.attempt}}")
"""


async def create_run(db_url: str, dag_file: Path) -> str:
    store = await open_store(db_url)
    try:
        return await store.runs.create_run(
            load_dag(dag_file), date(2026, 6, 1), dag_file=str(dag_file)
        )
    finally:
        await store.close()


async def callback_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await store.callbacks.run_callbacks(run_id)]


async def task_log(store: Store, run_id: str, task_id: str) -> str:
    rows = await store.views.task_log(run_id, task_id) or []
    return "\n".join(str(r["message"]) for r in rows)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else "(no log)"


async def test_retries_and_failure_are_delivered_once_despite_a_sigkilled_worker(
    url: str, tmp_path: Path, http_receiver: HttpReceiver
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    dag_file = write_dag(tmp_path, KILL_DAG.format(receiver=http_receiver.url, marks=str(marks)))
    run_id = await create_run(url, dag_file)
    store = await open_store(url)
    first = start_worker(url, *FAST, log=tmp_path / "first.log")
    second = None
    try:
        started = marks / "on_failure-started"
        await async_wait_until(
            started.exists, 60, interval=0.05,
            what=f"on_failure to start; worker said: {text(tmp_path / 'first.log')}",
        )  # fmt: skip
        assert started.read_text() == str(first.pid)
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL

        second = start_worker(url, *FAST, log=tmp_path / "second.log")

        async def all_ended() -> bool:
            rows = await callback_rows(store, run_id)
            return len(rows) == 3 and all(r["state"] in ("DONE", "FAILED") for r in rows)

        await async_wait_until(
            all_ended, 60, interval=0.1,
            what=f"the callbacks to end; second worker said: {text(tmp_path / 'second.log')}",
        )  # fmt: skip
        assert stop_process(second) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
    try:
        rows = await callback_rows(store, run_id)
        assert [(r["event"], r["attempt"], r["state"]) for r in rows] == [
            ("on_retry", 1, "DONE"),
            ("on_retry", 2, "DONE"),
            ("on_failure", 3, "DONE"),
        ]
        assert rows[2]["tries"] == 2  # the killed worker's try, then the second worker's
        # Everything ended: nothing more will come. Each event arrived exactly once.
        got = [r.json for r in http_receiver.matching()]
        assert Counter(g["event"] for g in got) == {"on_retry": 2, "on_failure": 1}, got
        # ... in the order they were raised (a task's events go out one after another)
        assert [(g["event"], g["attempt"]) for g in got] == [
            ("on_retry", 1),
            ("on_retry", 2),
            ("on_failure", 3),
        ]
        by_event = {(g["event"], g["attempt"]): g for g in got}
        assert set(by_event) == {("on_retry", 1), ("on_retry", 2), ("on_failure", 3)}
        assert "boom 1" in by_event["on_retry", 1]["error"]
        assert "boom 3" in by_event["on_failure", 3]["error"]
        assert "attempt 1 starts" in by_event["on_retry", 1]["tail"]
        assert "attempt 3 starts" in by_event["on_failure", 3]["tail"]
        assert by_event["on_failure", 3]["pid"] == second.pid
        info = await store.views.run_info(run_id)
        assert info is not None and info["state"] == "FAILED"
        log = await task_log(store, run_id, "flaky")
        assert "on_failure: worker lost while delivering" in log
        assert "on_failure: callback post done" in log
    finally:
        await store.close()


MISBEHAVING_DAG = """
import time

from executor import DAG


def raises(ctx):
    raise ValueError("the callback itself is broken")


def hangs(ctx):
    time.sleep(3600)  # thread isolation cannot stop it: the slot stays busy, the row ends


dag = DAG(
    "callbacks_misbehaving",
    callback_timeout=1,
    callback_retries=1,
    callback_retry_delay=0.2,
)


@dag.task(on_success=raises)
def first(ctx):
    return 1


@dag.task(parents=[first], on_success=hangs)
def second(ctx):
    return 2


@dag.task(parents=[second], notify={{"on_success": [{unreachable!r}, {json_url!r}]}})
def third(ctx):
    return 3


@dag.task(parents=[third], notify={mailto!r})
def fourth(ctx):
    raise RuntimeError("fourth fails on purpose")
"""


async def test_failing_hanging_and_unreachable_handlers_are_logged_and_change_nothing(
    url: str,
    tmp_path: Path,
    http_receiver: HttpReceiver,
    smtp_receiver: SmtpReceiver,
) -> None:
    dead = unreachable_url("nobody")
    dag_file = write_dag(
        tmp_path,
        MISBEHAVING_DAG.format(
            unreachable=dead,
            json_url=http_receiver.json_url("third"),
            mailto=smtp_receiver.mailto_url("ops@example.com"),
        ),
    )
    run_id = await create_run(url, dag_file)
    store = await open_store(url)
    worker = start_worker(url, *FAST, "--slots", "4", log=tmp_path / "worker.log")
    try:

        async def all_ended() -> bool:
            rows = await callback_rows(store, run_id)
            return len(rows) == 4 and all(r["state"] in ("DONE", "FAILED") for r in rows)

        await async_wait_until(
            all_ended, 90, interval=0.1,
            what=f"the callbacks to end; worker said: {text(tmp_path / 'worker.log')}",
        )  # fmt: skip
        # The worker lives on, its slots still serve (a new run of the DAG completes its
        # first task), although a thread still sleeps in `hangs`.
        assert worker.poll() is None
        states = {r["task_id"]: r["state"] for r in await store.views.run_tasks(run_id)}
        assert states == {
            "first": "SUCCESS",
            "second": "SUCCESS",
            "third": "SUCCESS",
            "fourth": "FAILED",
        }
        rows = {r["task_id"]: r for r in await callback_rows(store, run_id)}
        assert {t: (r["event"], r["state"], r["tries"]) for t, r in rows.items()} == {
            "first": ("on_success", "FAILED", 2),
            "second": ("on_success", "FAILED", 2),
            "third": ("on_success", "FAILED", 2),
            "fourth": ("on_failure", "DONE", 1),
        }
        first_log = await task_log(store, run_id, "first")
        assert "ValueError: the callback itself is broken" in first_log
        assert "on_success: try 1 of 2" in first_log and "trying again in 0.2 s" in first_log
        assert "on_success: gave up after 2 tries" in first_log
        second_log = await task_log(store, run_id, "second")
        assert "timed out after 1 s" in second_log and "gave up after 2 tries" in second_log
        third_log = await task_log(store, run_id, "third")
        assert "notification to json://127.0.0.1" in third_log
        assert "gave up after 2 tries" in third_log
        # the reachable target got its notification once, though its row was retried
        [got] = http_receiver.wait_for(1, lambda r: r.path == "/third", timeout=5)
        assert got.json["title"] == "slotless: callbacks_misbehaving.third success"
        assert len(http_receiver.matching(lambda r: r.path == "/third")) == 1
        assert "notification to json://127.0.0.1" in third_log and "done" in third_log
        # the failure went out as mail, with the error and the log's tail
        [mail] = smtp_receiver.wait_for(1, timeout=10)
        body = mail_text(mail)
        assert "callbacks_misbehaving.fourth failure" in body
        assert "fourth fails on purpose" in body

        run2 = await create_run(url, dag_file)

        async def first_done() -> bool:
            found = {r["task_id"]: r["state"] for r in await store.views.run_tasks(run2)}
            return found.get("first") == "SUCCESS"

        await async_wait_until(first_done, 30, interval=0.1, what="a new run's first task")
        assert stop_process(worker, signal.SIGKILL) == -signal.SIGKILL  # a thread sleeps on
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        await store.close()


HANGING_DAG = """
import time

from executor import DAG


def hangs(ctx):
    time.sleep(3600)


dag = DAG("callbacks_hang_killed", callback_timeout=1, callback_retries=0)


@dag.task(on_success=hangs)
def only(ctx):
    return 1
"""


async def test_in_process_isolation_a_hanging_callback_is_killed_and_frees_its_slot(
    tmp_path: Path, db_url: str
) -> None:
    dag_file = write_dag(tmp_path, HANGING_DAG)
    run_id = await create_run(db_url, dag_file)
    store = await open_store(db_url)
    worker = start_worker(
        db_url, *FAST, "--slots", "1", "--isolation", "process", log=tmp_path / "worker.log"
    )
    try:

        async def ended(run: str) -> bool:
            rows = await callback_rows(store, run)
            return len(rows) == 1 and rows[0]["state"] == "FAILED"

        await async_wait_until(
            lambda: ended(run_id), 60, interval=0.1,
            what=f"the callback to end; worker said: {text(tmp_path / 'worker.log')}",
        )  # fmt: skip
        log = await task_log(store, run_id, "only")
        assert "timed out after 1 s (execution timeout: killed after 1 s)" in log
        assert "gave up after 1 try:" in log
        # The one slot is free again: a second run's task and its callback both run.
        run2 = await create_run(db_url, dag_file)
        await async_wait_until(lambda: ended(run2), 60, interval=0.1, what="run 2's callback")
        assert stop_process(worker) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        await store.close()


RUN_DAG = """
from executor import DAG

dag = DAG("callbacks_run", notify={{"on_failure": {url!r}, "on_run_failure": {url!r}}})


@dag.task
def breaks(ctx):
    raise RuntimeError("it broke")
"""


def test_slotless_run_returns_once_its_notifications_went_out(
    tmp_path: Path, http_receiver: HttpReceiver
) -> None:
    dag_file = write_dag(tmp_path, RUN_DAG.format(url=http_receiver.json_url("run")))
    proc = cli("run", str(dag_file), "--db", f"sqlite:///{tmp_path / 'run.db'}", "--json")
    assert proc.returncode == 1, proc.stderr
    # Already there when the command returned: nothing is left for a later worker.
    titles = sorted(r.json["title"] for r in http_receiver.matching())
    assert titles == [
        "slotless: callbacks_run run failure",
        "slotless: callbacks_run.breaks failure",
    ]
