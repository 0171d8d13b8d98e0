"""Many processes on one PostgreSQL, and real faults.

3 ``slotless worker`` and 2 ``slotless triggerer`` processes serve one run: 2,000
deferrable sensors (each a FileTrigger on its own file, which the test creates in two
waves), a task that defers and resumes at a method, a soft-fail sensor that times out,
and a fan-out of 400 instances (some fail once on purpose). Mid-way the test SIGKILLs one
triggerer (while sensors wait) and one worker (while it runs instances). Then:

* the run succeeds and every task ends in the state it should;
* every task's transitions in task_event form one unbroken chain from PENDING to its
  final state: no transition lost, none applied twice (a double fire during the
  triggerer hand-over changed nothing);
* no attempt ran twice, nor two attempts of one task at once: each instance appends
  start / end lines to a file as it runs, and those intervals never overlap;
* the killed worker's tasks were taken back by the survivors ("worker ... lost"), and the
  surviving triggerer took over every shard.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from support import pg
from support.helpers import REPO, cli_env

from executor.loader import load_dag
from executor.store import open_store

pg_server, pg_url = pg.pg_server, pg.pg_url  # fixtures

SENSORS = 2000
ITEMS = 400
FAIL_EVERY = 40  # instances whose item % FAIL_EVERY == 0 fail their first attempt

DAG_SOURCE = """
import json
import os
import time
from pathlib import Path

from executor import DAG
from triggers.files import FileTrigger

ROOT = Path({root!r})
IN = ROOT / "in"
MARKS = ROOT / "marks"
SENSORS, ITEMS, FAIL_EVERY = {sensors}, {items}, {fail_every}

dag = DAG("fleet")
sensors = [
    dag.sensor(f"s{{i:04d}}", FileTrigger(path=str(IN / f"f{{i:04d}}"), poke_interval=0.5))
    for i in range(SENSORS)
]
late = dag.sensor(
    "late", FileTrigger(path=str(IN / "never"), poke_interval=0.5), timeout=3, soft_fail=True
)


@dag.task(parents=[late])
def after_late(ctx):
    raise AssertionError("must be skipped: its sensor timed out with soft_fail")


@dag.task(parents=sensors)
def gather(ctx):
    for i in range(SENSORS):
        assert ctx.inputs[f"s{{i:04d}}"]["paths"] == [str(IN / f"f{{i:04d}}")]
    return list(range(ITEMS))


def mark(ctx, what):
    now = time.time()
    line = json.dumps({{"what": what, "attempt": ctx.attempt, "pid": os.getpid(), "t": now}})
    with open(MARKS / f"{{ctx.index}}", "a") as f:
        f.write(line + "\\n")


@dag.task(expand=gather, retries=3, retry_delay=0.2)
def work(ctx):
    mark(ctx, "start")
    time.sleep(0.3)
    if ctx.item % FAIL_EVERY == 0 and ctx.attempt == 1:
        mark(ctx, "fail")
        raise RuntimeError("planned failure")
    mark(ctx, "end")
    return ctx.item * 2


@dag.task
def resumable(ctx):
    ctx.defer(FileTrigger(path=str(IN / "go"), poke_interval=0.5), method="resume", timeout=600)


@resumable.method
def resume(ctx):
    return ctx.event


@dag.task(parents=[work, resumable])
def total(ctx):
    return {{"sum": sum(ctx.inputs["work"]), "event": ctx.inputs["resumable"]}}
