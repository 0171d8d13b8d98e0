"""examples/named_values.py through real processes: `slotless run` as the docs show it,
and two `slotless worker` processes (one forking a child per attempt) sharing a run, so
the named values cross processes and a forked slot, and the teardown cleans up after a
failure without the run's state depending on it."""

from __future__ import annotations

import asyncio
import json
from datetime import date
from pathlib import Path

import pytest
from support.helpers import REPO, cli, cli_env, sql, start_worker, stop_process, wait_until

from executor.loader import load_dag
from executor.store import open_store

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "named_values.py"


def create_run(db_url: str) -> str:
    async def go() -> str:
        store = await open_store(db_url)
        try:
            return await store.runs.create_run(
                load_dag(str(EXAMPLE)), date(2026, 6, 1), dag_file=str(EXAMPLE)
            )
        finally:
            await store.close()

    return asyncio.run(go())


def test_the_example_runs_as_the_migration_guide_shows(tmp_path: Path) -> None:
    env = cli_env(SLOTLESS_DEMO_DIR=str(tmp_path / "data"))
    args = ("run", str(EXAMPLE), "--db", f"sqlite:///{tmp_path / 'nv.db'}", "--json",
            "--logical-date", "2026-06-01")  # fmt: skip
    proc = cli(*args, env=env, timeout=90)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["state"] == "SUCCESS"
    assert set(result["tasks"].values()) == {"SUCCESS"}
    total = json.loads((tmp_path / "data" / "named_values" / "2026-06-01-total.json").read_text())
    assert total == {"rows": 12, "total": 780}
    assert not (tmp_path / "data" / "named_values" / "scratch" / "2026-06-01").exists()


@pytest.mark.parametrize("broken", [False, True])
def test_two_worker_processes_pass_the_values_and_tear_down(
    tmp_path: Path, db_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch, broken: bool
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("SLOTLESS_DEMO_DIR", str(data))  # the workers' environment
    if broken:
        monkeypatch.setenv("NAMED_VALUES_BREAK", "1")
    run_id = create_run(db_url)
    opts = ("--poll-interval", "0.05", "--slots", "1")
    workers = [
        start_worker(db_url, *opts, log=tmp_path / "thread.log"),
        start_worker(db_url, *opts, "--isolation", "process", log=tmp_path / "process.log"),
    ]
    try:

        def ended() -> bool:
            rows = sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", run_id)
            return rows[0]["state"] in ("SUCCESS", "FAILED")

        wait_until(ended, 60, what="the run to end")
    finally:
        for w in workers:
            stop_process(w)
    rows = sql(db_path, "SELECT task_id, state, output FROM task WHERE run_id = ?", run_id)
    tasks = {r["task_id"]: r for r in rows}
    values = sql(
        db_path,
        "SELECT t.task_id, v.key, v.value FROM task_value v JOIN task t ON t.id = v.task_row "
        "WHERE t.run_id = ? ORDER BY t.task_id, v.key",
        run_id,
    )
    pushed = {(r["task_id"], r["key"]): json.loads(r["value"]) for r in values}
    scratch = data / "named_values" / "scratch" / "2026-06-01"
    assert pushed[("extract", "rows")] == 12 and len(pushed[("extract", "checksum")]) == 64
    assert pushed[("make_scratch", "scratch")] == str(scratch)
    assert tasks["remove_scratch"]["state"] == "SUCCESS"  # after a failed load too
    assert json.loads(tasks["remove_scratch"]["output"]) == f"removed {scratch}"
    assert not scratch.exists()
    run = sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", run_id)[0]
    if broken:
        assert tasks["load"]["state"] == "FAILED" and run["state"] == "FAILED"
    else:
        assert json.loads(tasks["load"]["output"]) == {"rows": 12, "total": 780}
        assert run["state"] == "SUCCESS"
