"""Worker processes on one SQLite file: a worker SIGKILLed mid-task is taken back by
another, and two workers serving one run never run one attempt twice."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from datetime import date
from pathlib import Path

import pytest
from support.helpers import events, sql, start_worker, stop_process, wait_until, write_dag

from executor.loader import load_dag
from executor.store import open_store

pytestmark = pytest.mark.slow


def create_run(db_url: str, dag_file: Path) -> str:
    """Create the run from the test, as ``slotless run`` would, with the DAG's file path."""

    async def go() -> str:
        store = await open_store(db_url)
        try:
            return await store.runs.create_run(
                load_dag(dag_file), date(2026, 6, 1), dag_file=str(dag_file)
            )
        finally:
            await store.close()

    return asyncio.run(go())


def run_state(db_path: Path, run_id: str) -> str:
    return sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", run_id)[0]["state"]


def worker_log(path: Path) -> str:
    return path.read_text() if path.exists() else "(no log)"


KILL_DAG = """
import os
import time
from pathlib import Path

from executor import DAG

MARKS = Path({marks!r})
dag = DAG("killed_worker")


@dag.task(retries=2, retry_delay=0)
def long(ctx):
    (MARKS / f"attempt{{ctx.attempt}}-{{os.getpid()}}").write_text("")
    if ctx.attempt == 1:
        time.sleep(120)  # the worker is SIGKILLed in here
    return {{"attempt": ctx.attempt, "pid": os.getpid()}}


@dag.task(parents=[long])
def after(ctx):
    return ctx.inputs["long"]
"""


def test_sigkilled_worker_task_is_taken_back_by_another_worker(tmp_path, db_path, db_url):
    marks = tmp_path / "marks"
    marks.mkdir()
    dag_file = write_dag(tmp_path, KILL_DAG.format(marks=str(marks)))
    run_id = create_run(db_url, dag_file)
    opts = ("--stale-after", "2", "--heartbeat-interval", "0.3", "--poll-interval", "0.05")

    first = start_worker(db_url, *opts, log=tmp_path / "first.log")
    second = None
    try:
        wait_until(lambda: list(marks.glob("attempt1-*")), 30, what="attempt 1 to start")
        (row,) = sql(db_path, "SELECT * FROM task WHERE task_id = 'long'")
        assert row["state"] == "RUNNING" and f":{first.pid}:" in row["owner"]
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL

        second = start_worker(db_url, *opts, log=tmp_path / "second.log")
        wait_until(
            lambda: run_state(db_path, run_id) != "RUNNING",
            40,
            what=f"the run to end; second worker said: {worker_log(tmp_path / 'second.log')}",
        )
        assert stop_process(second) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)

    assert run_state(db_path, run_id) == "SUCCESS", worker_log(tmp_path / "second.log")
    (attempt2,) = marks.glob("attempt2-*")
    assert attempt2.name == f"attempt2-{second.pid}"
    transitions = [
        (e["from_state"], e["to_state"], e["attempt"], e["message"])
        for e in events(db_path, run_id, "long")
        if e["kind"] == "transition"
    ]
    assert [t[:3] for t in transitions] == [
        ("PENDING", "RUNNING", 1),
        ("RUNNING", "RETRYING", 2),
        ("RETRYING", "RUNNING", 2),
        ("RUNNING", "SUCCESS", 2),
    ]
    assert f":{first.pid}:" in transitions[0][3]
    # Taken back by its released liveness lock, or by the 2 s TTL, whichever came first.
    why = transitions[1][3]
    assert "lost: no heartbeat for" in why or "lost: its process is gone" in why
    assert f":{first.pid}:" in why
    assert f":{second.pid}:" in transitions[2][3]
    rows = {r["task_id"]: r for r in sql(db_path, "SELECT * FROM task WHERE run_id = ?", run_id)}
    assert json.loads(rows["long"]["output"]) == {"attempt": 2, "pid": second.pid}
    assert json.loads(rows["after"]["output"]) == {"attempt": 2, "pid": second.pid}
    assert rows["after"]["state"] == "SUCCESS"
    # the killed worker never reported its slot; the one that finished did
    usage = sql(db_path, "SELECT worker_id FROM slot_usage WHERE task_row = ?", rows["long"]["id"])
    assert len(usage) == 1 and f":{second.pid}:" in usage[0]["worker_id"]


