"""Retries: exponential backoff with jitter on an injected clock, the RETRYING row's ready
time, the attempt counter, and tasks taken back from workers that stopped heartbeating."""

from __future__ import annotations

import asyncio
import re
from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.exchanging import claim, complete
from support.helpers import FakeClock, async_wait_until, attempt_of, sql

from executor import DAG
from executor.outcomes import Failed, Outcome, Succeeded
from executor.rows import MovedTask
from executor.store import Store
from executor.worker import Worker


def one_task_dag(retries: int, **kw) -> DAG:
    dag = DAG("retry")
    dag.task(lambda ctx: None, task_id="flaky", retries=retries, **kw)

    @dag.task(parents=["flaky"])
    def after(ctx):
        return "after"

    return dag


def error(row: MovedTask, delay: float, message: str = "ValueError: no") -> Outcome:
    return Failed(**attempt_of(row), message=message, retry_delay=delay)


def flaky_row(db_path, run_id: str) -> dict:
    return sql(db_path, "SELECT * FROM task WHERE run_id = ? AND task_id = 'flaky'", run_id)[0]


async def test_retrying_row_is_claimable_only_from_its_ready_time(
    fake_store: Store, clock: FakeClock, db_path
) -> None:
    run_id = await fake_store.runs.create_run(one_task_dag(retries=2), date(2026, 4, 1))
    (row,) = await claim(fake_store, "w#1", 5)
    assert (row.task_id, row.attempt, row.max_attempts) == ("flaky", 1, 3)

    failed_at = clock.now
    await complete(fake_store, [error(row, 30.0)])
    r = flaky_row(db_path, run_id)
    assert (r["state"], r["attempt"], r["ready_at"]) == ("RETRYING", 2, failed_at + 30.0)
    assert r["owner"] is None

    assert await claim(fake_store, "w#2", 5) == []
    clock.advance(29.9)
    assert await claim(fake_store, "w#2", 5) == []
    clock.advance(0.1)
    (again,) = await claim(fake_store, "w#2", 5)
    assert (again.id, again.attempt, again.state) == (row.id, 2, "RUNNING")

    # the last attempt fails for good; the child is UPSTREAM_FAILED, the run FAILED
    await complete(fake_store, [error(again, 60.0)])
    clock.advance(60)
    (third,) = await claim(fake_store, "w#3", 5)
    assert third.attempt == 3
    await complete(fake_store, [error(third, 120.0, "ValueError: still no")])
    r = flaky_row(db_path, run_id)
    assert (r["state"], r["attempt"], r["ready_at"]) == ("FAILED", 3, None)
    info = await fake_store.views.run_info(run_id)
    assert info is not None and info["state"] == "FAILED"
    assert await claim(fake_store, "w#4", 5) == []

    log = [
        (e["from_state"], e["to_state"], e["attempt"], e["message"])
        for e in (await fake_store.views.task_log(run_id, "flaky") or [])
        if e["kind"] == "transition"
    ]
    assert log == [
        ("PENDING", "RUNNING", 1, "claimed by w#1"),
        ("RUNNING", "RETRYING", 2, "attempt 1 of 3 failed: ValueError: no; retrying in 30.0 s"),
        ("RETRYING", "RUNNING", 2, "claimed by w#2"),
        ("RUNNING", "RETRYING", 3, "attempt 2 of 3 failed: ValueError: no; retrying in 60.0 s"),
        ("RETRYING", "RUNNING", 3, "claimed by w#3"),
        ("RUNNING", "FAILED", 3, "attempt 3 of 3 failed: ValueError: still no"),
    ]


def test_backoff_schedule() -> None:
    dag = DAG("backoff")
    t = dag.task(
        lambda ctx: None,
        task_id="t",
        retry_delay=10,
        retry_backoff=2,
        retry_jitter=0.1,
        max_retry_delay=100,
    )
    # rand 0.5 is the middle of the jitter band: no jitter
    assert [t.retry_delay_for(a, 0.5) for a in range(1, 6)] == [10, 20, 40, 80, 100]
    assert t.retry_delay_for(1, 0.0) == pytest.approx(9.0)
    assert t.retry_delay_for(2, 0.999999) == pytest.approx(22.0, abs=1e-4)
    assert t.retry_delay_for(30, 0.75) == pytest.approx(105.0)  # the cap, then jitter


@given(
    attempt=st.integers(1, 40),
    rand=st.floats(0, 1, exclude_max=True),
    delay=st.floats(0, 600),
    backoff=st.floats(1, 4),
    jitter=st.floats(0, 1),
)
def test_jitter_stays_within_its_band(attempt, rand, delay, backoff, jitter) -> None:
    dag = DAG("band")
    t = dag.task(
        lambda ctx: None,
        task_id="t",
        retry_delay=delay,
        retry_backoff=backoff,
        retry_jitter=jitter,
        max_retry_delay=3600,
    )
    base = min(3600.0, delay * backoff ** (attempt - 1))
    got = t.retry_delay_for(attempt, rand)
    assert base * (1 - jitter) - 1e-9 <= got <= base * (1 + jitter) + 1e-9
    assert got >= 0