"""


def start(kind: str, url: str, log: Path, *args: str) -> subprocess.Popen:
    out = open(log, "w")  # noqa: SIM115 - kept by the child
    return subprocess.Popen(
        [sys.executable, "-m", "slotless", kind, "--db", url, *args],
        cwd=REPO,
        env=cli_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def touch(paths: list[Path]) -> None:
    for p in paths:
        tmp = p.with_suffix(".part")
        tmp.write_text("x")
        tmp.rename(p)  # the trigger never sees half a file


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_workers_and_triggerers_survive_sigkill(pg_url: str, tmp_path: Path) -> None:
    import asyncpg

    (tmp_path / "in").mkdir()
    (tmp_path / "marks").mkdir()
    dag_file = tmp_path / "fleet.py"
    dag_file.write_text(
        textwrap.dedent(DAG_SOURCE).format(
            root=str(tmp_path), sensors=SENSORS, items=ITEMS, fail_every=FAIL_EVERY
        )
    )
    dag = load_dag(str(dag_file), "fleet")
    store = await open_store(pg_url)
    conn = await asyncpg.connect(pg_url)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: dict[str, subprocess.Popen] = {}
    try:
        worker_args = ["--slots", "16", "--heartbeat-interval", "0.5", "--stale-after", "4"]
        for i in range(3):
            procs[f"w{i}"] = start("worker", pg_url, logs / f"w{i}.log", *worker_args)
        for i in range(2):
            procs[f"t{i}"] = start("triggerer", pg_url, logs / f"t{i}.log", "--lease-ttl", "3")
        began = time.monotonic()
        run_id = await store.runs.create_run(dag, date(2026, 4, 25), dag_file=str(dag_file))

        async def count(sql: str, *args: Any) -> int:
            return await conn.fetchval(sql, *args)

        async def until(what: str, sql: str, *args: Any, timeout: float = 60) -> None:
            deadline = time.monotonic() + timeout
            while not await count(sql, *args):
                for name, p in procs.items():
                    assert p.poll() is None or name in killed, f"{name} died: see {logs}"
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out waiting for {what}; logs in {logs}")
                await asyncio.sleep(0.1)
            print(f"{time.monotonic() - began:6.1f} s  {what}")  # the timeline, with -s

        killed: set[str] = set()
        sensor_done = "SELECT count(*) FROM task WHERE task_id LIKE 's%' AND state = 'SUCCESS'"
        # -- wave 1: half the files; kill a triggerer while the other half still waits
        await until(
            "every sensor deferred",
            "SELECT count(*) = $1 FROM task WHERE task_id LIKE 's%' AND state = 'DEFERRED'",
            SENSORS,
        )
        await until(
            "both triggerers hold shards", "SELECT count(DISTINCT owner) = 2 FROM shard_lease"
        )
        touch([tmp_path / "in" / f"f{i:04d}" for i in range(SENSORS // 2)])
        await until("a quarter of the sensors done", sensor_done + " HAVING count(*) >= $1", 500)
        victim = procs["t0"]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed.add("t0")
        # -- wave 2: the rest; the survivor must take the dead one's shards to fire them
        touch([tmp_path / "in" / f"f{i:04d}" for i in range(SENSORS // 2, SENSORS)])
        touch([tmp_path / "in" / "go"])
        await until(
            "the victim worker running instances",
            "SELECT count(*) >= 3 FROM task WHERE task_id = 'work' AND map_index >= 0"
            " AND state = 'RUNNING' AND owner LIKE $1",
            f"%:{procs['w0'].pid}:%",
        )
        victim_pid = procs["w0"].pid
        procs["w0"].send_signal(signal.SIGKILL)
        procs["w0"].wait(10)
        killed.add("w0")
        kill_time = time.time()
        await until(
            "the run to end",
            "SELECT count(*) FROM dag_run WHERE run_id = $1 AND state <> 'RUNNING'",
            run_id,
            timeout=120,
        )
        elapsed = time.monotonic() - began

        # -- the run and every task ended as they should
        run = await conn.fetchrow("SELECT * FROM dag_run WHERE run_id = $1", run_id)
        assert run["state"] == "SUCCESS", f"run ended {run['state']}; logs in {logs}"
        rows = await conn.fetch("SELECT * FROM task WHERE run_id = $1", run_id)
        by_task = defaultdict(list)
        for r in rows:
            by_task[r["task_id"]].append(r)
        for i in range(SENSORS):
            [s] = by_task[f"s{i:04d}"]
            assert s["state"] == "SUCCESS"
            assert json.loads(s["output"]) == {"paths": [str(tmp_path / "in" / f"f{i:04d}")]}
        assert [r["state"] for r in by_task["late"]] == ["SKIPPED"]
        assert [r["state"] for r in by_task["after_late"]] == ["SKIPPED"]
        instances = sorted((r for r in by_task["work"] if r["map_index"] >= 0), key=_index)
        assert [r["map_index"] for r in instances] == list(range(ITEMS))
        assert all(r["state"] == "SUCCESS" for r in instances)
        assert [json.loads(r["output"]) for r in instances] == [2 * i for i in range(ITEMS)]
        [total] = by_task["total"]
        assert json.loads(total["output"]) == {
            "sum": sum(2 * i for i in range(ITEMS)),
            "event": {"paths": [str(tmp_path / "in" / "go")]},
        }
        assert {r["state"] for r in rows} == {"SUCCESS", "SKIPPED"}

        # -- task_event: one unbroken chain of transitions per task, ending where it is
        events = defaultdict(list)
        for e in await conn.fetch(
            "SELECT e.* FROM task_event e JOIN task t ON t.id = e.task_row"
            " WHERE t.run_id = $1 AND e.kind = 'transition' ORDER BY e.id",
            run_id,
        ):
            events[e["task_row"]].append(e)
        for r in rows:
            chain = events[r["id"]]
            where = f"{r['task_id']}[{r['map_index']}]"
            assert chain and chain[0]["from_state"] == "PENDING", where
            for before, after in itertools.pairwise(chain):
                assert after["from_state"] == before["to_state"], (where, before, after)
                assert after["ts"] >= before["ts"] - 0.05, where
            assert chain[-1]["to_state"] == r["state"], where
        fired = [e for r in rows for e in events[r["id"]] if e["from_state"] == "DEFERRED"]
        assert sum(e["to_state"] == "SUCCESS" for e in fired) == SENSORS  # each fired once
        lost = [
            e
            for r in instances
            for e in events[r["id"]]
            if e["to_state"] == "RETRYING" and "lost" in e["message"]
        ]
        assert lost, "the killed worker's instances were never taken back"
        assert all(f":{victim_pid}:" in e["message"] for e in lost)

        # -- executions: no attempt ran twice, no two attempts of one task at once
        for r in instances:
            marks = [
                json.loads(line)
                for line in (tmp_path / "marks" / str(r["map_index"])).read_text().splitlines()
            ]
            attempts: dict[int, dict[str, Any]] = {}
            for m in marks:
                a = attempts.setdefault(m["attempt"], {"pid": m["pid"]})
                assert m["what"] not in a, f"instance {r['map_index']} ran attempt twice: {marks}"
                a[m["what"]] = m["t"]
            assert max(attempts) == r["attempt"], (r["map_index"], marks)
            spans = sorted(
                (a["start"], a.get("end") or a.get("fail") or kill_time, a["pid"])
                for a in attempts.values()
            )
            for (_, end, _), (start_next, _, _) in itertools.pairwise(spans):
                assert start_next >= end, f"instance {r['map_index']} overlapped: {marks}"
            unfinished = [a for a in attempts.values() if "end" not in a and "fail" not in a]
            assert all(a["pid"] == victim_pid for a in unfinished), marks
        planned = [r for r in instances if r["map_index"] % FAIL_EVERY == 0]
        assert all(r["attempt"] >= 2 for r in planned)

        # -- the surviving triggerer holds every shard
        owners = await conn.fetch("SELECT DISTINCT owner FROM shard_lease")
        assert [o["owner"] for o in owners] != [None] and len(owners) == 1
        assert f":{procs['t1'].pid}:" in owners[0]["owner"]
        print(f"run of {len(rows)} task rows ended in {elapsed:.1f} s")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        await conn.close()
        await store.close()
        if os.environ.get("SLOTLESS_KEEP_LOGS"):
            print(f"logs in {logs}")


def _index(row: Any) -> int:
    return row["map_index"]
