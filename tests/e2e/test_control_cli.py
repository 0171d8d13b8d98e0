"""`slotless clear | mark | cancel | retry` through the real CLI, with real worker and
triggerer processes: a failed run retried to SUCCESS, a run with waiting sensors and
running tasks cancelled (the other run untouched), a forced clear racing the attempt it
takes back, and bad input refused with one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import backends
from support.helpers import (
    async_wait_until,
    cli,
    pid_alive,
    sql,
    start_cli,
    start_worker,
    stop_process,
    task_states,
    write_dag,
)

from executor.loader import load_dag
from executor.store import Store, open_store

pytestmark = pytest.mark.slow
backend, url = backends.backend, backends.url  # fixtures: SQLite, and PostgreSQL
pg_server = backends.pg_server  # fixture

FLAKY = """
from pathlib import Path
from executor import DAG

FIXED = Path({fixed!r})
dag = DAG("flaky")


@dag.task
def extract(ctx):
    return [1, 2, 3]


@dag.task(expand=extract)
def settle(ctx):
    if ctx.item == 2 and not FIXED.exists():
        raise RuntimeError("merchant 2's file is late")
    return ctx.item * 10


@dag.task(parents=[settle])
def total(ctx):
    return ctx.inputs["settle"]
"""

WAITING = """
import os
import time
from pathlib import Path
from executor import DAG
from triggers.files import FileTrigger

GATE = Path({gate!r})
dag = DAG({dag_id!r})
sensors = [dag.sensor(f"s{{i}}", FileTrigger(path=f"{{GATE}}/never-{{i}}", poke_interval=0.5))
           for i in range({sensors})]


def slow(ctx):
    (GATE / f"pid-{{ctx.run_id}}-{{ctx.task_id}}").write_text(str(os.getpid()))
    while not (GATE / "open").exists():
        time.sleep(0.05)  # a long task, ended by the test through the gate
    return 1


slows = [dag.task(slow, task_id=f"slow{{k}}") for k in range({slow})]


@dag.task(parents=[*sensors, *slows])
def after(ctx):
    return 2
