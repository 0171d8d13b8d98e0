"""A run's DAG file is imported off the worker's event loop: a file that calls sys.exit(),
os._exit() or hangs at import fails its own task with the reason, and the worker process
keeps serving the other runs."""

from __future__ import annotations

import asyncio
from datetime import date
from pathlib import Path

import pytest
from support.helpers import events, sql, start_worker, stop_process, wait_until, write_dag

from executor.loader import load_dag
from executor.store import open_store

pytestmark = pytest.mark.slow

GOOD = """
from executor import DAG

dag = DAG({dag_id!r})


@dag.task
def job(ctx):
    return 1
"""

BAD = {
    "exits": "import sys\nsys.exit(3)\n",
    "os_exits": "import os\nos._exit(7)\n",
    "hangs": "import time\ntime.sleep(3600)\n",
}


def create_runs(db_url: str, files: dict[str, Path]) -> dict[str, str]:
    async def go() -> dict[str, str]:
        store = await open_store(db_url)
        try:
            return {
                name: await store.runs.create_run(
                    load_dag(path, cached=False), date(2026, 6, 1), dag_file=str(path)
                )
                for name, path in files.items()
            }
        finally:
            await store.close()

    return asyncio.run(go())


def test_bad_dag_files_fail_their_tasks_and_the_worker_keeps_serving(tmp_path, db_path, db_url):
    files = {
        name: write_dag(tmp_path, GOOD.format(dag_id=name), name=f"{name}.py")
        for name in [*BAD, "good"]
    }
    runs = create_runs(db_url, files)
    # What the worker will find when it imports them: the same DAG behind a bad first line.
    for name, code in BAD.items():
        files[name].write_text(code + GOOD.format(dag_id=name))
    log = tmp_path / "worker.log"
    worker = start_worker(db_url, "--parse-timeout", "3", "--poll-interval", "0.05", log=log)
    try:

        def ended() -> dict[str, str]:
            rows = sql(db_path, "SELECT run_id, state FROM dag_run")
            states = {r["run_id"]: r["state"] for r in rows}
            return states if all(states[r] in ("SUCCESS", "FAILED") for r in runs.values()) else {}

        states = wait_until(ended, 90, what="every run to end")
        assert worker.poll() is None, log.read_text()
        assert states[runs["good"]] == "SUCCESS"
        reasons = {
            name: "\n".join(e["message"] or "" for e in events(db_path, runs[name], "job"))
            for name in BAD
        }
        assert "sys.exit(3)" in reasons["exits"], reasons["exits"]
        assert "exited with status 7" in reasons["os_exits"], reasons["os_exits"]
        assert "did not finish within 3 s" in reasons["hangs"], reasons["hangs"]
        for name in BAD:
            assert states[runs[name]] == "FAILED"
        # Still serving: a run created now is run too.
        more = write_dag(tmp_path, GOOD.format(dag_id="later"), name="later.py")
        later = create_runs(db_url, {"later": more})["later"]
        wait_until(
            lambda: (
                sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", later)[0]["state"]
                == "SUCCESS"
            ),
            60,
            what="a later run to succeed",
        )
    finally:
        stop_process(worker)
