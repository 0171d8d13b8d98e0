"""The migration guide's two examples through real processes: examples/task_groups.py (task
groups, nested, and a mapped group) served by two ``slotless worker`` processes, with
``slotless status --run`` showing its tasks in their groups; examples/expand_kwargs.py
through ``slotless run``."""

from __future__ import annotations

import asyncio
import json
import shutil
from datetime import date
from pathlib import Path

import pytest
from support.catalogued import catalogue_file
from support.helpers import REPO, cli, sql, start_worker, stop_process, wait_until

from executor.loader import load_dag
from executor.store import open_store

pytestmark = pytest.mark.slow


def create_run(db_url: str, dag_file: Path) -> str:
    """Catalogue the file (as the services would) and create a run of it, with its path."""

    async def go() -> str:
        store = await open_store(db_url)
        try:
            await catalogue_file(store, dag_file)
            return await store.runs.create_run(
                load_dag(dag_file), date(2026, 6, 1), dag_file=str(dag_file)
            )
        finally:
            await store.close()

    return asyncio.run(go())


def outputs(db_path: Path, run_id: str, task_id: str) -> list[object]:
    rows = sql(
        db_path,
        "SELECT output FROM task WHERE run_id = ? AND task_id = ? ORDER BY map_index",
        run_id,
        task_id,
    )
    return [None if r["output"] is None else json.loads(r["output"]) for r in rows]


def test_task_groups_with_a_mapped_group_through_worker_processes(
    tmp_path: Path, db_path: Path, db_url: str
) -> None:
    dag_file = tmp_path / "task_groups.py"
    shutil.copy(REPO / "examples" / "task_groups.py", dag_file)
    run_id = create_run(db_url, dag_file)
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    workers = [start_worker(db_url, "--slots", "2", log=log) for log in logs]
    try:
        wait_until(
            lambda: (
                sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", run_id)[0]["state"]
                in ("SUCCESS", "FAILED")
            ),
            timeout=60,
            what="the run to end; " + " | ".join(p.read_text() for p in logs if p.exists()),
        )
    finally:
        assert [stop_process(w) for w in workers] == [0, 0]
    [run] = sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", run_id)
    assert run["state"] == "SUCCESS", [p.read_text() for p in logs]
    # Each member of the mapped group ran once per file; load[i] saw extract[i]'s output.
    files = ["orders.csv", "customers.csv", "refunds.csv"]
    for member in ("extract", "checks.row_count", "checks.schema", "load"):
        made = outputs(db_path, run_id, f"per_file.{member}")
        assert len(made) == 1 + len(files), member  # the template, then one per file
    assert outputs(db_path, run_id, "per_file.load")[1:] == [
        {"file": f, "loaded": 10 * len(f)} for f in files
    ]
    assert outputs(db_path, run_id, "report") == [{"files": 3, "rows": 340}]
    # Per index: no load instance started before the extract of its own index ended.
    rows = sql(
        db_path,
        "SELECT t.task_id, t.map_index, t.ended_at, min(e.ts) AS started FROM task t "
        "JOIN task_event e ON e.task_row = t.id AND e.to_state = 'RUNNING' "
        "WHERE t.run_id = ? AND t.map_index >= 0 "
        "AND t.task_id IN ('per_file.extract', 'per_file.load') GROUP BY t.id",
        run_id,
    )
    ended = {r["map_index"]: r["ended_at"] for r in rows if r["task_id"] == "per_file.extract"}
    started = {r["map_index"]: r["started"] for r in rows if r["task_id"] == "per_file.load"}
    assert sorted(started) == [0, 1, 2]
    assert all(started[i] >= ended[i] for i in started), (started, ended)

    shown = cli("status", "--db", db_url, "--run", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any("per_file/" in line and "mapped over list_files" in line for line in lines)
    assert any("checks/" in line for line in lines)
    assert any("load" in line and "3 instances: success=3" in line for line in lines)
    as_json = json.loads(cli("status", "--db", db_url, "--run", run_id, "--json").stdout)
    [setup, per_file] = as_json["groups"]
    assert setup["group_id"] == "setup" and per_file["over"] == "list_files"
    assert [t["task_id"] for t in per_file["groups"][0]["tasks"]] == [
        "per_file.checks.row_count", "per_file.checks.schema",
    ]  # fmt: skip
    missing = cli("status", "--db", db_url, "--run", "nope")
    assert missing.returncode == 1 and missing.stdout.strip() == "slotless status: no run 'nope'"


def test_the_expand_kwargs_example_runs_through_the_cli(tmp_path: Path, db_path: Path) -> None:
    proc = cli(
        "run", str(REPO / "examples" / "expand_kwargs.py"), "--db", f"sqlite:///{db_path}",
        "--logical-date", "2026-04-25", "--json", timeout=90,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["state"] == "SUCCESS", result
    run_id = result["run_id"]
    assert outputs(db_path, run_id, "copy_table")[1:] == [
        {"table": "warehouse.orders", "rows": 600},
        {"table": "warehouse.customers", "rows": 900},
        {"table": "warehouse.refunds", "rows": 700},
    ]
    assert outputs(db_path, run_id, "notify")[1:] == [
        "#data: eu, 2200 rows copied", "#data: us, 2200 rows copied",
        "#ops: eu, 2200 rows copied", "#ops: us, 2200 rows copied",
    ]  # fmt: skip
