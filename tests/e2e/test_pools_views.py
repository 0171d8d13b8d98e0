"""Pools and queues as people see them: `slotless status` (text and JSON), the web page and
the metrics endpoint, with a full pool and a queue nobody serves."""

from __future__ import annotations

import json
from datetime import date
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.exchanging import claim
from support.helpers import cli, cli_env, free_port, start_cli, stop_process
from support.ops import http_get, wait_for_http

from executor import DAG
from executor.store import Store

pytestmark = pytest.mark.slow


def noop(ctx: Any) -> None:
    return None


async def full_pool(store: Store) -> str:
    """A run with warehouse (1 slot) full, one more of it ready, and a gpu task ready."""
    await store.pools.set_pool("warehouse", 1)
    await store.pools.add_queue("gpu")
    dag = DAG("views")
    dag.task(noop, task_id="load_a", pool="warehouse")
    dag.task(noop, task_id="load_b", pool="warehouse")
    dag.task(noop, task_id="train", queue="gpu")
    run_id = await store.runs.create_run(dag, date(2026, 6, 1))
    [claimed] = await claim(store, "w", 10)
    assert claimed.task_id == "load_a"
    return run_id


async def test_status_the_page_and_the_metrics_show_pool_waits(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    run_id = await full_pool(store)
    text = cli("status", "--db", db_url, env=cli_env(COLUMNS="240"))  # no wrapping
    assert text.returncode == 0, text.stderr
    out = " ".join(text.stdout.split())
    assert "waiting for pool warehouse (1/1 used)" in out
    assert "waiting for a worker of queue gpu (no live worker serves it)" in out
    assert "queue gpu: 1 task(s) ready, no live worker serves it" in out
    data = json.loads(cli("status", "--db", db_url, "--json").stdout)
    pools = {p["name"]: p for p in data["pools"]}
    assert pools["warehouse"] == {"name": "warehouse", "slots": 1, "used": 1, "ready": 1}
    assert pools["default"]["slots"] is None
    held = {t["task_id"]: t for t in data["held_back"]}
    assert set(held) == {"load_b", "train"}  # load_a runs; nothing else is held back
    assert held["load_b"]["state"] == "PENDING" and held["load_b"]["pool"] == "warehouse"

    # The web page: the pool table and the held-back tasks, apart from the other waits.
    port = free_port()
    log = tmp_path / "ui.log"
    ui = start_cli("ui", "--db", db_url, "--port", str(port), log=log)
    try:
        status, html = wait_for_http(f"http://127.0.0.1:{port}/", ui, log)
        assert status == 200
        assert "Pools and queues" in html
        assert '<tr data-pool="warehouse">' in html and '<td class="used">1/1</td>' in html
        assert "waiting for pool warehouse (1/1 used)" in html
        assert "queue gpu: 1 task(s) ready, no live worker serves it" in html
        # The run's page: the held task's box and row say what it waits for.
        status, page = http_get(f"http://127.0.0.1:{port}/runs/{quote(run_id, safe='')}")
        assert status == 200
        assert escape("pool warehouse (1/1 used)") in page
        assert escape("queue gpu (no live worker serves it)") in page
        status, live = http_get(f"http://127.0.0.1:{port}/api/live/")  # the page's poll
        assert status == 200
        block = json.loads(live)["blocks"]["live_index"]  # the same template's block
        assert '<tr data-pool="warehouse">' in block and '<td class="used">1/1</td>' in block
    finally:
        assert stop_process(ui) == 0, log.read_text()

    # The metrics: a worker's endpoint reports the store-wide pool and queue gauges.
    mport = free_port()
    wlog = tmp_path / "worker.log"
    worker = start_cli(
        "worker", "--db", db_url, "--metrics-port", str(mport), "--queues", "default",
        "--slots", "1", log=wlog,
    )  # fmt: skip
    try:
        _, body = wait_for_http(f"http://127.0.0.1:{mport}/metrics", worker, wlog)
    finally:
        stop_process(worker)
    lines = set(body.splitlines())
    assert 'slotless_pool_slots{pool="warehouse"} 1.0' in lines
    assert 'slotless_pool_slots{pool="default"} +Inf' in lines
    assert 'slotless_queue_workers{queue="gpu"} 0.0' in lines
    assert 'slotless_queue_tasks_ready{queue="gpu"} 1.0' in lines
    # (slots used and ready move as the worker runs: present, whatever their values)
    assert any(line.startswith('slotless_pool_slots_used{pool="warehouse"}') for line in lines)
    assert any(line.startswith('slotless_pool_tasks_ready{pool="warehouse"}') for line in lines)
