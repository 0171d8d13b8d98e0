"""Limits on what a wait may carry: trigger kwargs over 64 KiB are refused when the task
defers (the task fails naming the size), describe() is clipped wherever it is shown, and a
wait's sampled check log stays bounded however long it waits."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
from support.helpers import async_wait_until, sql
from support.triggers import FlakyTrigger, log_text, serving, state_of

from executor import DAG
from executor.sensing import MAX_TRIGGER_KWARGS
from triggers.base import MAX_DESCRIBE
from triggers.files import FileTrigger

DAY = date(2026, 4, 25)

pytestmark = pytest.mark.usefixtures("fresh_triggers")

HUGE = "/data/" + "x" * (MAX_TRIGGER_KWARGS + 10)


def test_describe_is_clipped() -> None:
    text = FileTrigger(path="/in/" + "y" * 10_000_000).describe()
    assert len(text) < MAX_DESCRIBE + 60
    assert "more characters" in text


async def test_ctx_defer_with_huge_kwargs_fails_the_task_naming_the_size(store, db_path) -> None:
    dag = DAG("huge_defer")

    @dag.task
    def job(ctx):
        ctx.defer(FileTrigger(path=HUGE, poke_interval=1), method="done", timeout=30)

    @job.method
    def done(ctx):
        return 1

    @dag.task(parents=[job])
    def after(ctx):
        return 2

    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False):
        await async_wait_until(lambda: state_of(db_path, run_id, "job") == "FAILED", timeout=30)
    text = await log_text(store, run_id, "job")
    kwargs = FileTrigger(path=HUGE, poke_interval=1).serialize()[1]
    size = len(json.dumps(kwargs, sort_keys=True).encode())
    assert f"{size} bytes" in text and f"{MAX_TRIGGER_KWARGS} bytes (64 KiB)" in text
    assert "x" * 1000 not in text  # the value itself is not copied into the log
    assert not sql(db_path, "SELECT id FROM trigger")
    assert state_of(db_path, run_id, "after") == "UPSTREAM_FAILED"


async def test_deferrable_sensor_with_huge_kwargs_fails_instead_of_poking(store, db_path) -> None:
    dag = DAG("huge_sensor")
    dag.sensor("wait", FileTrigger(path=HUGE, poke_interval=1), mode="deferrable", timeout=30)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False):
        await async_wait_until(lambda: state_of(db_path, run_id, "wait") == "FAILED", timeout=30)
    text = await log_text(store, run_id, "wait")
    assert "over the limit of 65536 bytes" in text
    assert "reschedule" not in text
    assert len(text) < 5000


async def test_sampled_check_log_is_bounded_per_wait(store, db_path, tmp_path: Path) -> None:
    # A check whose result differs every time (a counter in the message) for 400 checks.
    dag = DAG("chatty")
    trigger = FlakyTrigger(name="chatty", failures=400, poke_interval=0.001)
    dag.sensor("wait", trigger, mode="deferrable", timeout=120)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"max_backoff": 0.001}):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait") == "SUCCESS", timeout=90, interval=0.1
        )
    lines = [
        r["message"]
        for r in sql(
            db_path,
            "SELECT message FROM task_event e JOIN task t ON t.id = e.task_row "
            "WHERE t.run_id = ? AND e.kind = 'check'",
            run_id,
        )
    ]
    assert any("try 1)" in line for line in lines)
    # 64 changed lines at most, then powers of two only: 65..400 holds 128 and 256.
    assert 60 <= len(lines) <= 64 + 2, len(lines)
