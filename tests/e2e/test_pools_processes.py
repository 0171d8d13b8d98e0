"""Pools and queues with real processes, on SQLite and on PostgreSQL.

* 3 ``slotless worker`` processes with 8 slots each serve 200 tasks in a pool of 4: the
  pool's RUNNING rows, sampled from the store every 50 ms throughout, never exceed 4, and
  every task ends SUCCESS. The tasks also write when they ran: those intervals never
  overlap more than 4 deep either (a check that does not depend on sampling).
* A gpu-only worker and a default worker: each task runs on a worker of its queue; until
  the gpu worker starts, status says nobody serves queue gpu.
* Bad input from the command line: one line naming the problem, exit status 2.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.exchanging import run_counts
from support.helpers import cli, start_worker, stop_process, write_dag

from executor.loader import load_dag
from executor.states import RUN_TERMINAL
from executor.store import Store, open_store

pytestmark = pytest.mark.slow
# A fresh database per test: a SQLite file, or a PostgreSQL schema of its own.
backend, db_url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures

TASKS = 200
POOL = 4

POOL_DAG = """
import json
import os
import time
from pathlib import Path

from executor import DAG

MARKS = Path({marks!r})
dag = DAG("pooled")


def load(ctx):
    began = time.time()
    time.sleep(0.03)
    with open(MARKS / f"{{os.getpid()}}", "a") as f:
        f.write(json.dumps([began, time.time()]) + "\\n")


for i in range({tasks}):
    dag.task(load, task_id=f"load{{i:03d}}", pool="warehouse")
"""

QUEUE_DAG = """
import os

from executor import DAG

dag = DAG("routed")


@dag.task(queue="gpu")
def train(ctx):
    return os.getpid()


@dag.task(parents=[train])
def report(ctx):
    return os.getpid()


@dag.task(queue="gpu", pool="gpus")
def infer(ctx):
    return os.getpid()
