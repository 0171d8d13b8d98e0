"""`slotless clear | mark | cancel | retry` through the real CLI, with real worker and
triggerer processes: a failed run retried to SUCCESS, a run with waiting sensors and
running tasks cancelled (the other run untouched), a forced clear racing the attempt it
takes back, and bad input refused with one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.helpers import (
    async_wait_until,
    cli,
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
from pathlib import Path
from executor import DAG
from triggers.files import FileTrigger

GATE = Path({gate!r})
dag = DAG("waiting")
sensors = [dag.sensor(f"s{{i}}", FileTrigger(path=f"{{GATE}}/never-{{i}}", poke_interval=0.5))
           for i in range(50)]


@dag.task
def slow(ctx):
    (GATE / f"started-{{ctx.run_id}}").touch()
    while not (GATE / "open").exists():
        import time
        time.sleep(0.05)  # a long task, ended by the test through the gate
    return 1


@dag.task(parents=[*sensors, slow])
def after(ctx):
    return 2
"""


async def new_run(store: Store, path: Path, dag_id: str) -> str:
    from datetime import date

    return await store.create_run(
        load_dag(str(path), dag_id), date(2026, 4, 25), dag_file=str(path)
    )


async def run_state(store: Store, run_id: str) -> str:
    info = await store.run_info(run_id)
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
        [total] = [r for r in await store.run_tasks(run_id) if r["task_id"] == "total"]
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


async def test_cancel_ends_waits_and_running_tasks_of_one_run_only(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    url = f"sqlite:///{db}"
    gate = tmp_path / "gate"
    gate.mkdir()
    path = write_dag(tmp_path, WAITING.format(gate=str(gate)), "waiting.py")
    store = await open_store(url)
    procs = [
        start_worker(url, "--slots", "4", log=tmp_path / "worker.log"),
        start_cli("triggerer", "--db", url, log=tmp_path / "triggerer.log"),
    ]
    try:
        doomed = await new_run(store, path, "waiting")
        kept = await new_run(store, path, "waiting")

        async def both_waiting() -> bool:
            for run_id in (doomed, kept):
                states = task_states(db, run_id)
                if states.get("slow") != "RUNNING" or list(states.values()).count("DEFERRED") < 50:
                    return False
            return True

        await async_wait_until(
            both_waiting, 60, interval=0.1, what="sensors deferred, slow running"
        )
        await async_wait_until(
            lambda: _held(db) == 100, 20, interval=0.1, what="the triggerer holding 100 waits"
        )
        out = cli("cancel", doomed, "--db", url, "--reason", "wrong day")
        assert out.returncode == 0, out.stderr
        # At once: nothing of the run is RUNNING or DEFERRED; the other run is as it was.
        states = task_states(db, doomed)
        assert not {"RUNNING", "DEFERRED", "PENDING"} & set(states.values()), states
        assert states["slow"] == "FAILED" and states["s0"] == "SKIPPED"
        assert await run_state(store, doomed) == "CANCELLED"
        assert list(task_states(db, kept).values()).count("DEFERRED") == 50
        # The triggerer drops the cancelled run's 50 waits within seconds (the release
        # journal), not at its next full reload a minute later: it holds the kept run's 50.
        await async_wait_until(
            lambda: _held(db) == 50, 10, interval=0.1, what="the triggerer holding 50 waits"
        )
        (gate / "open").touch()  # the cancelled attempt ends; its report is discarded
        await async_wait_until(
            lambda: task_states(db, kept).get("slow") == "SUCCESS", 30, what="the kept run's slow"
        )
        assert task_states(db, doomed)["slow"] == "FAILED"
        log = await store.task_log(doomed, "slow")
        assert log is not None and any("cancelled by cli:" in e["message"] for e in log)
        # Cancelling again is refused: the run has ended.
        again = cli("cancel", doomed, "--db", url)
        assert again.returncode == 2 and "has ended CANCELLED" in again.stderr
    finally:
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


def _held(db: Path) -> int:
    """The waits the (one) triggerer says it holds, as of its last heartbeat."""
    return int(sql(db, "SELECT triggers FROM triggerer")[0]["triggers"])


async def _ended(store: Store, run_id: str) -> bool:
    return await run_state(store, run_id) in ("SUCCESS", "FAILED")