"""


async def new_run(store: Store, path: Path, dag_id: str) -> str:
    from datetime import date

    return await store.runs.create_run(
        load_dag(str(path), dag_id), date(2026, 4, 25), dag_file=str(path)
    )


async def run_state(store: Store, run_id: str) -> str:
    info = await store.views.run_info(run_id)
    assert info is not None
    return str(info["state"])


async def test_a_failed_run_is_retried_from_the_cli_and_succeeds(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    url = f"sqlite:///{db}"
    path = write_dag(tmp_path, FLAKY.format(fixed=str(tmp_path / "fixed")), "flaky.py")
    store = await open_store(url)
    worker = start_worker(url, log=tmp_path / "worker.log")
    try:
        run_id = await new_run(store, path, "flaky")
        await async_wait_until(lambda: _ended(store, run_id), 30, what="the first attempt's end")
        assert await run_state(store, run_id) == "FAILED"
        (tmp_path / "fixed").touch()
        out = cli("retry", run_id, "--db", url, "--reason", "file arrived")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"{run_id}: cleared settle, total; the run is RUNNING"
        await async_wait_until(lambda: _ended(store, run_id), 30, what="the retried run's end")
        assert await run_state(store, run_id) == "SUCCESS"
        [total] = [r for r in await store.views.run_tasks(run_id) if r["task_id"] == "total"]
        assert json.loads(total["output"]) == [10, 20, 30]
        # Mark the fan-in with an output of our own; the JSON form says what changed.
        out = cli("mark", run_id, "total", "success", "--output", '{"by": "hand"}', "--db", url,
                  "--json")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {
            "run_id": run_id,
            "run_state": "SUCCESS",
            "tasks": ["total"],
        }
    finally:
        stop_process(worker)
        await store.close()


async def test_cancel_ends_waits_and_running_tasks_of_one_run_only(
    url: str, tmp_path: Path
) -> None:
    """500 DEFERRED sensors and 8 running tasks (process isolation); another run beside it;
    on SQLite and on PostgreSQL (a schema of its own)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    path = write_dag(tmp_path, WAITING.format(gate=str(gate), dag_id="big", sensors=500, slow=8),
                     "big.py")  # fmt: skip
    small = write_dag(tmp_path, WAITING.format(gate=str(gate), dag_id="small", sensors=5, slow=1),
                      "small.py")  # fmt: skip
    store = await open_store(url)
    procs = [
        start_worker(
            url,
            "--slots",
            "12",
            "--isolation",
            "process",
            "--heartbeat-interval",
            "0.5",
            log=tmp_path / "worker.log",
        ),
        start_cli("triggerer", "--db", url, "--lease-ttl", "2", log=tmp_path / "triggerer.log"),
    ]
    try:
        doomed = await new_run(store, path, "big")
        kept = await new_run(store, small, "small")

        async def waiting(run_id: str, sensors: int, slow: int) -> bool:
            states = list((await states_of(store, run_id)).values())
            return states.count("DEFERRED") == sensors and states.count("RUNNING") == slow

        async def both_waiting() -> bool:
            return await waiting(doomed, 500, 8) and await waiting(kept, 5, 1)

        await async_wait_until(
            both_waiting, 90, interval=0.2,
            what="sensors deferred, slow tasks running",
        )  # fmt: skip
        await async_wait_until(
            lambda: held(store, 505), 30, interval=0.1, what="the triggerer holding 505 waits"
        )
        pids = [int((gate / f"pid-{doomed}-slow{k}").read_text()) for k in range(8)]
        assert all(pid_alive(pid) for pid in pids)
        out = cli("cancel", doomed, "--db", url, "--reason", "wrong day")
        assert out.returncode == 0, out.stderr
        # At once: nothing of the run is RUNNING, DEFERRED or waiting to run.
        states = await states_of(store, doomed)
        assert not {"RUNNING", "DEFERRED", "PENDING"} & set(states.values()), states
        assert states["slow0"] == "FAILED" and states["s0"] == "SKIPPED"
        assert await run_state(store, doomed) == "CANCELLED"
        # Within seconds (bounds generous for a loaded machine; the time is not what is
        # tested): the attempts' processes are killed at the worker's next heartbeat,
        # and the triggerer drops the run's 500 waits (the release journal), holding the
        # other run's 5; the other run is untouched.
        await async_wait_until(
            lambda: not any(pid_alive(pid) for pid in pids), 30, interval=0.05,
            what="the cancelled attempts' processes gone",
        )  # fmt: skip
        await async_wait_until(
            lambda: held(store, 5), 30, interval=0.05, what="the triggerer holding 5 waits"
        )
        assert await waiting(kept, 5, 1)
        # Its results are discarded: the cancelled tasks stay as the cancel left them.
        assert (await states_of(store, doomed))["slow0"] == "FAILED"
        log = await store.views.task_log(doomed, "slow0")
        assert log is not None and any("cancelled by cli:" in e["message"] for e in log)
        # Cancelling again changes nothing and says so.
        again = cli("cancel", doomed, "--db", url)
        assert again.returncode == 0 and "the run is CANCELLED" in again.stdout
    finally:
        (gate / "open").touch()
        for p in procs:
            stop_process(p)
        await store.close()


async def test_bad_input_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    url = f"sqlite:///{db}"
    path = write_dag(tmp_path, FLAKY.format(fixed=str(tmp_path / "fixed")), "flaky.py")
    store = await open_store(url)
    try:
        run_id = await new_run(store, path, "flaky")
    finally:
        await store.close()
    before = task_states(db, run_id)
    for args, says in [
        (("clear", "nope"), "no run 'nope'"),
        (("clear", run_id, "typo"), "has no task 'typo'"),
        (("mark", run_id, "extract", "success", "--output", "{not json"), "--output is not JSON"),
        (("mark", run_id, "extract", "failed", "--output", "1"), "only with success"),
    ]:
        out = cli(*args, "--db", url)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert task_states(db, run_id) == before


async def held(store: Store, n: int) -> bool:
    """Whether the (one) triggerer says it holds ``n`` waits, as of its last heartbeat."""
    rows = await store.views.list_triggerers()
    return len(rows) == 1 and rows[0].triggers == n


async def states_of(store: Store, run_id: str) -> dict[str, str]:
    return {r["task_id"]: r["state"] for r in await store.views.run_tasks(run_id)}


