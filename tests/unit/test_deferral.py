"""Deferral from sync tasks: ctx.defer writes DEFERRED and the trigger row together, frees the
slot, and the task resumes at the named method with the event (any number of times)."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import date
from pathlib import Path

import pytest
from support.exchanging import claim, complete
from support.helpers import async_wait_until, sql
from support.triggers import (
    UnlistedTrigger,
    log_text,
    serving,
    slot_intervals,
    state_of,
    task_row,
    transition_events,
    transitions,
)

from executor import DAG
from executor.outcomes import Deferred, Outcome
from executor.sensing import deferral
from executor.store import recording
from triggers.files import FileTrigger

DAY = date(2026, 4, 25)

pytestmark = pytest.mark.usefixtures("fresh_triggers")


def file_trigger(path: Path, interval: float = 0.1) -> FileTrigger:
    return FileTrigger(path=str(path), poke_interval=interval)


def submit_and_wait_dag(inbox: Path, dag_id: str = "submit") -> DAG:
    dag = DAG(dag_id)

    @dag.task
    def job(ctx):
        ctx.log("submitted job 7")
        ctx.defer(
            file_trigger(inbox / "job-7.done"), method="finish", kwargs={"job_id": 7}, timeout=30
        )

    @job.method
    def finish(ctx, job_id):
        return {"job_id": job_id, "event": ctx.event, "attempt": ctx.attempt}

    return dag


async def test_defer_writes_deferred_and_the_trigger_row(store, db_path, tmp_path) -> None:
    dag = submit_and_wait_dag(tmp_path)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "job") == "DEFERRED", what="DEFERRED"
        )
    row = task_row(db_path, run_id, "job")
    expected = file_trigger(tmp_path / "job-7.done")
    (trig,) = sql(db_path, "SELECT * FROM trigger")
    assert row["trigger_id"] == trig["id"]
    assert trig["classpath"] == "triggers.files.FileTrigger"
    assert json.loads(trig["kwargs"]) == expected.serialize()[1]
    assert trig["poke_hash"] == expected.poke_hash()
    assert trig["shard"] == expected.shard()
    assert row["next_method"] == "finish"
    assert json.loads(row["next_kwargs"]) == {"job_id": 7}
    assert row["wait_timeout_at"] - row["wait_started_at"] == pytest.approx(30)
    assert row["owner"] is None and row["ready_at"] is None  # nobody holds it, nobody may claim
    assert row["attempt"] == 1
    last = transition_events(db_path, row["id"])[-1]
    assert (last["from_state"], last["to_state"]) == ("RUNNING", "DEFERRED")
    assert f"waiting for file://{tmp_path}/job-7.done" in last["message"]
    assert "gives up after 30 s" in last["message"]
    assert "submitted job 7" in await log_text(store, run_id, "job")


async def _claimed_deferral(store, dag, run_id, tmp_path) -> tuple[dict, Outcome]:
    (row,) = await claim(store, "owner-a", 1)
    d = deferral(
        file_trigger(tmp_path / "x"),
        method="finish",
        method_kwargs={},
        wait_started_at=store.clock(),
        timeout=None,
    )
    assert row.owner is not None
    o = Deferred(
        row_id=row.id, owner=row.owner, attempt=1, max_attempts=1, run_id=run_id, deferral=d
    )
    return asdict(row), o


async def test_deferred_state_and_trigger_row_commit_together(
    store, db_path, tmp_path, monkeypatch
) -> None:
    dag = submit_and_wait_dag(tmp_path)
    run_id = await store.runs.create_run(dag, DAY)
    _, outcome = await _claimed_deferral(store, dag, run_id, tmp_path)

    async def crash(*args, **kwargs):
        raise RuntimeError("crash between the trigger row and the state change")

    monkeypatch.setattr(recording, "transition", crash)
    with pytest.raises(RuntimeError, match="crash between"):
        await complete(store, [outcome])
    # Rolled back as one: no trigger row without a DEFERRED task, nor the other way round.
    assert sql(db_path, "SELECT * FROM trigger") == []
    assert task_row(db_path, run_id, "job")["trigger_id"] is None
    assert state_of(db_path, run_id, "job") == "RUNNING"

    monkeypatch.undo()
    await complete(store, [outcome])
    assert state_of(db_path, run_id, "job") == "DEFERRED"
    (trig,) = sql(db_path, "SELECT * FROM trigger")
    assert task_row(db_path, run_id, "job")["trigger_id"] == trig["id"]


async def test_a_stale_deferral_writes_no_trigger_row(store, db_path, tmp_path) -> None:
    dag = submit_and_wait_dag(tmp_path)
    run_id = await store.runs.create_run(dag, DAY)
    _, outcome = await _claimed_deferral(store, dag, run_id, tmp_path)
    outcome.owner = "someone-else"  # e.g. the attempt was reaped and claimed again
    await complete(store, [outcome])
    assert state_of(db_path, run_id, "job") == "RUNNING"
    assert sql(db_path, "SELECT * FROM trigger") == []


async def test_resume_at_the_named_method_with_the_event(store, db_path, tmp_path) -> None:
    dag = submit_and_wait_dag(tmp_path)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "job") == "DEFERRED", what="DEFERRED"
        )
        (tmp_path / "job-7.done").write_text("ok")
        await async_wait_until(
            lambda: state_of(db_path, run_id, "job") == "SUCCESS", what="SUCCESS"
        )
    row = task_row(db_path, run_id, "job")
    assert json.loads(row["output"]) == {
        "job_id": 7,
        "event": {"paths": [str(tmp_path / "job-7.done")]},
        "attempt": 1,
    }
    assert transitions(db_path, row["id"]) == [
        ("PENDING", "RUNNING"),
        ("RUNNING", "DEFERRED"),
        ("DEFERRED", "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]
    assert [s["kind"] for s in slot_intervals(db_path, row["id"])] == ["execute", "resume"]
    text = await log_text(store, run_id, "job")
    assert f"trigger fired: file://{tmp_path}/job-7.done" in text


async def test_default_resume_calls_the_task_again_with_the_event(store, db_path, tmp_path) -> None:
    dag = DAG("again")
    flag = tmp_path / "go"

    @dag.task
    def job(ctx):
        if ctx.event is None:
            ctx.defer(file_trigger(flag))
        return {"woken_by": ctx.event}

    run_id = await store.runs.create_run(dag, DAY)
    flag.write_text("")  # already there: fires at the first check
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "job") == "SUCCESS", what="SUCCESS"
        )
    assert json.loads(task_row(db_path, run_id, "job")["output"]) == {
        "woken_by": {"paths": [str(flag)]}
    }


async def test_the_slot_is_free_while_deferred(store, db_path, tmp_path) -> None:
    dag = DAG("one_slot")
    flag = tmp_path / "late.flag"

    @dag.task(priority=10)  # claimed first: it takes the only slot, then gives it back
    def waiter(ctx):
        ctx.defer(file_trigger(flag), method="after")

    @waiter.method
    def after(ctx):
        return "resumed"

    @dag.task
    def other(ctx):
        return "ran while waiter was deferred"

    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, slots=1):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "other") == "SUCCESS", what="other"
        )
        assert state_of(db_path, run_id, "waiter") == "DEFERRED"
        flag.write_text("")
        await async_wait_until(
            lambda: state_of(db_path, run_id, "waiter") == "SUCCESS", what="resume"
        )

    waiter_row = task_row(db_path, run_id, "waiter")
    ev = {
        (e["from_state"], e["to_state"]): e["ts"]
        for e in transition_events(db_path, waiter_row["id"])
    }
    deferred_from, deferred_to = ev[("RUNNING", "DEFERRED")], ev[("DEFERRED", "PENDING")]
    assert deferred_from < deferred_to
    held = slot_intervals(db_path, waiter_row["id"])
    assert [s["kind"] for s in held] == ["execute", "resume"]
    for s in held:  # no interval of the waiter's covers any part of its deferred period
        assert s["ended_at"] <= deferred_from or s["started_at"] >= deferred_to, s
    # ... and the only slot ran the other task inside that period.
    (other_slot,) = slot_intervals(db_path, task_row(db_path, run_id, "other")["id"])
    assert other_slot["slot"] == held[0]["slot"] == 0
    assert deferred_from <= other_slot["started_at"] <= other_slot["ended_at"] <= deferred_to


async def test_a_task_defers_several_times(store, db_path, tmp_path) -> None:
    dag = DAG("multi")

    @dag.task
    def poll(ctx):
        ctx.defer(file_trigger(tmp_path / "step1"), method="step", kwargs={"n": 1, "seen": []})

    @poll.method
    def step(ctx, n, seen):
        seen = [*seen, ctx.event["paths"][0]]
        if n < 3:
            ctx.defer(
                file_trigger(tmp_path / f"step{n + 1}"),
                method="step",
                kwargs={"n": n + 1, "seen": seen},
            )
        return {"steps": n, "seen": seen}

    run_id = await store.runs.create_run(dag, DAY)
    trigger_ids = []
    async with serving(store, dag):
        for n in (1, 2, 3):

            def deferred_for(n: int = n) -> bool:
                r = task_row(db_path, run_id, "poll")
                return r["state"] == "DEFERRED" and json.loads(r["next_kwargs"])["n"] == n

            await async_wait_until(deferred_for, what=f"deferral {n}")
            trigger_ids.append(task_row(db_path, run_id, "poll")["trigger_id"])
            (tmp_path / f"step{n}").write_text("")
        await async_wait_until(
            lambda: state_of(db_path, run_id, "poll") == "SUCCESS", what="SUCCESS"
        )
        # Trigger rows nobody waits on any more are deleted.
        await async_wait_until(lambda: not sql(db_path, "SELECT id FROM trigger"), what="cleanup")

    row = task_row(db_path, run_id, "poll")
    assert json.loads(row["output"]) == {
        "steps": 3,
        "seen": [str(tmp_path / f"step{n}") for n in (1, 2, 3)],
    }
    assert len(set(trigger_ids)) == 3
    moves = transitions(db_path, row["id"])
    assert moves.count(("RUNNING", "DEFERRED")) == 3
    assert moves.count(("DEFERRED", "PENDING")) == 3
    assert row["attempt"] == 1  # deferring is not failing
    assert [s["kind"] for s in slot_intervals(db_path, row["id"])] == [
        "execute",
        "resume",
        "resume",
        "resume",
    ]


async def test_defer_from_a_process_isolated_slot(store, db_path, tmp_path) -> None:
    dag = submit_and_wait_dag(tmp_path, "isolated")
    (tmp_path / "job-7.done").write_text("")
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, isolation="process"):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "job") == "SUCCESS", what="SUCCESS"
        )
    out = json.loads(task_row(db_path, run_id, "job")["output"])
    assert out["job_id"] == 7 and out["event"] == {"paths": [str(tmp_path / "job-7.done")]}


async def test_a_missing_method_fails_at_once_with_a_clear_message(
    store, db_path, tmp_path
) -> None:
    dag = DAG("typo")

    @dag.task
    def job(ctx):
        ctx.defer(file_trigger(tmp_path / "never"), method="finsh", timeout=3600)

    @job.method
    def finish(ctx):
        return 1

    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(lambda: state_of(db_path, run_id, "job") == "FAILED", what="FAILED")
    row = task_row(db_path, run_id, "job")
    # It never waited: a typo must not cost a 14-hour wait before it is reported.
    assert ("RUNNING", "DEFERRED") not in transitions(db_path, row["id"])
    text = await log_text(store, run_id, "job")
    assert "no method 'finsh'" in text
    assert sql(db_path, "SELECT * FROM trigger") == []


async def test_a_method_gone_at_resume_time_fails_with_a_clear_message(
    store, db_path, tmp_path
) -> None:
    dag = submit_and_wait_dag(tmp_path, "gone")
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "job") == "DEFERRED", what="DEFERRED"
        )
        # The DAG changed while the task waited: its resume point no longer exists.
        del dag.tasks["job"].methods["finish"]
        (tmp_path / "job-7.done").write_text("")
        await async_wait_until(lambda: state_of(db_path, run_id, "job") == "FAILED", what="FAILED")
    text = await log_text(store, run_id, "job")
    assert "cannot resume: job has no method 'finish'" in text


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: (UnlistedTrigger(name="x"), {}), "is not allow-listed"),
        (lambda p: (file_trigger(p), {"handle": object()}), "not JSON serializable"),
    ],
    ids=["not-allow-listed", "kwargs-not-json"],
)
async def test_a_deferral_that_cannot_be_stored_fails_the_task(
    store, db_path, tmp_path, make, why
) -> None:
    dag = DAG("cannot")
    trigger, kwargs = make(tmp_path / "f")

    @dag.task
    def job(ctx):
        ctx.defer(trigger, kwargs=kwargs)

    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(lambda: state_of(db_path, run_id, "job") == "FAILED", what="FAILED")
    text = await log_text(store, run_id, "job")
    assert f"cannot defer on {trigger.describe()}" in text and why in text
    assert sql(db_path, "SELECT * FROM trigger") == []


async def test_a_retry_after_a_resume_starts_the_task_over(store, db_path, tmp_path) -> None:
    dag = DAG("retry_resume")
    flag = tmp_path / "ready"
    flag.write_text("")
    calls: list[tuple] = []

    @dag.task(retries=1, retry_delay=0)
    def job(ctx):
        calls.append(("start", ctx.attempt, ctx.event))
        ctx.defer(file_trigger(flag), method="finish")

    @job.method
    def finish(ctx):
        calls.append(("finish", ctx.attempt, ctx.event))
        if ctx.attempt == 1:
            raise RuntimeError("lost the job's result")
        return ctx.event

    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "job") == "SUCCESS", what="SUCCESS"
        )
    event = {"paths": [str(flag)]}
    assert calls == [
        ("start", 1, None),
        ("finish", 1, event),
        ("start", 2, None),  # like a first attempt: no stale resume point, no stale event
        ("finish", 2, event),
    ]