"""


async def ended(store: Store, run_id: str) -> str | None:
    info = await store.views.run_info(run_id)
    return info["state"] if info is not None and info["state"] in RUN_TERMINAL else None


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    depth = best = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        depth += step
        best = max(best, depth)
    return best


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.timeout(300)
async def test_three_workers_never_run_more_of_a_pool_than_its_slots(
    db_url: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    dag_file = write_dag(tmp_path, POOL_DAG.format(marks=str(marks), tasks=TASKS))
    assert ok(cli("pools", "set", "warehouse", str(POOL), "--db", db_url)).strip() == (
        f"pool warehouse: {POOL} slots"
    )
    store = await open_store(db_url)
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    workers = [
        start_worker(db_url, "--slots", "8", "--poll-interval", "0.1", log=log) for log in logs
    ]
    samples: list[int] = []
    try:
        run_id = await store.runs.create_run(
            load_dag(dag_file), date(2026, 6, 1), dag_file=str(dag_file)
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 240
        while (state := await ended(store, run_id)) is None:
            async with store.db.read() as tx:
                rows = await tx.fetch("pool_running", names=["warehouse"])
            samples.append(int(rows[0]["used"]) if rows else 0)
            for w, log in zip(workers, logs, strict=True):
                assert w.poll() is None, f"a worker died: {log.read_text()}"
            assert loop.time() < deadline, f"the run did not end; samples {samples[-20:]}"
            await asyncio.sleep(0.05)
        counts = await run_counts(store, run_id)
        listed = json.loads(ok(cli("pools", "list", "--json", "--db", db_url)))
    finally:
        for w in workers:
            stop_process(w)
        await store.close()
    assert state == "SUCCESS" and counts == {"SUCCESS": TASKS}, counts
    assert len(samples) >= 20, "sampled throughout (every 50 ms)"
    assert max(samples) <= POOL, f"{max(samples)} RUNNING in a pool of {POOL}"
    assert max(samples) >= 2, "the pool was shared by the workers"
    ran = [tuple(json.loads(line)) for f in marks.iterdir() for line in f.read_text().splitlines()]
    assert len(ran) == TASKS
    # (Which worker ran them is not asserted: the worker that reports a task claims the
    # next in the same transaction, so one worker may keep a busy pool to itself.)
    per_worker = [len(f.read_text().splitlines()) for f in marks.iterdir()]
    print(f"pool tasks per worker process: {per_worker}")
    assert max_overlap(ran) <= POOL
    assert {"name": "warehouse", "slots": POOL, "used": 0, "ready": 0} in listed["pools"]


@pytest.mark.timeout(180)
async def test_a_gpu_worker_and_a_default_worker_split_a_run_by_queue(
    db_url: str, tmp_path: Path
) -> None:
    dag_file = write_dag(tmp_path, QUEUE_DAG)
    ok(cli("queues", "add", "gpu", "--db", db_url))
    ok(cli("pools", "set", "gpus", "1", "--db", db_url))
    store = await open_store(db_url)
    default_log, gpu_log = tmp_path / "default.log", tmp_path / "gpu.log"
    default = start_worker(db_url, "--poll-interval", "0.1", log=default_log)
    gpu: subprocess.Popen[bytes] | None = None
    try:
        run_id = await store.runs.create_run(
            load_dag(dag_file), date(2026, 6, 1), dag_file=str(dag_file)
        )
        # Only the default worker runs: the gpu tasks wait, and status says why.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            status = json.loads(ok(cli("status", "--json", "--db", db_url)))
            held = {t["task_id"]: t["waits_for"] for t in status["held_back"]}
            served = {q["name"]: q["served"] for q in status["queues"]}
            if served.get("default") and set(held) == {"train", "infer"}:
                break
            assert loop.time() < deadline, (status, default_log.read_text())
            await asyncio.sleep(0.2)
        assert held["train"] == "waiting for a worker of queue gpu (no live worker serves it)"
        assert served == {"default": True, "gpu": False}
        assert (await run_counts(store, run_id)).get("PENDING") == 3
        gpu = start_worker(db_url, "--queues", "gpu", "--poll-interval", "0.1", log=gpu_log)
        deadline = loop.time() + 90
        while (state := await ended(store, run_id)) is None:
            assert default.poll() is None, default_log.read_text()
            assert gpu.poll() is None, gpu_log.read_text()
            assert loop.time() < deadline, "the run did not end"
            await asyncio.sleep(0.1)
        pids = {t["task_id"]: json.loads(t["output"]) for t in await store.views.run_tasks(run_id)}
    finally:
        for p in (default, gpu):
            if p is not None:
                stop_process(p)
        await store.close()
    assert state == "SUCCESS"
    assert pids["train"] == pids["infer"] == gpu.pid
    assert pids["report"] == default.pid


async def test_bad_pool_and_queue_input_is_one_line_and_exit_2(db_url: str, tmp_path: Path) -> None:
    for args, said in [
        (("pools", "set", "warehouse", "-1"), "pool slots must be a whole number >= 0"),
        (("pools", "set", "ware house", "2"), "invalid pool name 'ware house'"),
        (("pools", "set", "default", "2"), "the default pool is unlimited"),
        (("pools", "delete", "nope"), "no pool 'nope'"),
        (("queues", "add", "gpu!"), "invalid queue name 'gpu!'"),
        (("worker", "--queues", "gpu"), "unknown queue(s) gpu"),
        (("worker", "--queues", ","), "--queues names no queue"),
    ]:
        proc = cli(*args, "--db", db_url)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.strip().splitlines() == [f"slotless: error: {proc.stderr.strip()[17:]}"]
        assert said in proc.stderr, (args, proc.stderr)
    # A DAG naming an unknown pool or queue is refused before it runs, naming both.
    dag_file = write_dag(tmp_path, QUEUE_DAG)
    proc = cli("run", str(dag_file), "--db", db_url)
    assert proc.returncode == 2
    assert "unknown pool 'gpus' (task infer)" in proc.stderr
    assert "unknown queue 'gpu' (task infer, train)" in proc.stderr
    # Declared, the same file runs to the end in one process (it serves the DAG's queues).
    ok(cli("queues", "add", "gpu", "--db", db_url))
    ok(cli("pools", "set", "gpus", "1", "--db", db_url))
    out = json.loads(ok(cli("run", str(dag_file), "--db", db_url, "--json")))
    assert out["state"] == "SUCCESS"
    # A pool in use by unfinished tasks is not deleted; an unused one is.
    assert ok(cli("pools", "delete", "gpus", "--db", db_url)).strip() == "pool gpus: deleted"


async def test_a_pool_a_catalogued_dag_names_is_deleted_only_with_force(
    db_url: str, tmp_path: Path
) -> None:
    ok(cli("queues", "add", "gpu", "--db", db_url))
    ok(cli("pools", "set", "gpus", "1", "--db", db_url))
    folder = tmp_path / "dags"
    folder.mkdir()
    write_dag(folder, QUEUE_DAG, "routed.py")
    ok(cli("dags", "list", "--db", db_url, "--dags", str(folder), "--parse-timeout", "10"))
    proc = cli("pools", "delete", "gpus", "--db", db_url)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.strip() == (
        "slotless: error: pool 'gpus' is named by catalogued DAG(s) routed: their runs would "
        "be refused without it; change them first, or --force"
    )
    assert "gpus: 0/1 used" in ok(cli("pools", "list", "--db", db_url))  # still there
    out = ok(cli("pools", "delete", "gpus", "--force", "--db", db_url))
    assert out.strip() == "pool gpus: deleted"
    assert "gpus" not in ok(cli("pools", "list", "--db", db_url))