async def _ended(store: Store, run_id: str) -> bool:
    return await run_state(store, run_id) in ("SUCCESS", "FAILED")


async def test_a_forced_clear_racing_the_attempts_completion_leaves_one_consistent_state(
    tmp_path: Path,
) -> None:
    db = tmp_path / "db.sqlite"
    url = f"sqlite:///{db}"
    gate = tmp_path / "gate"
    gate.mkdir()
    path = write_dag(tmp_path, WAITING.format(gate=str(gate), dag_id="race", sensors=0, slow=1),
                     "race.py")  # fmt: skip
    store = await open_store(url)
    worker = start_worker(url, "--heartbeat-interval", "0.5", log=tmp_path / "worker.log")
    try:
        run_id = await new_run(store, path, "race")
        await async_wait_until(
            lambda: task_states(db, run_id).get("slow0") == "RUNNING", 30, what="slow0 running"
        )
        out = cli("clear", run_id, "slow0", "--force", "--db", url, "--reason", "redo")
        assert out.returncode == 0, out.stderr
        (gate / "open").touch()  # the taken-back attempt completes now: its report is stale
        await async_wait_until(lambda: _ended(store, run_id), 30, what="the run's end")
        assert await run_state(store, run_id) == "SUCCESS"
        query = (
            "SELECT e.from_state, e.to_state FROM task_event e JOIN task t ON t.id = e.task_row"
            " WHERE t.run_id = ? AND t.task_id = 'slow0' AND e.kind = 'transition' ORDER BY e.id"
        )
        moves = [(e["from_state"], e["to_state"]) for e in sql(db, query, run_id)]
        # One unbroken chain: the taken-back attempt's SUCCESS was never applied.
        assert moves == [("PENDING", "RUNNING"), ("RUNNING", "PENDING"),
                         ("PENDING", "RUNNING"), ("RUNNING", "SUCCESS")]  # fmt: skip
    finally:
        stop_process(worker)
        await store.close()


STOPPED = """
import time
from pathlib import Path
from executor import DAG

GATE = Path({gate!r})
dag = DAG("stopped")


@dag.task
def extract(ctx):
    (GATE / "started").touch()
    while not (GATE / "open").exists():
        time.sleep(0.05)  # running until the test opens the gate
    return 1


@dag.task(parents=[extract])
def load(ctx):
    raise RuntimeError("the warehouse is down")


@dag.task(parents=[extract])
def audit(ctx):
    return 2


@dag.task(parents=[load, audit], trigger_rule="all_done")
def report(ctx):
    return 3
"""


async def test_a_cancelled_run_retried_runs_what_the_cancel_stopped(tmp_path: Path) -> None:
    """The cancel fails the running extract and skips the rest; the retry clears those too,
    so the all_done report runs and the run ends as its tasks say."""
    db = tmp_path / "db.sqlite"
    url = f"sqlite:///{db}"
    gate = tmp_path / "gate"
    gate.mkdir()
    path = write_dag(tmp_path, STOPPED.format(gate=str(gate)), "stopped.py")
    store = await open_store(url)
    worker = start_worker(url, "--heartbeat-interval", "0.5", log=tmp_path / "worker.log")
    try:
        run_id = await new_run(store, path, "stopped")
        await async_wait_until(
            lambda: task_states(db, run_id).get("extract") == "RUNNING" and
            (gate / "started").exists(), 30, what="extract running",
        )  # fmt: skip
        out = cli("cancel", run_id, "--db", url)
        assert out.returncode == 0, out.stderr
        assert task_states(db, run_id) == {
            "extract": "FAILED", "load": "SKIPPED", "audit": "SKIPPED", "report": "SKIPPED"
        }  # fmt: skip
        (gate / "open").touch()
        out = cli("retry", run_id, "--db", url, "--reason", "wrong cancel")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == (
            f"{run_id}: cleared extract, load, audit, report; the run is RUNNING"
        )
        await async_wait_until(lambda: _ended(store, run_id), 30, what="the retried run's end")
        assert task_states(db, run_id) == {
            "extract": "SUCCESS", "load": "FAILED", "audit": "SUCCESS", "report": "SUCCESS"
        }  # fmt: skip
        assert await run_state(store, run_id) == "SUCCESS"  # its one leaf succeeded
    finally:
        stop_process(worker)
        await store.close()
