"""Sensors in three modes over one condition (a file appearing, FileTrigger): what each
mode costs in slots, how it ends on time-out, and the fall-back when it cannot defer."""

from __future__ import annotations

import itertools
import json
import threading
import time
from datetime import date
from pathlib import Path

import pytest
from support.helpers import async_wait_until, sql
from support.triggers import (
    FLAGS,
    FlakyTrigger,
    HangingTrigger,
    ScriptedTrigger,
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
from executor.dag import DagError, SensorMode
from triggers import files
from triggers.files import FileTrigger

DAY = date(2026, 4, 25)
INTERVAL = 0.1

pytestmark = pytest.mark.usefixtures("fresh_triggers")


class Listings:
    """Every directory listing FileTrigger made (worker slot or triggerer alike)."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, list[str] | None]]] = []
        self._lock = threading.Lock()

    def of(self, directory: Path) -> list[tuple[float, list[str] | None]]:
        with self._lock:
            return [(t, out[str(directory)]) for t, out in self.calls if str(directory) in out]


@pytest.fixture
def listings(monkeypatch) -> Listings:
    spy = Listings()
    real = files._list_dirs

    def recording(directories):
        out = real(directories)
        with spy._lock:
            spy.calls.append(
                (time.time(), {d: None if v is None else sorted(v) for d, v in out.items()})
            )
        return out

    monkeypatch.setattr(files, "_list_dirs", recording)
    return spy


def sensor_dag(
    inbox: Path, mode: SensorMode, *, timeout: float = 30, soft_fail: bool = False
) -> DAG:
    dag = DAG(f"sense_{mode}")
    wait = dag.sensor(
        "wait_for_file",
        FileTrigger(path=f"{inbox}/{{{{ ds }}}}.csv", poke_interval=INTERVAL),
        mode=mode,
        timeout=timeout,
        soft_fail=soft_fail,
    )

    @dag.task(parents=[wait])
    def load(ctx):
        return {"got": ctx.inputs["wait_for_file"]}

    return dag


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    path = tmp_path / "in"
    path.mkdir()
    return path


def absent_checks(listings: Listings, inbox: Path) -> int:
    return sum(1 for _, names in listings.of(inbox) if names is not None and not names)


async def test_poke_mode_holds_its_slot_for_the_whole_wait(store, db_path, inbox, listings) -> None:
    dag = sensor_dag(inbox, "poke")
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False):
        await async_wait_until(lambda: absent_checks(listings, inbox) >= 2, what="two checks")
        assert state_of(db_path, run_id, "wait_for_file") == "RUNNING"
        created = time.time()
        (inbox / "2026-04-25.csv").write_text("x")
        await async_wait_until(lambda: state_of(db_path, run_id, "load") == "SUCCESS", what="load")
    row = task_row(db_path, run_id, "wait_for_file")
    assert transitions(db_path, row["id"]) == [("PENDING", "RUNNING"), ("RUNNING", "SUCCESS")]
    (held,) = slot_intervals(db_path, row["id"])
    assert held["kind"] == "poke"
    first_check = listings.of(inbox)[0][0]
    assert held["started_at"] <= first_check and held["ended_at"] >= created
    payload = {"paths": [str(inbox / "2026-04-25.csv")]}
    assert json.loads(row["output"]) == payload
    assert json.loads(task_row(db_path, run_id, "load")["output"]) == {"got": payload}
    text = await log_text(store, run_id, "wait_for_file")
    assert f"checked file://{inbox}/2026-04-25.csv: not yet" in text
    assert "(poke mode, check 1)" in text


async def test_reschedule_mode_frees_the_slot_between_checks(
    store, db_path, inbox, listings
) -> None:
    dag = sensor_dag(inbox, "reschedule")
    run_id = await store.runs.create_run(dag, DAY)
    row_id = task_row(db_path, run_id, "wait_for_file")["id"]

    def sensing_turns() -> int:
        return transitions(db_path, row_id).count(("RUNNING", "SENSING"))

    async with serving(store, dag, triggerer=False):
        await async_wait_until(lambda: sensing_turns() >= 3, what="three SENSING turns")
        (inbox / "2026-04-25.csv").write_text("x")
        await async_wait_until(lambda: state_of(db_path, run_id, "load") == "SUCCESS", what="load")

    events = transition_events(db_path, row_id)
    moves = [(e["from_state"], e["to_state"]) for e in events]
    turns = moves.count(("RUNNING", "SENSING"))
    assert turns >= 3
    assert moves[-1] == ("RUNNING", "SUCCESS")
    assert moves.count(("SENSING", "RUNNING")) == turns
    # Not a retry: the attempt counter never moves, nothing is RETRYING.
    assert {e["attempt"] for e in events} == {1}
    assert task_row(db_path, run_id, "wait_for_file")["attempt"] == 1
    assert "RETRYING" not in {m for pair in moves for m in pair}
    # One slot interval per check, none covering a SENSING period.
    held = slot_intervals(db_path, row_id)
    assert len(held) == turns + 1 and {s["kind"] for s in held} == {"execute"}
    for a, b in itertools.pairwise(events):
        if (a["from_state"], a["to_state"]) == ("RUNNING", "SENSING"):
            for s in held:
                assert s["ended_at"] <= a["ts"] or s["started_at"] >= b["ts"], (s, a, b)
    text = await log_text(store, run_id, "wait_for_file")
    assert f"checked file://{inbox}/2026-04-25.csv: not yet; next in {INTERVAL:g} s" in text
    payload = {"paths": [str(inbox / "2026-04-25.csv")]}
    assert json.loads(task_row(db_path, run_id, "load")["output"]) == {"got": payload}


async def test_deferrable_mode_is_finished_by_the_triggerer(
    store, db_path, inbox, listings
) -> None:
    dag = sensor_dag(inbox, "deferrable")
    run_id = await store.runs.create_run(dag, DAY)
    row_id = task_row(db_path, run_id, "wait_for_file")["id"]
    # Polled, not pushed: the test counts the triggerer's checks at the sensor's interval.
    async with serving(store, dag, config={"push": False}):
        await async_wait_until(lambda: absent_checks(listings, inbox) >= 2, what="two checks")
        assert state_of(db_path, run_id, "wait_for_file") == "DEFERRED"
        (trig,) = sql(db_path, "SELECT * FROM trigger")
        # The template was rendered before the trigger was stored.
        assert json.loads(trig["kwargs"])["path"] == f"{inbox}/2026-04-25.csv"
        (inbox / "2026-04-25.csv").write_text("x")
        await async_wait_until(lambda: state_of(db_path, run_id, "load") == "SUCCESS", what="load")
    # No worker round trip: RUNNING once, then the triggerer itself ends it.
    assert transitions(db_path, row_id) == [
        ("PENDING", "RUNNING"),
        ("RUNNING", "DEFERRED"),
        ("DEFERRED", "SUCCESS"),
    ]
    (held,) = slot_intervals(db_path, row_id)
    assert held["kind"] == "execute"
    deferred_at = transition_events(db_path, row_id)[1]["ts"]
    assert held["ended_at"] <= deferred_at
    payload = {"paths": [str(inbox / "2026-04-25.csv")]}
    assert json.loads(task_row(db_path, run_id, "wait_for_file")["output"]) == payload
    assert json.loads(task_row(db_path, run_id, "load")["output"]) == {"got": payload}
    text = await log_text(store, run_id, "wait_for_file")
    assert f"checked file://{inbox}/2026-04-25.csv: not yet" in text
    assert f"trigger fired: file://{inbox}/2026-04-25.csv" in text


async def test_a_deferrable_sensor_needs_no_worker_to_finish(store, db_path, inbox) -> None:
    dag = sensor_dag(inbox, "deferrable")
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait_for_file") == "DEFERRED", what="DEFERRED"
        )
    async with serving(store, dag, worker=False):
        (inbox / "2026-04-25.csv").write_text("x")
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait_for_file") == "SUCCESS", what="SUCCESS"
        )
    sensor, child = task_row(db_path, run_id, "wait_for_file"), task_row(db_path, run_id, "load")
    # The child became runnable in the transaction that ended the sensor.
    assert child["state"] == "PENDING"
    assert child["ready_at"] == sensor["ended_at"]


@pytest.mark.parametrize("soft_fail", [False, True], ids=["fail", "soft_fail"])
@pytest.mark.parametrize("mode", ["poke", "reschedule", "deferrable"])
async def test_sensor_timeout(store, db_path, inbox, mode, soft_fail) -> None:
    dag = sensor_dag(inbox, mode, timeout=0.5, soft_fail=soft_fail)
    run_id = await store.runs.create_run(dag, DAY)
    ended = {"SKIPPED", "FAILED"}
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait_for_file") in ended, what="end"
        )
        await async_wait_until(
            lambda: state_of(db_path, run_id, "load") in ended | {"UPSTREAM_FAILED"}
        )
    sensor = task_row(db_path, run_id, "wait_for_file")
    assert sensor["state"] == ("SKIPPED" if soft_fail else "FAILED")
    assert state_of(db_path, run_id, "load") == ("SKIPPED" if soft_fail else "UPSTREAM_FAILED")
    assert sensor["attempt"] == 1
    last = transition_events(db_path, sensor["id"])[-1]
    assert "sensor timeout" in last["message"]
    assert sensor["ended_at"] - sensor["started_at"] >= 0.5


@pytest.mark.parametrize("mode", ["poke", "reschedule"])
async def test_a_check_that_hangs_in_a_worker_is_cut_off(store, db_path, mode) -> None:
    """The sensor's timeout (and the task's execution_timeout) hold during a check too,
    not only between checks: a hung check must not keep the slot and the row for ever."""
    dag = DAG("hung")
    dag.sensor("by_timeout", HangingTrigger(name="a"), mode=mode, timeout=0.5)
    dag.sensor("by_execution_timeout", HangingTrigger(name="b"), mode=mode, timeout=3600,
               execution_timeout=0.5)  # fmt: skip
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        for task in ("by_timeout", "by_execution_timeout"):

            def failed(t: str = task) -> bool:
                return state_of(db_path, run_id, t) == "FAILED"

            await async_wait_until(failed, what=f"{task} FAILED")
    by_timeout = transition_events(db_path, task_row(db_path, run_id, "by_timeout")["id"])
    assert "sensor timeout" in by_timeout[-1]["message"]
    by_exec = transition_events(db_path, task_row(db_path, run_id, "by_execution_timeout")["id"])
    assert "took longer than 0.5 s (the task's execution_timeout)" in by_exec[-1]["message"]


@pytest.mark.parametrize("execution_timeout", [None, 30.0])
async def test_a_triggers_own_timeout_in_a_worker_check_is_its_error(
    store, db_path, execution_timeout
) -> None:
    """A TimeoutError the trigger raises itself (a client's read timeout) fails the attempt
    with that error: it is neither the sensor's timeout nor the task's execution_timeout."""
    dag = DAG("own_timeout")
    flaky = FlakyTrigger(name="slow", failures=1, error="timeout", poke_interval=0.1)
    dag.sensor("wait", flaky, mode="reschedule", timeout=3600, retries=1, retry_delay=0,
               execution_timeout=execution_timeout)  # fmt: skip
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait") == "SUCCESS", what="wait SUCCESS"
        )
    retried = [e for e in transition_events(db_path, task_row(db_path, run_id, "wait")["id"])
               if e["to_state"] == "RETRYING"]  # fmt: skip
    assert len(retried) == 1
    assert "slow read timed out (try 1)" in retried[0]["message"]
    assert "execution_timeout" not in retried[0]["message"]


async def test_a_retried_sensor_gets_its_whole_timeout_again(store, db_path) -> None:
    """The wait of a new attempt starts anew: a retry must not time out before checking."""
    dag = DAG("retried")
    # attempt 1 waits once (its wait starts), then fails; attempt 2 starts after the first
    # attempt's timeout would have passed, and must still get to check.
    scripted = ScriptedTrigger(name="once", script=["wait", "raise", "fire"], poke_interval=0.1)
    dag.sensor("wait", scripted, mode="reschedule", timeout=1.0, retries=1, retry_delay=1.2,
               retry_jitter=0)  # fmt: skip
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait") in ("SUCCESS", "FAILED"), what="the end"
        )
    row = task_row(db_path, run_id, "wait")
    assert (row["state"], row["attempt"]) == ("SUCCESS", 2), transition_events(db_path, row["id"])


async def test_a_deferrable_sensor_on_a_class_not_allow_listed_starts_no_run(
    store, db_path
) -> None:
    dag = DAG("refused")
    dag.sensor("wait", UnlistedTrigger(name="unlisted", poke_interval=INTERVAL), timeout=30)
    with pytest.raises(DagError, match="UnlistedTrigger is not allow-listed, so it cannot defer"):
        await store.runs.create_run(dag, DAY)
    assert sql(db_path, "SELECT * FROM dag_run") == []


async def test_a_sensor_that_cannot_defer_falls_back_to_reschedule(
    store, db_path, monkeypatch
) -> None:
    dag = DAG("fallback")
    dag.sensor("wait", UnlistedTrigger(name="unlisted", poke_interval=INTERVAL), timeout=30)
    # Allowed where the run was created, not where it runs (another process's environment).
    monkeypatch.setenv("SLOTLESS_ALLOWED_TRIGGERS", UnlistedTrigger.classpath())
    run_id = await store.runs.create_run(dag, DAY)
    monkeypatch.delenv("SLOTLESS_ALLOWED_TRIGGERS")
    row_id = task_row(db_path, run_id, "wait")["id"]
    async with serving(store, dag):
        await async_wait_until(
            lambda: transitions(db_path, row_id).count(("RUNNING", "SENSING")) >= 2,
            what="SENSING turns",
        )
        FLAGS.add("unlisted")
        await async_wait_until(
            lambda: state_of(db_path, run_id, "wait") == "SUCCESS", what="SUCCESS"
        )
    moves = transitions(db_path, row_id)
    assert ("RUNNING", "DEFERRED") not in moves
    assert sql(db_path, "SELECT * FROM trigger") == []
    assert json.loads(task_row(db_path, run_id, "wait")["output"]) == {"name": "unlisted"}
    text = await log_text(store, run_id, "wait")
    assert (
        "cannot defer (trigger class support.triggers.UnlistedTrigger is not allow-listed); "
        "falling back to reschedule mode" in text
    )
