"""Orphan repair with real processes: a `slotless triggerer` (reconciling every 2 s) and a
`slotless worker` on one SQLite file. A deferred sensor whose trigger row is deleted by
hand and one whose trigger_id is set to NULL both fail within a reconcile period, with
"trigger row missing" in their logs, and the triggerer's metrics count them."""

from __future__ import annotations

import asyncio
import textwrap
from datetime import date
from pathlib import Path

import pytest
from support.helpers import events, free_port, sql, start_cli, stop_process, wait_until
from support.ops import poll, sample, scrape, wait_for_http

from executor.loader import load_dag
from executor.store import open_store

pytestmark = pytest.mark.slow

DAG_SOURCE = """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG({dag_id!r})
dag.sensor("wait", FileTrigger(path={path!r}, poke_interval=0.5), timeout=3600)
"""


def create_run(db_url: str, path: Path, dag_id: str) -> str:
    async def go() -> str:
        store = await open_store(db_url)
        try:
            return await store.runs.create_run(
                load_dag(path, dag_id, cached=False), date(2026, 6, 1), dag_file=str(path)
            )
        finally:
            await store.close()

    return asyncio.run(go())


def test_triggerer_process_repairs_orphans(tmp_path: Path, db_path: Path, db_url: str) -> None:
    runs = {}
    for name in ("gone", "null"):
        path = tmp_path / f"{name}.py"
        never = str(tmp_path / f"never-{name}")
        path.write_text(textwrap.dedent(DAG_SOURCE).format(dag_id=name, path=never))
        runs[name] = create_run(db_url, path, name)
    port = free_port()
    tlog, wlog = tmp_path / "triggerer.log", tmp_path / "worker.log"
    worker = start_cli("worker", "--db", db_url, "--poll-interval", "0.05", log=wlog)
    triggerer = start_cli(
        "triggerer", "--db", db_url, "--lease-ttl", "3", "--reconcile-every", "2",
        "--metrics-port", str(port), log=tlog,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for_http(url, triggerer, tlog)

        def state(name: str) -> str:
            return str(
                sql(db_path, "SELECT state FROM task WHERE run_id = ?", runs[name])[0]["state"]
            )

        wait_until(lambda: {state("gone"), state("null")} == {"DEFERRED"}, 60, what="deferred")
        sql(
            db_path,
            "DELETE FROM trigger WHERE id = (SELECT trigger_id FROM task WHERE run_id = ?)",
            runs["gone"],
        )
        sql(db_path, "UPDATE task SET trigger_id = NULL WHERE run_id = ?", runs["null"])
        wait_until(lambda: {state("gone"), state("null")} == {"FAILED"}, 60, what="repaired")
        for name in ("gone", "null"):
            text = "\n".join(e["message"] or "" for e in events(db_path, runs[name], "wait"))
            assert "trigger row missing" in text, text

        def counted() -> bool:
            s, _ = scrape(url)
            got = sample(s, "slotless_triggerer_repaired_total", kind="deferred_trigger_missing")
            assert got == 2, got
            return True

        poll(counted, 30, "the repairs to be counted")
        assert worker.poll() is None and triggerer.poll() is None
    finally:
        stop_process(triggerer)
        stop_process(worker)
