"""The in-process worker: the task context, slots, slot usage, priorities, execution
timeouts in thread and process isolation, and tasks that cannot be run or stored."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from datetime import date
from pathlib import Path

import pytest
from support.helpers import async_wait_until, events, pid_alive, run_to_end, sql, task_states

from executor import DAG
from executor.store import Store
from executor.worker import Worker

DAY = date(2026, 5, 17)


async def test_context_inputs_and_logs(store: Store, db_path) -> None:
    seen: dict[str, dict] = {}
    dag = DAG("ctx")

    @dag.task
    def extract(ctx):
        ctx.log("extracting")
        return [1, 2, 3]

    @dag.task
    def config(ctx):
        return {"factor": 10}

    @dag.task(parents=[extract, config], retries=2)
    def transform(ctx):
        seen["transform"] = {
            "inputs": ctx.inputs,
            "attempt": ctx.attempt,
            "max_attempts": ctx.max_attempts,
            "ds": ctx.ds,
            "run_id": ctx.run_id,
            "task_id": ctx.task_id,
            "dag_id": ctx.dag_id,
        }
        ctx.log("transforming")
        return [x * ctx.inputs["config"]["factor"] for x in ctx.inputs["extract"]]

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=2)
    assert info["state"] == "SUCCESS"
    assert seen["transform"] == {
        "inputs": {"extract": [1, 2, 3], "config": {"factor": 10}},
        "attempt": 1,
        "max_attempts": 3,
        "ds": "2026-05-17",
        "run_id": run_id,
        "task_id": "transform",
        "dag_id": "ctx",
    }
    out = {t["task_id"]: t["output"] for t in await store.views.run_tasks(run_id)}
    assert out["transform"] == "[10, 20, 30]"
    log = events(db_path, run_id, "transform")
    assert [e["kind"] for e in log] == ["transition", "log", "transition"]
    assert log[1]["message"] == "transforming"
    assert [(e["from_state"], e["to_state"]) for e in log if e["kind"] == "transition"] == [
        ("PENDING", "RUNNING"),
        ("RUNNING", "SUCCESS"),
    ]
    # every attempt held a slot, and the slot usage table says when and where
    usage = sql(db_path, "SELECT * FROM slot_usage ORDER BY task_row")
    assert len(usage) == 3
    for u in usage:
        assert u["kind"] == "execute"
        assert u["slot"] in (0, 1)
        assert u["started_at"] <= u["ended_at"]


async def test_slots_run_tasks_concurrently(store: Store) -> None:
    """Three tasks that can only finish together: they need three slots at once."""
    barrier = threading.Barrier(3, timeout=20)
    dag = DAG("together")
    for i in range(3):
        dag.task(lambda ctx: barrier.wait(), task_id=f"t{i}")
    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=3)
    assert info["state"] == "SUCCESS"


async def test_priority_orders_claims(store: Store, db_path) -> None:
    order: list[str] = []
    dag = DAG("prio")
    for name, prio in [("low", 0), ("high", 9), ("mid", 5), ("highest", 20)]:
        dag.task(lambda ctx: order.append(ctx.task_id), task_id=name, priority=prio)
    run_id = await store.runs.create_run(dag, DAY)
    await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=1)
    assert order == ["highest", "high", "mid", "low"]


async def test_worker_without_the_dag_fails_the_task_clearly(store: Store, db_path) -> None:
    dag = DAG("orphan")
    dag.task(lambda ctx: 1, task_id="t", retries=3)
    run_id = await store.runs.create_run(dag, DAY)  # no dag_file, and the worker is not given it
    info = await run_to_end(store, run_id, slots=1)
    assert info["state"] == "FAILED"
    (last,) = [e for e in events(db_path, run_id, "t") if e["to_state"] == "FAILED"]
    assert "DAG orphan is unknown to this worker and has no file" in last["message"]
    # no point retrying what cannot run anywhere here
    assert sql(db_path, "SELECT attempt FROM task WHERE run_id = ?", run_id)[0]["attempt"] == 1


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize(
    ("value", "why"),
    [
        (lambda: {"when": object()}, "object is not JSON serializable"),
        (lambda: [1.0, float("nan")], "not JSON compliant"),  # NaN is not JSON
        (lambda: {"n": float("inf")}, "not JSON compliant"),
    ],
    ids=["object", "nan", "inf"],
)
async def test_output_that_json_cannot_hold_fails_the_task(
    store: Store, db_path, isolation: str, value, why: str
) -> None:
    dag = DAG("nojson")

    @dag.task
    def odd(ctx):
        return value()

    @dag.task(parents=[odd])
    def after(ctx):
        return 1

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=1, isolation=isolation)
    assert info["state"] == "FAILED"
    assert task_states(db_path, run_id) == {"odd": "FAILED", "after": "UPSTREAM_FAILED"}
    (failed,) = [e for e in events(db_path, run_id, "odd") if e["to_state"] == "FAILED"]
    assert "cannot be stored as JSON" in failed["message"]
    assert why in failed["message"]
    assert sql(db_path, "SELECT output FROM task WHERE task_id = 'odd'")[0]["output"] is None


async def test_thread_isolation_timeout_fails_the_attempt_and_keeps_the_slot(
    store: Store, db_path
) -> None:
    let_go = threading.Event()
    returned_at: list[float] = []
    dag = DAG("hung_thread")

    @dag.task(execution_timeout=0.3, priority=10)
    def hung(ctx):
        let_go.wait(30)
        returned_at.append(time.time())
        return "too late"

    @dag.task
    def other(ctx):
        return "other"

    run_id = await store.runs.create_run(dag, DAY)
    worker = Worker(store, dags={dag.dag_id: dag}, slots=1, poll_interval=0.02)
    serving = asyncio.create_task(worker.run())
    try:

        async def hung_failed():
            return task_states(db_path, run_id)["hung"] == "FAILED"

        await async_wait_until(hung_failed, what="the hung task to time out")
        (failed,) = [e for e in events(db_path, run_id, "hung") if e["to_state"] == "FAILED"]
        assert "execution timeout: still running after 0.3 s" in failed["message"]
        # the thread cannot be stopped: its slot is still taken, so nothing else started
        assert task_states(db_path, run_id)["other"] == "PENDING"
        let_go.set()

        async def ended():
            info = await store.views.run_info(run_id)
            return info is not None and info["state"] != "RUNNING"

        await async_wait_until(ended, what="the run to end")
    finally:
        let_go.set()
        worker.stop()
        await asyncio.wait_for(serving, 10)
    assert task_states(db_path, run_id) == {"hung": "FAILED", "other": "SUCCESS"}
    # the late return is not recorded as the output of a failed task
    assert sql(db_path, "SELECT output FROM task WHERE task_id = 'hung'")[0]["output"] is None
    (claim,) = [e for e in events(db_path, run_id, "other") if e["to_state"] == "RUNNING"]
    assert claim["ts"] >= returned_at[0]


async def test_process_isolation_timeout_kills_the_hung_child(
    store: Store, db_path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    dag = DAG("hung_process")

    @dag.task(execution_timeout=0.5)
    def hung(ctx):
        pid_file.write_text(str(os.getpid()))
        time.sleep(60)

    @dag.task
    def fine(ctx):
        ctx.log(f"from pid {os.getpid()}")
        return {"pid": os.getpid()}

    run_id = await store.runs.create_run(dag, DAY)
    # the child sleeps 60 s: the run can only end in time if the child is killed
    info = await run_to_end(
        store, run_id, dags={dag.dag_id: dag}, slots=2, isolation="process", timeout=30
    )
    assert info["state"] == "FAILED"
    assert task_states(db_path, run_id) == {"hung": "FAILED", "fine": "SUCCESS"}
    (failed,) = [e for e in events(db_path, run_id, "hung") if e["to_state"] == "FAILED"]
    assert "execution timeout: killed after 0.5 s" in failed["message"]
    pid = int(pid_file.read_text())
    assert pid != os.getpid()
    assert not pid_alive(pid), "the hung child must be killed"
    # a task in process isolation runs in its own process; output and log lines come back
    out = sql(db_path, "SELECT output FROM task WHERE task_id = 'fine'")[0]["output"]
    child_pid = int(out.split(":")[1].strip(" }"))
    assert child_pid != os.getpid()
    logs = [e["message"] for e in events(db_path, run_id, "fine") if e["kind"] == "log"]
    assert logs == [f"from pid {child_pid}"]


async def test_process_isolation_reports_a_child_that_died(store: Store, db_path) -> None:
    dag = DAG("crash")

    @dag.task
    def crash(ctx):
        os._exit(3)

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=1, isolation="process")
    assert info["state"] == "FAILED"
    (failed,) = [e for e in events(db_path, run_id, "crash") if e["to_state"] == "FAILED"]
    assert "task process died (exit code 3)" in failed["message"]


async def test_unknown_isolation_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown isolation 'vm'"):
        Worker(store, isolation="vm")


async def test_worker_stops_without_waiting_for_a_timed_out_thread(store: Store, db_path) -> None:
    """The attempt is reported FAILED; the worker then returns from ``run`` although the
    thread it cannot stop is still blocked (``slotless run`` must not hang on it)."""
    let_go = threading.Event()
    dag = DAG("abandoned")

    @dag.task(execution_timeout=0.2)
    def stuck(ctx):
        let_go.wait(60)

    run_id = await store.runs.create_run(dag, DAY)
    try:
        info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=1, timeout=20)
        assert info["state"] == "FAILED"
        assert not let_go.is_set()
        assert any(t.name.startswith("slot") and t.is_alive() for t in threading.enumerate())
    finally:
        let_go.set()


async def test_a_forked_slot_keeps_no_descriptor_of_the_worker() -> None:
    """A pipe open in the worker when a slot forks (another slot's result pipe, or the
    pipe through which subprocess learns a child exec'd) must not stay open in the task's
    process: whoever waits for its EOF would wait as long as the task runs."""
    from executor.context import TaskContext
    from executor.slots import ProcessSlots

    read_end, write_end = os.pipe()  # open in the worker while the slot forks
    slots = ProcessSlots(1)
    ctx = TaskContext(
        run_id="r", dag_id="d", task_id="t", logical_date=date(2026, 4, 25), attempt=1,
        max_attempts=1,
    )  # fmt: skip
    try:

        def open_fds() -> list[int]:
            return sorted(int(fd) for fd in os.listdir("/proc/self/fd"))

        result = await slots.run(open_fds, ctx, 30, asyncio.Event())
        assert result.ok, result.message
        fds = json.loads(result.value)
        assert write_end not in fds and read_end not in fds
        assert {0, 1, 2} <= set(fds) and len(fds) <= 5  # stdio, the result pipe, listdir's
    finally:
        slots.shutdown()
        os.close(read_end)
        os.close(write_end)