async def test_worker_retries_with_backoff_on_the_injected_clock(
    fake_store: Store, clock: FakeClock, db_path
) -> None:
    """A worker computes each delay from the task's policy and its injected ``rand``; the
    next attempt starts only once the injected clock reaches the recorded ready time."""
    attempts_seen: list[int] = []
    dag = DAG("backoff_run")

    @dag.task(retries=3, retry_delay=10, retry_backoff=2, retry_jitter=0.1)
    def flaky(ctx):
        attempts_seen.append(ctx.attempt)
        if ctx.attempt < 4:
            raise RuntimeError(f"attempt {ctx.attempt} fails")
        return {"ok": ctx.attempt}

    run_id = await fake_store.runs.create_run(dag, date(2026, 4, 1))
    worker = Worker(
        fake_store,
        dags={dag.dag_id: dag},
        slots=2,
        poll_interval=0.01,
        rand=lambda: 0.75,
        heartbeat_interval=3600,
        stale_after=1e9,
    )
    serving = asyncio.create_task(worker.run())
    try:
        expected = [10.5, 21.0, 42.0]  # 10 * 2**k, times 1 + 0.1 * (2 * 0.75 - 1)
        for attempt, delay in enumerate(expected, start=1):

            async def retrying(attempt=attempt):
                r = flaky_row(db_path, run_id)
                return r if r["state"] == "RETRYING" and r["attempt"] == attempt + 1 else None

            r = await async_wait_until(retrying, what=f"attempt {attempt} to fail")
            assert r["ready_at"] == pytest.approx(clock.now + delay)
            # not before its time, whoever asks
            clock.advance(delay - 0.01)
            assert await claim(fake_store, "probe", 10) == []
            assert flaky_row(db_path, run_id)["state"] == "RETRYING"
            clock.set(r["ready_at"])

        async def ended():
            info = await fake_store.views.run_info(run_id)
            return info is not None and info["state"] != "RUNNING" and info

        info = await async_wait_until(ended, what="the run to end")
    finally:
        worker.stop()
        await asyncio.wait_for(serving, 10)
    assert info["state"] == "SUCCESS"
    assert attempts_seen == [1, 2, 3, 4]
    r = flaky_row(db_path, run_id)
    assert (r["state"], r["attempt"], r["output"]) == ("SUCCESS", 4, '{"ok": 4}')
    messages = [
        e["message"]
        for e in (await fake_store.views.task_log(run_id, "flaky") or [])
        if e["to_state"] == "RETRYING"
    ]
    delays = [float(d) for m in messages for d in re.findall(r"retrying in ([\d.]+) s", m)]
    assert delays == expected
    assert all("RuntimeError: attempt" in m for m in messages)
    # each failed attempt left its traceback in the log
    errors = [
        e for e in (await fake_store.views.task_log(run_id, "flaky") or []) if e["kind"] == "error"
    ]
    assert [e["attempt"] for e in errors] == [1, 2, 3]
    assert all("Traceback" in e["message"] for e in errors)


async def test_lost_worker_is_reaped_and_the_attempt_retried(
    fake_store: Store, clock: FakeClock, db_path
) -> None:
    created_at = clock.now
    run_id = await fake_store.runs.create_run(one_task_dag(retries=1), date(2026, 4, 1))
    clock.advance(3)
    (row,) = await claim(fake_store, "dead#1", 1)
    clock.advance(20)
    assert await fake_store.exchange.reap(stale_after=30) == 0
    assert await fake_store.exchange.heartbeat("someone-else#1", [row.id]) == []
    assert await fake_store.exchange.heartbeat("dead#1", [row.id]) == [row.id]
    clock.advance(25)  # 45 s after the claim, 25 s after the last heartbeat
    assert await fake_store.exchange.reap(stale_after=30) == 0
    clock.advance(6)
    assert await fake_store.exchange.reap(stale_after=30) == 1
    r = flaky_row(db_path, run_id)
    # Claimable at once, at the head of its run's queue (as if ready since the run was
    # created): a lost worker is not the task's fault, so it does not go behind
    # everything that became runnable since.
    assert (r["state"], r["attempt"], r["owner"], r["ready_at"]) == (
        "RETRYING",
        2,
        None,
        created_at,
    )
    last = [e for e in await fake_store.views.task_log(run_id, "flaky") or []][-1]
    assert last["message"] == "worker dead#1 lost: no heartbeat for 31.0 s; will retry"
    assert await fake_store.exchange.reap(stale_after=30) == 0  # a second reap finds nothing

    # the lost worker wakes up and reports: nothing changes
    await complete(
        fake_store,
        [
            Succeeded(
                row_id=row.id,
                owner="dead#1",
                attempt=1,
                max_attempts=2,
                output_json='"zombie"',
                run_id=run_id,
            )
        ],
    )
    assert flaky_row(db_path, run_id)["output"] is None
    assert flaky_row(db_path, run_id)["state"] == "RETRYING"

    (again,) = await claim(fake_store, "alive#1", 1)
    assert again.attempt == 2
    # the new owner's attempt dies too, with no attempt left: FAILED, child UPSTREAM_FAILED
    clock.advance(31)
    assert await fake_store.exchange.reap(stale_after=30) == 1
    states = {t["task_id"]: t["state"] for t in await fake_store.views.run_tasks(run_id)}
    assert states == {"flaky": "FAILED", "after": "UPSTREAM_FAILED"}
    assert (await fake_store.views.run_info(run_id) or {})["state"] == "FAILED"
