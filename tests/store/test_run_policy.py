"""Run policies on both backends, as the store and the triggerer's outbox see them: a run's
deadline, dagrun_timeout and a sensor's expected_by are run waits loaded beside the tasks'
waits, fired once (a replay does nothing, nor does a fire after the run ended); fail_fast
stops a run at its first failed task; pause holds it until it is resumed or cleared."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from support import backends
from support.exchanging import claim, complete
from support.helpers import FakeClock, attempt_of, held_as_loaded, loaded_waits, ops

from executor import DAG
from executor.outcomes import Deferral, Deferred, Failed, Succeeded
from executor.schedules import Schedule
from executor.statemachine import transition
from executor.states import State
from executor.store import Store, open_store
from executor.store.control import ControlError
from executor.store.runs import NewRun, RunShape, insert_run, scheduled_run_key
from triggerer.store import Fire, TriggererBatch
from triggerer.waitref import WaitKind, unpack
from triggers.temporal import DateTimeTrigger

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

KOLKATA = ZoneInfo("Asia/Kolkata")
DAY = date(2026, 11, 20)
T0 = datetime(2026, 11, 20, 3, 0, tzinfo=KOLKATA).timestamp()  # 03:00 on the DAG's clock


def never() -> DateTimeTrigger:
    return DateTimeTrigger(moment=datetime(2100, 1, 1, tzinfo=UTC))


def noop(ctx: Any) -> None:
    return None


def settlements(**options: Any) -> DAG:
    dag = DAG("settlements", timezone="Asia/Kolkata", **options)
    wait = dag.sensor("wait_for_file", never(), expected_by="05:30", timeout="14h")
    dag.task(noop, task_id="load", parents=[wait])
    return dag


async def run_waits(store: Store) -> dict[int, int]:
    """Every run wait the triggerer would load: subscriber key -> trigger id."""
    return await loaded_waits(store, "run")


async def wait_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    async with store.db.read() as tx:
        return [dict(r) for r in await tx.fetch("run_waits_of", run_id=run_id)]


async def fire(store: Store, waits: dict[int, int]) -> None:
    await ops(store).triggerer_commit(
        TriggererBatch(fires=[Fire(waits, json.dumps({"moment": "x"}), "time came")])
    )


async def states(store: Store, run_id: str) -> dict[str, str]:
    return {r["task_id"]: r["state"] for r in await store.views.run_tasks(run_id)}


async def log_of(store: Store, run_id: str, task_id: str, kind: str) -> list[str]:
    rows = await store.views.task_log(run_id, task_id) or []
    return [r["message"] for r in rows if r["kind"] == kind]


async def test_a_run_wait_is_loaded_under_its_key_and_counted_in_its_shards_checksum(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    await store.runs.create_run(settlements(deadline="06:00"), DAY)
    waits = await run_waits(store)
    assert len(waits) == 2 and {unpack(key)[0] for key in waits} == {WaitKind.RUN}
    table = await held_as_loaded(store)
    held = {key: check.subscribers[key].trigger_id for key, check in table.by_row.items()}
    assert held == waits


async def test_deadline_and_expected_by_are_moments_on_the_dags_clock_fired_once(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    run_id = await store.runs.create_run(settlements(deadline="06:00"), DAY)
    run = await store.views.run_info(run_id)
    assert run is not None
    # A manual run of 2026-11-20: 06:00 and 05:30 that day, India time.
    assert run["deadline_at"] == datetime(2026, 11, 20, 6, 0, tzinfo=KOLKATA).timestamp()
    late_at = json.loads(run["late_at"])
    assert late_at == {"wait_for_file": datetime(2026, 11, 20, 5, 30, tzinfo=KOLKATA).timestamp()}
    kinds = sorted((w["kind"], w["task_id"]) for w in await wait_rows(store, run_id))
    assert kinds == [("deadline", ""), ("late", "wait_for_file")]
    waits = await run_waits(store)
    assert len(waits) == 2  # held by the triggerer beside the tasks' waits

    clock.set(datetime(2026, 11, 20, 6, 0, 1, tzinfo=KOLKATA).timestamp())
    await fire(store, waits)
    run = await store.views.run_info(run_id)
    assert run is not None and run["deadline_missed_at"] == clock()
    assert run["state"] == "RUNNING"  # a deadline tells; it does not stop the run
    [late] = await log_of(store, run_id, "wait_for_file", "late")
    assert "had not held by 2026-11-20T00:00:00+00:00 (expected_by)" in late
    assert await states(store, run_id) == {"wait_for_file": "PENDING", "load": "PENDING"}

    # A replayed fire (a takeover, a batch written twice) finds its waits gone.
    clock.advance(5)
    await fire(store, waits)
    run = await store.views.run_info(run_id)
    assert run is not None and run["deadline_missed_at"] == clock() - 5
    assert len(await log_of(store, run_id, "wait_for_file", "late")) == 1
    assert await run_waits(store) == {}


async def test_a_fire_after_the_run_or_the_sensor_ended_does_nothing(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    dag = settlements(deadline="06:00")
    ended = await store.runs.create_run(dag, DAY)
    sensed = await store.runs.create_run(dag, DAY)
    waits = await run_waits(store)
    assert len(waits) == 4
    # One run ends before its deadline: its waits are dropped with it.
    await store.runs.mark(ended, "wait_for_file", "success", downstream=True)
    assert (await store.views.run_info(ended))["state"] == "SUCCESS"  # type: ignore[index]
    assert await wait_rows(store, ended) == []
    # The other's sensor saw its condition: not late, though its run is still going.
    await store.runs.mark(sensed, "wait_for_file", "success")
    clock.set(datetime(2026, 11, 20, 7, 0, tzinfo=KOLKATA).timestamp())
    await fire(store, waits)
    assert (await store.views.run_info(ended))["deadline_missed_at"] is None  # type: ignore[index]
    assert await log_of(store, ended, "wait_for_file", "late") == []
    assert await log_of(store, sensed, "wait_for_file", "late") == []
    info = await store.views.run_info(sensed)
    assert info is not None and info["deadline_missed_at"] == clock()


async def test_a_scheduled_runs_times_count_from_when_it_became_due(
    store: Store, clock: FakeClock
) -> None:
    clock.set(datetime(2026, 11, 21, 0, 0, 5, tzinfo=KOLKATA).timestamp())
    dag = settlements(deadline="06:00")
    sched = Schedule.parse("@daily", timezone="Asia/Kolkata")
    iv = sched.latest_complete(datetime.fromtimestamp(clock(), UTC))
    assert iv is not None and iv.ds == "2026-11-20"
    async with store.db.write() as tx:
        started = await insert_run(
            tx,
            RunShape.of(dag),
            NewRun(DAY, scheduled_run_key(iv), interval=iv),
            clock(),
        )
    run = await store.views.run_info(started.run_id)
    assert run is not None
    # The run of the 20th became due at midnight: it must end by 06:00 on the 21st.
    assert run["deadline_at"] == datetime(2026, 11, 21, 6, 0, tzinfo=KOLKATA).timestamp()


async def test_dagrun_timeout_cancels_the_run_saying_so_and_starts_when_the_run_does(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    dag = DAG("slow", dagrun_timeout="3h")
    dag.task(noop, task_id="crunch")
    first = (await store.runs.start_run(dag, DAY, max_active=1)).run_id
    second = await store.runs.start_run(dag, DAY, max_active=1)
    assert second.state == "QUEUED"
    assert [w["kind"] for w in await wait_rows(store, first)] == ["timeout"]
    assert await wait_rows(store, second.run_id) == []  # its clock starts when it runs
    [claimed] = await claim(store, "w1", 1)
    assert claimed.run_id == first

    clock.advance(3 * 3600 + 1)
    await fire(store, await run_waits(store))
    run = await store.views.run_info(first)
    assert run is not None and run["state"] == "CANCELLED"
    assert run["state_reason"] == "cancelled by dagrun_timeout: the run did not end within 3h"
    assert await states(store, first) == {"crunch": "FAILED"}
    [why] = [m for m in await log_of(store, first, "crunch", "transition") if "timeout" in m]
    assert "dagrun_timeout" in why
    # The attempt's late report changes nothing; the queued run started, its clock too.
    await complete(store, [Succeeded(**attempt_of(claimed), output_json="1")])
    assert await states(store, first) == {"crunch": "FAILED"}
    assert (await store.views.run_info(second.run_id))["state"] == "RUNNING"  # type: ignore[index]
    [timeout] = await wait_rows(store, second.run_id)
    assert timeout["kind"] == "timeout" and timeout["due_at"] == clock() + 3 * 3600


def deferral(now: float) -> Deferral:
    classpath, kwargs = never().serialize()
    return Deferral(
        classpath=classpath,
        kwargs_json=json.dumps(kwargs),
        poke_hash=never().poke_hash(),
        shard=3,
        description="time 2100",
        method=None,
        method_kwargs_json="{}",
        wait_started_at=now,
        timeout_at=None,
    )


def wide(policy: str) -> DAG:
    """A root that fails, a sensor, two long roots, and children of each."""
    dag = DAG("wide", on_task_failure=policy)
    for tid in ("fails", "sensor", "long1", "long2"):
        dag.task(noop, task_id=tid)
    dag.task(noop, task_id="after_fails", parents=["fails"])
    dag.task(noop, task_id="after_long", parents=["long1", "long2"])
    dag.task(noop, task_id="later")  # a root no worker has claimed yet
    return dag


async def test_fail_fast_stops_the_run_at_its_first_failed_task(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    run_id = await store.runs.create_run(wide("fail_fast"), DAY)
    claimed = {r.task_id: r for r in await claim(store, "w1", 4)}
    assert sorted(claimed) == ["fails", "long1", "long2", "sensor"]
    await complete(store, [Deferred(**attempt_of(claimed["sensor"]), deferral=deferral(clock()))])
    await complete(
        store, [Failed(**attempt_of(claimed["fails"]), message="the bank file is corrupt")]
    )
    run = await store.views.run_info(run_id)
    assert run is not None and run["state"] == "FAILED"
    assert run["state_reason"] == "fail_fast: fails failed"
    assert await states(store, run_id) == {
        "fails": "FAILED",
        "sensor": "SKIPPED",  # its wait ended, and the triggerers are told
        "long1": "FAILED",  # stopped as a cancel stops a running attempt
        "long2": "FAILED",
        "after_fails": "SKIPPED",
        "after_long": "SKIPPED",
        "later": "SKIPPED",
    }
    assert await claim(store, "w2", 10) == []  # nothing new starts
    released = await ops(store).released_waits(0)
    assert [r["task_row"] for r in released] == [claimed["sensor"].id]
    # The stopped attempts' reports change nothing.
    await complete(store, [Succeeded(**attempt_of(claimed["long1"]), output_json="1")])
    assert (await states(store, run_id))["long1"] == "FAILED"


async def test_continue_lets_the_other_branches_run(store: Store, clock: FakeClock) -> None:
    clock.set(T0)
    run_id = await store.runs.create_run(wide("continue"), DAY)
    claimed = {r.task_id: r for r in await claim(store, "w1", 2)}
    assert sorted(claimed) == ["fails", "sensor"]
    await complete(store, [Failed(**attempt_of(claimed["fails"]), message="boom")])
    assert (await store.views.run_info(run_id))["state"] == "RUNNING"  # type: ignore[index]
    assert {r.task_id for r in await claim(store, "w1", 10)} == {"long1", "long2", "later"}


async def test_pause_holds_the_run_until_resumed_then_it_succeeds(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    run_id = await store.runs.create_run(wide("pause"), DAY)
    claimed = {r.task_id: r for r in await claim(store, "w1", 3)}
    assert sorted(claimed) == ["fails", "long1", "sensor"]
    await complete(store, [Failed(**attempt_of(claimed["fails"]), message="boom")])
    run = await store.views.run_info(run_id)
    assert run is not None and run["state"] == "PAUSED"
    assert "fails failed" in run["state_reason"]
    assert await claim(store, "w2", 10) == []  # long2 and later were about to start: held
    # What was running goes on to its end; its children wait for the resume.
    await complete(store, [Succeeded(**attempt_of(claimed["long1"]), output_json="1")])
    await complete(store, [Succeeded(**attempt_of(claimed["sensor"]), output_json="1")])
    assert await claim(store, "w2", 10) == []
    assert (await states(store, run_id))["after_fails"] == "PENDING"  # not upstream-failed

    with pytest.raises(ControlError, match="no run 'no-such-run'"):
        await store.runs.resume("no-such-run")
    done = await store.runs.resume(run_id, who="alice", reason="bank file fixed")
    assert done.run_state == "RUNNING" and done.tasks == ["fails"]
    run = await store.views.run_info(run_id)
    assert run is not None and run["state_reason"] == "resumed by alice: bank file fixed"
    again = await claim(store, "w3", 10)
    assert sorted(r.task_id for r in again) == ["fails", "later", "long2"]
    with pytest.raises(ControlError, match="RUNNING, not PAUSED"):  # twice: refused
        await store.runs.resume(run_id)
    pending = list(again)
    while pending:
        await complete(store, [Succeeded(**attempt_of(r), output_json="1") for r in pending])
        pending = await claim(store, "w3", 10)
    run = await store.views.run_info(run_id)
    assert run is not None and run["state"] == "SUCCESS"
    assert set((await states(store, run_id)).values()) == {"SUCCESS"}


async def test_a_paused_run_resumed_without_retrying_lets_the_failure_flow(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    dag = DAG("chain", on_task_failure="pause")
    dag.task(noop, task_id="a")
    dag.task(noop, task_id="b", parents=["a"])
    run_id = await store.runs.create_run(dag, DAY)
    [a] = await claim(store, "w1", 1)
    await complete(store, [Failed(**attempt_of(a), message="boom")])
    assert (await store.views.run_info(run_id))["state"] == "PAUSED"  # type: ignore[index]
    # The failed task was the last to end: the run stays PAUSED until a person decides.
    done = await store.runs.resume(run_id, retry_failed=False)
    assert done.run_state == "FAILED"
    assert await states(store, run_id) == {"a": "FAILED", "b": "UPSTREAM_FAILED"}


async def test_clearing_a_paused_runs_failed_task_resumes_it(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    dag = DAG("chain", on_task_failure="pause")
    dag.task(noop, task_id="a")
    dag.task(noop, task_id="b", parents=["a"])
    run_id = await store.runs.create_run(dag, DAY)
    [a] = await claim(store, "w1", 1)
    await complete(store, [Failed(**attempt_of(a), message="boom")])
    done = await store.runs.clear(run_id, ["a"])
    assert done.run_state == "RUNNING"
    [again] = await claim(store, "w1", 1)
    assert again.task_id == "a" and again.attempt == 1
    # Cancelling a paused run is allowed too (a person gives up on it).
    await complete(store, [Failed(**attempt_of(again), message="still broken")])
    assert (await store.views.run_info(run_id))["state"] == "PAUSED"  # type: ignore[index]
    assert (await store.runs.cancel(run_id)).run_state == "CANCELLED"
    assert await states(store, run_id) == {"a": "FAILED", "b": "SKIPPED"}


async def test_fail_fast_racing_a_worker_claiming_a_task_of_the_run_stops_that_claim(
    store: Store, url: str, clock: FakeClock
) -> None:
    """A worker's claim of the run's next task commits while the failure is being recorded:
    whichever goes first, the claimed task ends stopped and nothing else is claimable."""
    clock.set(T0)
    dag = DAG("race", on_task_failure="fail_fast")
    dag.task(noop, task_id="fails", priority=9)
    dag.task(noop, task_id="other")
    dag.task(noop, task_id="third")
    run_id = await store.runs.create_run(dag, DAY)
    [fails] = await claim(store, "w1", 1)
    other = await open_store(url, clock=clock)
    try:
        async with other.db.write() as tx:  # worker 2 claims, and has not committed yet
            [cand] = await tx.fetch(
                "claim_candidates", now=clock(), n=1, queues=["default"], full=[], busy=[]
            )
            claimed = await transition(
                tx, [cand["id"]], State.PENDING, State.RUNNING, now=clock(),
                message="claimed by w2", owner="w2#0",
            )  # fmt: skip
            failing = asyncio.create_task(
                complete(store, [Failed(**attempt_of(fails), message="boom")])
            )
            await asyncio.sleep(0.2)  # the failure waits for this claim's locks (or not yet)
        await failing
    finally:
        await other.close()
    [row] = claimed
    states_now = await states(store, run_id)
    assert states_now["fails"] == "FAILED" and states_now[row.task_id] == "FAILED"
    assert set(states_now.values()) <= {"FAILED", "SKIPPED"}
    assert (await store.views.run_info(run_id))["state"] == "FAILED"  # type: ignore[index]
    assert await claim(store, "w3", 10) == []


async def test_moments_already_past_are_not_armed_and_a_reopened_run_arms_what_is_ahead(
    store: Store, clock: FakeClock
) -> None:
    clock.set(T0)
    dag = settlements(deadline="06:00", dagrun_timeout="1h")
    # A run of an earlier day (a backfill, a late run by hand): its moments have passed.
    old = await store.runs.create_run(dag, date(2026, 11, 1))
    assert [w["kind"] for w in await wait_rows(store, old)] == ["timeout"]
    # Today's run ends before its deadline; cleared later, still before 05:30: all armed
    # again, the timeout from the clear.
    run_id = await store.runs.create_run(dag, DAY)
    await store.runs.mark(run_id, "wait_for_file", "success", downstream=True)
    assert await wait_rows(store, run_id) == []
    clock.set(datetime(2026, 11, 20, 5, 0, tzinfo=KOLKATA).timestamp())
    await store.runs.clear(run_id, ["load"])
    kinds = {w["kind"]: w["due_at"] for w in await wait_rows(store, run_id)}
    assert kinds == {
        "late": datetime(2026, 11, 20, 5, 30, tzinfo=KOLKATA).timestamp(),
        "deadline": datetime(2026, 11, 20, 6, 0, tzinfo=KOLKATA).timestamp(),
        "timeout": clock() + 3600,
    }
