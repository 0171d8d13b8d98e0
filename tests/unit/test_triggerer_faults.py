"""Bad input and faults in the triggerer: each fails only the tasks it concerns, with the
reason in their log, while a bystander waiting on a file keeps being served."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
from datetime import date
from pathlib import Path

import pytest
from support.helpers import async_wait_until, ops, sql
from support.triggers import (
    FLAGS,
    BlockingTrigger,
    FlagTrigger,
    FlakyTrigger,
    NotJsonTrigger,
    RaisingTrigger,
    log_text,
    pokes_of,
    serving,
    state_of,
    task_row,
    transitions,
)

from executor import DAG
from triggers.base import SHARDS, BaseTrigger
from triggers.files import FileTrigger

DAY = date(2026, 4, 25)

pytestmark = pytest.mark.usefixtures("fresh_triggers")


def victim_dag(
    inbox: Path,
    victims: dict[str, BaseTrigger],
    *,
    timeout: float | None = None,
    retries: int = 0,
) -> DAG:
    """One task per victim trigger, plus ``bystander`` waiting for ``inbox/bystander.flag``."""
    dag = DAG("faults")

    def add(task_id: str, trigger: BaseTrigger, task_timeout: float | None, n_retries: int):
        def body(ctx):
            ctx.defer(trigger, method="done", timeout=task_timeout)

        spec = dag.task(body, task_id=task_id, retries=n_retries)

        def done(ctx):
            return ctx.event

        spec.method(done)

    for task_id, trigger in victims.items():
        add(task_id, trigger, timeout, retries)
    add("bystander", FileTrigger(path=str(inbox / "bystander.flag"), poke_interval=0.1), None, 0)
    return dag


async def bystander_still_served(store, db_path: Path, run_id: str, inbox: Path) -> None:
    assert state_of(db_path, run_id, "bystander") == "DEFERRED"
    (inbox / "bystander.flag").write_text("")
    await async_wait_until(
        lambda: state_of(db_path, run_id, "bystander") == "SUCCESS", what="the bystander"
    )
    out = json.loads(task_row(db_path, run_id, "bystander")["output"])
    assert out == {"paths": [str(inbox / "bystander.flag")]}


def all_deferred(db_path: Path, run_id: str, task_ids) -> bool:
    return all(state_of(db_path, run_id, t) == "DEFERRED" for t in task_ids)


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        (
            "classpath",
            "acme.triggers.GoneTrigger",
            "cannot load trigger: trigger class acme.triggers.GoneTrigger is not allow-listed",
        ),
        (
            "kwargs",
            '{"path": ""}',
            "cannot load trigger: invalid kwargs for triggers.files.FileTrigger: "
            "path: Value error, path must not be empty",
        ),
        (
            "kwargs",
            '{"path": "/in/a.csv", "poke_interval": -1}',
            "invalid kwargs for triggers.files.FileTrigger: poke_interval:",
        ),
        (
            "kwargs",
            "{truncated",
            "cannot load trigger: invalid kwargs for triggers.files.FileTrigger",
        ),
    ],
    ids=["unknown-classpath", "empty-path", "negative-interval", "not-json"],
)
async def test_a_trigger_row_that_cannot_load_fails_its_task(
    store, db_path, tmp_path, column, value, reason
) -> None:
    dag = victim_dag(tmp_path, {"victim": FileTrigger(path=str(tmp_path / "v"), poke_interval=0.1)})
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False) as h:
        await async_wait_until(lambda: all_deferred(db_path, run_id, ["victim", "bystander"]))
        trigger_id = task_row(db_path, run_id, "victim")["trigger_id"]
        # A row written by something else (an old version, a hand edit, a bad migration).
        # In a thread: the worker serving on this loop may hold the write lock meanwhile.
        await asyncio.to_thread(
            sql, db_path, f"UPDATE trigger SET {column} = ? WHERE id = ?", value, trigger_id
        )
        await h.start_triggerer()
        await async_wait_until(
            lambda: state_of(db_path, run_id, "victim") == "FAILED", what="FAILED"
        )
        await bystander_still_served(store, db_path, run_id, tmp_path)
    assert reason in await log_text(store, run_id, "victim")


async def test_an_allow_listed_class_that_cannot_be_imported(
    store, db_path, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("SLOTLESS_ALLOWED_TRIGGERS", "acme_missing.Trigger")
    dag = victim_dag(tmp_path, {"victim": FlagTrigger(name="v", poke_interval=0.1)})
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False) as h:
        await async_wait_until(lambda: all_deferred(db_path, run_id, ["victim", "bystander"]))
        trigger_id = task_row(db_path, run_id, "victim")["trigger_id"]
        sql(
            db_path,
            "UPDATE trigger SET classpath = ? WHERE id = ?",
            "acme_missing.Trigger",
            trigger_id,
        )
        await h.start_triggerer()
        await async_wait_until(
            lambda: state_of(db_path, run_id, "victim") == "FAILED", what="FAILED"
        )
        await bystander_still_served(store, db_path, run_id, tmp_path)
    text = await log_text(store, run_id, "victim")
    assert "cannot load trigger: cannot import trigger class acme_missing.Trigger" in text


async def test_a_trigger_module_that_raises_on_import_fails_only_its_task(
    store, db_path, tmp_path, monkeypatch
) -> None:
    """Not an ImportError: the module raises KeyError (a setting missing on the triggerer's
    host). It must fail its own task, not stop every load of the shard."""
    (tmp_path / "acme_needs_env.py").write_text('import os\nTOKEN = os.environ["ACME_TOKEN"]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SLOTLESS_ALLOWED_TRIGGERS", "acme_needs_env.Trigger")
    dag = victim_dag(tmp_path, {"victim": FlagTrigger(name="v", poke_interval=0.1)})
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False) as h:
        await async_wait_until(lambda: all_deferred(db_path, run_id, ["victim", "bystander"]))
        trigger_id = task_row(db_path, run_id, "victim")["trigger_id"]
        await asyncio.to_thread(
            sql, db_path, "UPDATE trigger SET classpath = ? WHERE id = ?",
            "acme_needs_env.Trigger", trigger_id,
        )  # fmt: skip
        await h.start_triggerer()
        await async_wait_until(
            lambda: state_of(db_path, run_id, "victim") == "FAILED", what="FAILED"
        )
        await bystander_still_served(store, db_path, run_id, tmp_path)
    text = await log_text(store, run_id, "victim")
    assert "cannot load trigger" in text and "ACME_TOKEN" in text


async def test_an_event_payload_json_cannot_hold_fails_its_task(store, db_path, tmp_path) -> None:
    dag = victim_dag(tmp_path, {"victim": NotJsonTrigger(name="when", poke_interval=0.1)})
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "victim") == "FAILED", what="FAILED"
        )
        await bystander_still_served(store, db_path, run_id, tmp_path)
    text = await log_text(store, run_id, "victim")
    assert "cannot handle the result of NotJsonTrigger(name='when')" in text
    assert "not JSON serializable" in text


async def test_a_trigger_that_raises_fails_its_tasks_with_the_traceback(
    store, db_path, tmp_path
) -> None:
    boom = RaisingTrigger(name="npci", poke_interval=0.1)
    dag = victim_dag(tmp_path, {"victim_a": boom, "victim_b": boom})
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False) as h:
        await async_wait_until(lambda: all_deferred(db_path, run_id, ["victim_a", "victim_b"]))
        trig = await h.start_triggerer()  # both waits in its first load: one check for both
        for t in ("victim_a", "victim_b"):

            def failed(t: str = t) -> bool:
                return state_of(db_path, run_id, t) == "FAILED"

            await async_wait_until(failed, what=t)
        await bystander_still_served(store, db_path, run_id, tmp_path)
        assert trig.checks_failed >= 1
    assert len(pokes_of("npci")) == 1  # one check for both, and no retry of a real error
    for t in ("victim_a", "victim_b"):
        text = await log_text(store, run_id, t)
        assert "trigger RaisingTrigger(name='npci') raised TriggerBug: bucket npci exploded" in text
        assert "Traceback (most recent call last)" in text
        assert "in poke" in text  # the frame that raised
        assert task_row(db_path, run_id, t)["attempt"] == 1


async def test_a_trigger_error_uses_the_tasks_retries(store, db_path, tmp_path) -> None:
    dag = victim_dag(
        tmp_path, {"victim": RaisingTrigger(name="again", poke_interval=0.1)}, retries=1
    )
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "victim") == "FAILED", what="FAILED"
        )
        await bystander_still_served(store, db_path, run_id, tmp_path)
    row = task_row(db_path, run_id, "victim")
    assert row["attempt"] == 2
    moves = transitions(db_path, row["id"])
    assert moves.count(("DEFERRED", "RETRYING")) == 1
    assert moves[-1] == ("DEFERRED", "FAILED")
    text = await log_text(store, run_id, "victim")
    assert "raised TriggerBug: bucket again exploded" in text and "; will retry" in text
    # The retry started the task over (it deferred again), not at its resume method.
    assert moves.count(("RUNNING", "DEFERRED")) == 2
    assert len(pokes_of("again")) == 2


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        ("transient", "TransientError: flaky throttled (try 1)"),
        ("oserror", "ConnectionRefusedError: server for flaky refused (try 1)"),
    ],
)
async def test_a_passing_failure_is_retried_with_backoff(
    store, db_path, tmp_path, error, logged
) -> None:
    interval = 0.05
    dag = victim_dag(
        tmp_path,
        {"victim": FlakyTrigger(name="flaky", failures=3, error=error, poke_interval=interval)},
    )
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(lambda: len(pokes_of("flaky")) >= 2, what="a retry")
        assert state_of(db_path, run_id, "victim") == "DEFERRED"  # still waiting, not failed
        await async_wait_until(
            lambda: state_of(db_path, run_id, "victim") == "SUCCESS", what="SUCCESS"
        )
        await bystander_still_served(store, db_path, run_id, tmp_path)
    pokes = pokes_of("flaky")
    assert len(pokes) == 4
    gaps = [b - a for a, b in itertools.pairwise(pokes)]
    for k, gap in enumerate(gaps, start=1):  # interval * 2**failures
        assert gap >= interval * 2**k - 1e-6, gaps
    row = task_row(db_path, run_id, "victim")
    assert json.loads(row["output"]) == {"name": "flaky", "tries": 4}
    assert row["attempt"] == 1
    assert ("DEFERRED", "PENDING") in transitions(db_path, row["id"])
    text = await log_text(store, run_id, "victim")
    assert f"check of FlakyTrigger(name='flaky', failures=3, error='{error}') failed" in text
    assert f"({logged}); retry 1 in {interval * 2:g} s" in text


async def test_a_trigger_that_blocks_the_loop_is_named_in_the_log(store, db_path, tmp_path) -> None:
    dag = victim_dag(
        tmp_path, {"victim": BlockingTrigger(name="sleepy", block=0.6, poke_interval=0.1)}
    )
    run_id = await store.runs.create_run(dag, DAY)
    culprit = "support.triggers.BlockingTrigger"

    async def blocked_in_log() -> bool:
        return culprit in await log_text(store, run_id, "victim")

    async with serving(store, dag) as h:
        await async_wait_until(blocked_in_log, what="the block in the victim's log")
        assert h.triggerer is not None and h.triggerer.watch.blocked[culprit] >= 1
        # Detected, not punished: the task waits on; the others are served, slower.
        assert state_of(db_path, run_id, "victim") == "DEFERRED"
        await bystander_still_served(store, db_path, run_id, tmp_path)
        FLAGS.add("sleepy")
        await async_wait_until(
            lambda: state_of(db_path, run_id, "victim") == "SUCCESS", what="SUCCESS"
        )
    text = await log_text(store, run_id, "victim")
    assert "event loop blocked for" in text and f"by trigger class {culprit}" in text
    # The bystander's log does not blame it.
    assert culprit not in await log_text(store, run_id, "bystander")


async def test_a_trigger_that_never_fires_ends_at_the_task_timeout(
    store, db_path, tmp_path
) -> None:
    dag = victim_dag(
        tmp_path, {"victim": FlagTrigger(name="never", poke_interval=0.05)}, timeout=0.5
    )
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "victim") == "FAILED", what="FAILED"
        )
        checks = len(pokes_of("never"))
        await bystander_still_served(store, db_path, run_id, tmp_path)
        # Nobody waits on the check any more: it stops, and its row goes.
        await async_wait_until(lambda: not sql(db_path, "SELECT id FROM trigger"), what="cleanup")
    assert len(pokes_of("never")) <= checks + 1
    row = task_row(db_path, run_id, "victim")
    assert row["ended_at"] - row["wait_started_at"] >= 0.5
    assert "sensor timeout: the condition did not hold within" in await log_text(
        store, run_id, "victim"
    )


async def test_a_write_cancelled_while_another_process_holds_the_lock(store, db_path) -> None:
    # What a triggerer's stop() does to a loop waiting for the write lock: it must still be
    # able to hand its shards back afterwards, and must not keep the file locked.
    other = sqlite3.connect(str(db_path), isolation_level=None, timeout=30)
    try:
        other.execute("BEGIN IMMEDIATE")  # e.g. a worker process committing
        waiting = asyncio.create_task(ops(store).lease_shards("trig-a", 2.0, 2.0))
        await asyncio.sleep(0)  # started: its BEGIN is queued behind the other's lock
        waiting.cancel()
        other.execute("COMMIT")
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await ops(store).lease_shards("trig-a", 2.0, 2.0) == set(range(SHARDS))
        await ops(store).triggerer_leave("trig-a")
        other.execute("PRAGMA busy_timeout = 1000")
        other.execute("BEGIN IMMEDIATE")  # nobody holds the file locked any more
        other.execute("COMMIT")
    finally:
        other.close()
    assert sql(db_path, "SELECT owner FROM shard_lease WHERE owner IS NOT NULL") == []