N_GATES = 4
MANY_DAG = """
import os
import random
import time
from pathlib import Path

from executor import DAG

GATES = Path({gates!r})
RAN = Path({ran!r})  # one line per attempt actually executed, one file per worker process
N_GATES = {n_gates}
dag = DAG("two_workers")


def gate(ctx):
    # Hold this slot until every gate has started: with 3 slots per worker and 4 gates,
    # both workers must be serving the run before any gate can finish.
    (GATES / ctx.task_id).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while len(list(GATES.iterdir())) < N_GATES:
        if time.monotonic() > deadline:
            raise RuntimeError("the other worker never took a gate")
        time.sleep(0.01)
    return os.getpid()


def work(ctx):
    with open(RAN / f"{{os.getpid()}}.log", "a") as f:
        f.write(f"{{ctx.task_id}} {{ctx.attempt}}\\n")
    return sorted(ctx.inputs)


rng = random.Random(7)
previous = [dag.task(gate, task_id=f"gate{{i}}").task_id for i in range(N_GATES)]
count, layer = N_GATES, 0
while count < 300:
    current = []
    for j in range(min(37, 300 - count)):
        parents = rng.sample(previous, k=min(len(previous), rng.randint(1, 3)))
        current.append(dag.task(work, task_id=f"l{{layer}}_{{j}}", parents=parents).task_id)
        count += 1
    previous, layer = current, layer + 1
"""


def test_two_workers_never_run_one_attempt_twice(tmp_path, db_path, db_url):
    gates = tmp_path / "gates"
    gates.mkdir()
    ran = tmp_path / "ran"
    ran.mkdir()
    dag_file = write_dag(tmp_path, MANY_DAG.format(gates=str(gates), ran=str(ran), n_gates=N_GATES))
    run_id = create_run(db_url, dag_file)
    opts = ("--slots", "3", "--poll-interval", "0.05")
    workers = [start_worker(db_url, *opts, log=tmp_path / f"w{i}.log") for i in range(2)]
    try:
        wait_until(
            lambda: run_state(db_path, run_id) != "RUNNING",
            60,
            what="the run to end; "
            + " | ".join(worker_log(tmp_path / f"w{i}.log") for i in range(2)),
        )
        assert [stop_process(w) for w in workers] == [0, 0]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(10)

    assert run_state(db_path, run_id) == "SUCCESS"
    tasks = sql(db_path, "SELECT id, state, attempt FROM task WHERE run_id = ?", run_id)
    assert len(tasks) == 300
    assert Counter(t["state"] for t in tasks) == {"SUCCESS": 300}

    claims = sql(
        db_path,
        "SELECT task_row, attempt, message FROM task_event WHERE kind = 'transition'"
        " AND to_state = 'RUNNING' AND from_state IN ('PENDING', 'RETRYING')",
    )
    per_attempt = Counter((c["task_row"], c["attempt"]) for c in claims)
    assert set(per_attempt.values()) == {1}, "an attempt was claimed twice"
    per_row = Counter(c["task_row"] for c in claims)
    assert set(per_row) == {t["id"] for t in tasks}
    for t in tasks:  # every attempt that ran was claimed exactly once
        assert per_row[t["id"]] == t["attempt"]

    usage = sql(db_path, "SELECT task_row, worker_id, started_at FROM slot_usage")
    assert Counter(u["task_row"] for u in usage) == per_row, "slot usage rows duplicated"
    assert len({(u["task_row"], u["started_at"]) for u in usage}) == len(usage)
    # each attempt ran in the worker that claimed it, and both workers served the run
    claimed_by = {c["task_row"]: c["message"].removeprefix("claimed by ") for c in claims}
    for u in usage:
        assert claimed_by[u["task_row"]].startswith(u["worker_id"] + "#")
    pids = {w.pid for w in workers}
    assert {int(u["worker_id"].split(":")[-2]) for u in usage} == pids
    gate_pids = {int(p.read_text()) for p in gates.iterdir()}
    assert gate_pids == pids
    # and from the tasks' own side: every (task, attempt) executed exactly once
    executed = Counter(line for f in ran.iterdir() for line in f.read_text().splitlines())
    assert len(executed) == 300 - N_GATES
    assert set(executed.values()) == {1}
