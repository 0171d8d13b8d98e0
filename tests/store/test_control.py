"""Operating runs on both backends: clear (with downstream, failed only, a mapped task
re-expanding), retry, mark, cancel; each refused cleanly for bad input, nothing changed."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.exchanging import claim, complete
from support.helpers import attempt_of, run_to_end, write_dag

from executor.loader import load_dag
from executor.outcomes import Succeeded
from executor.store import Store
from executor.store.control import ControlError

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

FANOUT = """
from pathlib import Path
from executor import DAG

MARK = Path({mark!r})
dag = DAG("fan")


@dag.task
def extract(ctx):
    with open(Path({runs!r}), "a") as f:
        f.write("extract\\n")
    return list(range(100))


@dag.task(expand=extract)
def settle(ctx):
    if ctx.item == 37 and not MARK.exists():
        raise RuntimeError("the bank file for merchant 37 is late")
    return ctx.item * 2


@dag.task(parents=[settle])
def total(ctx):
    return ctx.inputs["settle"]
"""


async def fan_run(store: Store, tmp_path: Path) -> tuple[str, Path]:
    mark, runs = tmp_path / "fixed", tmp_path / "extract-runs"
    path = write_dag(tmp_path, FANOUT.format(mark=str(mark), runs=str(runs)), "fan.py")
    run_id = await store.runs.create_run(
        load_dag(str(path), "fan"), date(2026, 4, 25), dag_file=str(path)
    )
    return run_id, mark


async def states(store: Store, run_id: str) -> dict[str, str]:
    return {r["task_id"]: r["state"] for r in await store.views.run_tasks(run_id)}


async def test_clearing_a_failed_mapped_task_and_its_downstream_runs_only_that_part_again(
    store: Store, tmp_path: Path
) -> None:
    run_id, mark = await fan_run(store, tmp_path)
    info = await run_to_end(store, run_id, slots=4)
    assert info["state"] == "FAILED"
    assert await states(store, run_id) == {
        "extract": "SUCCESS", "settle": "FAILED", "total": "UPSTREAM_FAILED"
    }  # fmt: skip
    mark.touch()  # the cause is fixed
    done = await store.runs.clear(
        run_id, ["settle"], downstream=True, who="alice", reason="file in"
    )
    assert done.tasks == ["settle", "total"] and done.run_state == "RUNNING"
    # settle's rule holds at once (extract succeeded): it expanded again, 100 new instances.
    assert await states(store, run_id) == {
        "extract": "SUCCESS", "settle": "RUNNING", "total": "PENDING"
    }  # fmt: skip
    assert (await store.views.mapped_counts(run_id))["settle"] == {"PENDING": 100}
    info = await run_to_end(store, run_id, slots=4)
    assert info["state"] == "SUCCESS"
    [total] = [r for r in await store.views.run_tasks(run_id) if r["task_id"] == "total"]
    assert json.loads(total["output"]) == [i * 2 for i in range(100)]  # all 100, in order
    assert (tmp_path / "extract-runs").read_text() == "extract\n"  # not run again
    log = await store.views.task_log(run_id, "settle")
    assert log is not None
    assert any("cleared by alice: file in" in e["message"] for e in log)


async def test_retry_clears_what_failed_and_mark_sets_an_outcome(
    store: Store, tmp_path: Path
) -> None:
    run_id, mark = await fan_run(store, tmp_path)
    await run_to_end(store, run_id, slots=4)
    mark.touch()
    done = await store.runs.retry(run_id)
    assert done.tasks == ["settle", "total"]  # FAILED and UPSTREAM_FAILED, not extract
    assert (await run_to_end(store, run_id, slots=4))["state"] == "SUCCESS"
    # Mark the fan-in failed, then success with an output: the run's end follows.
    assert (await store.runs.mark(run_id, "total", "failed", reason="wrong totals")).run_state == (
        "FAILED"
    )
    done = await store.runs.mark(run_id, "total", "success", output={"fixed": True})
    assert done.run_state == "SUCCESS"
    [total] = [r for r in await store.views.run_tasks(run_id) if r["task_id"] == "total"]
    assert json.loads(total["output"]) == {"fixed": True}


async def test_marking_a_pending_task_lets_its_downstream_run(store: Store, tmp_path: Path) -> None:
    run_id, _ = await fan_run(store, tmp_path)
    await store.runs.mark(run_id, "extract", "success", output=[1, 2])
    assert (await run_to_end(store, run_id))["state"] == "SUCCESS"
    [total] = [r for r in await store.views.run_tasks(run_id) if r["task_id"] == "total"]
    assert json.loads(total["output"]) == [2, 4]


async def test_cancel_ends_every_unfinished_task_and_only_that_run(
    store: Store, tmp_path: Path
) -> None:
    run_id, _ = await fan_run(store, tmp_path)
    (tmp_path / "other").mkdir()
    other, _ = await fan_run(store, tmp_path / "other")
    [claimed] = await claim(store, "w1", 1)  # extract of one run is RUNNING in a worker
    cancelled = claimed.run_id
    kept = other if cancelled == run_id else run_id
    done = await store.runs.cancel(cancelled, who="bob", reason="wrong day")
    assert done.run_state == "CANCELLED"
    after = await states(store, cancelled)
    assert after == {"extract": "FAILED", "settle": "SKIPPED", "total": "SKIPPED"}
    assert (await store.views.run_info(cancelled))["state"] == "CANCELLED"  # type: ignore[index]
    assert await states(store, kept) == {
        "extract": "PENDING",
        "settle": "PENDING",
        "total": "PENDING",
    }
    # The cancelled attempt's late report changes nothing.
    await complete(store, [Succeeded(**attempt_of(claimed), output_json="[1]")])
    assert await states(store, cancelled) == after
    assert (await store.runs.cancel(cancelled)).tasks == []  # again: nothing more to do


async def test_bad_operations_are_refused_and_change_nothing(store: Store, tmp_path: Path) -> None:
    run_id, _ = await fan_run(store, tmp_path)
    with pytest.raises(ControlError, match="no run 'nope'"):
        await store.runs.clear("nope")
    with pytest.raises(ControlError, match="has no task 'typo'"):
        await store.runs.clear(run_id, ["typo"])
    with pytest.raises(ControlError, match="unknown outcome"):
        await store.runs.mark(run_id, "extract", "done")  # type: ignore[arg-type]
    with pytest.raises(ControlError, match="not JSON"):
        await store.runs.mark(run_id, "extract", "success", output={1, 2})
    [claimed] = await claim(store, "w1", 1)
    before = await states(store, run_id)
    with pytest.raises(ControlError, match="extract is RUNNING"):
        await store.runs.clear(run_id, ["extract"])
    with pytest.raises(ControlError, match="is RUNNING"):
        await store.runs.mark(run_id, "extract", "success")
    assert await states(store, run_id) == before
    # With force, the attempt is taken back: its late report is discarded.
    await store.runs.clear(run_id, ["extract"], force=True)
    await complete(store, [Succeeded(**attempt_of(claimed), output_json="[1]")])
    assert (await states(store, run_id))["extract"] == "PENDING"


async def test_marking_an_ended_mapped_task_lets_its_fan_in_run(
    store: Store, tmp_path: Path
) -> None:
    run_id, _ = await fan_run(store, tmp_path)
    assert (await run_to_end(store, run_id, slots=4))["state"] == "FAILED"
    # settle failed; its rule holds again once cleared (it would expand): marked instead.
    done = await store.runs.mark(run_id, "settle", "success", reason="settled by hand")
    # Its fan-in, UPSTREAM_FAILED (it never ran), proceeds: cleared, its rule holds now.
    assert await states(store, run_id) == {
        "extract": "SUCCESS", "settle": "SUCCESS", "total": "PENDING"
    }  # fmt: skip
    assert done.run_state == "RUNNING" and done.tasks == ["settle", "total"]
    assert (await run_to_end(store, run_id))["state"] == "SUCCESS"
    [total] = [r for r in await store.views.run_tasks(run_id) if r["task_id"] == "total"]
    assert json.loads(total["output"]) == []  # marked by hand: no instance outputs to pass on
