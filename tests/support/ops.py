"""Shared by the operating tests (metrics, status, web): a DAG whose run sits in every
state worth seeing at once, servers started as real CLI processes, and scraping."""

from __future__ import annotations

import asyncio
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from executor.loader import load_dag
from executor.store import Store
from executor.worker import Worker
from support.helpers import free_port, start_cli, stop_process, wait_until

DAY = date(2026, 4, 25)

# One run that ends up, and stays, with tasks in every interesting state:
#   extract -> shard (mapped x3) -> load            SUCCESS / PENDING
#   wait_for_file, wait_again: deferrable sensors on the SAME file (one shared check)
#   poll_marker: a reschedule-mode sensor            SENSING (next check in 30 s)
#   flaky: fails, 3 retries, an hour apart           RETRYING
#   broken -> after_broken                           FAILED -> UPSTREAM_FAILED
OPS_DAG = """
from executor import DAG
from triggers.files import FileTrigger

INBOX = {inbox!r}

dag = DAG("ops")


@dag.task
def extract(ctx):
    return [1, 2, 3]


@dag.task(expand=extract)
def shard(ctx):
    ctx.log(f"shard {{ctx.index}} of {{ctx.total}}")
    return ctx.item * 2


wait_for_file = dag.sensor(
    "wait_for_file",
    FileTrigger(path=INBOX + "/ready.flag", poke_interval=0.2),
    mode="deferrable",
    timeout="1h",
)
wait_again = dag.sensor(
    "wait_again",
    FileTrigger(path=INBOX + "/ready.flag", poke_interval=0.5),
    mode="deferrable",
    timeout="2h",
)
poll_marker = dag.sensor(
    "poll_marker",
    FileTrigger(path=INBOX + "/marker", poke_interval=30),
    mode="reschedule",
    timeout="1h",
)


@dag.task(retries=3, retry_delay="1h")
def flaky(ctx):
    raise RuntimeError("upstream API answered 503")


@dag.task
def broken(ctx):
    rows = {{"row": 41}}
    return rows["row 42"]


@dag.task(parents=[broken])
def after_broken(ctx):
    return "never"


@dag.task(parents=[wait_for_file, wait_again, shard])
def load(ctx):
    ctx.log(f"loading {{sum(ctx.inputs['shard'])}}")
    return sum(ctx.inputs["shard"])
"""

SETTLED = {
    "extract": "SUCCESS",
    "shard": "SUCCESS",
    "wait_for_file": "DEFERRED",
    "wait_again": "DEFERRED",
    "poll_marker": "SENSING",
    "flaky": "RETRYING",
    "broken": "FAILED",
    "after_broken": "UPSTREAM_FAILED",
    "load": "PENDING",
}


def write_ops_dag(directory: Path) -> tuple[Path, Path]:
    inbox = directory / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    path = directory / "ops_dag.py"
    path.write_text(textwrap.dedent(OPS_DAG.format(inbox=str(inbox))))
    return path, inbox


async def create_ops_run(store: Store, dag_path: Path) -> str:
    dag = load_dag(str(dag_path), None)
    return await store.runs.create_run(dag, DAY, dag_file=str(dag_path))


async def settle_ops_run(store: Store, dag_path: Path, timeout: float = 30.0) -> str:
    """Create the ops run and serve it in-process until every task is where SETTLED says."""
    run_id = await create_ops_run(store, dag_path)
    dag = load_dag(str(dag_path), None)
    worker = Worker(store, dags={dag.dag_id: dag}, poll_interval=0.02, slots=4)

    async def settled() -> bool:
        states = {t["task_id"]: t["state"] for t in await store.views.run_tasks(run_id)}
        return states == SETTLED

    await asyncio.wait_for(worker.run(until=settled), timeout)
    return run_id


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_for_http(
    url: str, proc: subprocess.Popen, log: Path, timeout: float = 30.0
) -> tuple[int, str]:
    """Poll ``url`` until it answers; fail early (with the log) if the process died."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode}:\n{log.read_text()}")
        try:
            return http_get(url, timeout=2.0)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer in {timeout} s:\n{log.read_text()}")
        time.sleep(0.05)


@contextmanager
def ui_process(db_url: str, log: Path, *args: str, ready: str = "/") -> Iterator[str]:
    """``slotless ui --db DB_URL ARGS`` on a free port, its output in ``log``; yields its base
    URL once ``ready`` answers. Left normally, it must stop with 0 and no traceback logged
    (however hostile the requests were); left by an error, it is stopped and the error goes
    on."""
    port = free_port()
    proc = start_cli("ui", "--db", db_url, "--port", str(port), *args, log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base + ready, proc, log)
        yield base
    except BaseException:
        stop_process(proc)
        raise
    code = stop_process(proc)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> tuple[Samples, dict[str, str]]:
    """Every sample of a /metrics page, keyed by (name, sorted labels); and each family's type."""
    status, text = http_get(url)
    assert status == 200, text
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def present(samples: Samples, name: str, **labels: str) -> float:
    """:func:`sample` of a series that must be there: its absence fails, naming it."""
    got = sample(samples, name, **labels)
    assert got is not None, f"no sample {name}{labels or ''}"
    return got


def poll(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """:func:`helpers.wait_until`, but a predicate that fails an assertion only counts as not
    yet (the last such failure is told on time-out)."""
    last: AssertionError | None = None

    def attempt() -> Any:
        nonlocal last
        try:
            return predicate()
        except AssertionError as exc:
            last = exc
            return None

    try:
        return wait_until(attempt, timeout, 0.05, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last}") from None
