"""Every sequence of two operator operations (clear, retry, mark, cancel, resume) on a small
run, at three points of its life, on both backends: after each operation, and after the
run is served to its end, the run's state is what its tasks say.

The DAG: ``a -> b, a -> c, (b, c) -> leaf`` with ``leaf``'s rule all_done and ``b`` failing
every attempt; under each ``on_task_failure`` (continue, pause, fail_fast). What must hold:

* an ended run (SUCCESS, FAILED, CANCELLED) has no unfinished task, and a RUNNING one has
  one, or it would never end;
* an ended SUCCESS or FAILED run is FAILED exactly when a leaf FAILED or UPSTREAM_FAILED;
* a task stopped by a cancel stays so only while its run is CANCELLED: a run reopened
  after a cancel runs what the cancel stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.exchanging import claim, complete
from support.helpers import FakeClock, attempt_of, write_dag
from support.pg import create_schema, drop_schema, with_params

from executor.loader import load_dag
from executor.outcomes import Failed, Outcome, Succeeded
from executor.rows import MovedTask
from executor.store import Store, open_store
from executor.store.control import ControlError

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

DAG_SOURCE = """
from executor import DAG

dag = DAG("seq", on_task_failure={policy!r})


@dag.task
def a(ctx):
    return 1


@dag.task(parents=[a])
def b(ctx):
    raise RuntimeError("b is broken")


@dag.task(parents=[a])
def c(ctx):
    return 3


@dag.task(parents=[b, c], trigger_rule="all_done")
def leaf(ctx):
    return 4
"""

Op = Callable[[Store, str], Awaitable[object]]

OPS: dict[str, Op] = {
    "clear": lambda s, r: s.runs.clear(r),
    "clear a": lambda s, r: s.runs.clear(r, ["a"]),
    "clear a force": lambda s, r: s.runs.clear(r, ["a"], force=True),
    "clear leaf": lambda s, r: s.runs.clear(r, ["leaf"]),
    "clear b+down": lambda s, r: s.runs.clear(r, ["b"], downstream=True),
    "retry": lambda s, r: s.runs.retry(r),
    "mark b success": lambda s, r: s.runs.mark(r, "b", "success"),
    "mark a failed": lambda s, r: s.runs.mark(r, "a", "failed"),
    "mark leaf failed": lambda s, r: s.runs.mark(r, "leaf", "failed"),
    "mark c skipped": lambda s, r: s.runs.mark(r, "c", "skipped"),
    "cancel": lambda s, r: s.runs.cancel(r),
    "resume": lambda s, r: s.runs.resume(r),
}
# Where the operations start: a new run; its root's attempt running (a stale report of it
# comes after the operations); the run served to its end (PAUSED under pause).
STAGES = ("new", "a running", "ended")
TERMINAL = {"SUCCESS", "FAILED", "UPSTREAM_FAILED", "SKIPPED"}


def outcome(row: MovedTask) -> Outcome:
    """What an attempt of ``row``'s task ends with: b fails, the rest succeed."""
    if row.task_id == "b":
        return Failed(**attempt_of(row), message="b is broken")
    return Succeeded(**attempt_of(row), output_json="1")


async def serve(store: Store, run_id: str, where: str) -> None:
    """Play a worker until the run ends or pauses; a RUNNING run with nothing to run is
    stuck (it would never end)."""
    for _ in range(10):
        info = await store.views.run_info(run_id)
        assert info is not None
        if info["state"] != "RUNNING":
            return
        rows = await claim(store, "worker", 10)
        assert rows, f"{where}: the run is RUNNING with nothing to run"
        assert {r.run_id for r in rows} == {run_id}, where
        await complete(store, [outcome(r) for r in rows])
    raise AssertionError(f"{where}: the run did not end")


async def check(store: Store, run_id: str, where: str) -> None:
    info = await store.views.run_info(run_id)
    assert info is not None
    run = info["state"]
    tasks = {r["task_id"]: r for r in await store.views.run_tasks(run_id)}
    states = {t: r["state"] for t, r in tasks.items()}
    unfinished = [t for t, s in states.items() if s not in TERMINAL]
    said = f"{where}: run {run}, tasks {states}"
    if run in ("SUCCESS", "FAILED", "CANCELLED"):
        assert not unfinished, said
    if run == "RUNNING":  # (a PAUSED run may have nothing left: it waits for a person)
        assert unfinished, said + " (nothing left to end it)"
    if run == "SUCCESS" or (
        run == "FAILED" and not (info["state_reason"] or "").startswith("fail_fast")
    ):  # (fail_fast ends it FAILED at its first failed task, whatever its leaves)
        leaf_failed = any(
            r["is_leaf"] and r["state"] in ("FAILED", "UPSTREAM_FAILED") for r in tasks.values()
        )
        assert run == ("FAILED" if leaf_failed else "SUCCESS"), said
    if run != "CANCELLED":
        for t in [t for t, s in states.items() if s in ("SKIPPED", "FAILED")]:  # a stop's
            log = await store.views.task_log(run_id, t)
            assert log is not None
            moves = [e for e in log if e["kind"] == "transition"]
            last = moves[-1]["message"] if moves else ""
            assert not (last or "").startswith("cancelled by"), f"{said}: {t} {last!r}"


async def one_case(store: Store, path: Path, stage: str, first: str, second: str) -> None:
    run_id = await store.runs.create_run(load_dag(str(path), "seq"), date(2026, 4, 25),
                                         dag_file=str(path))  # fmt: skip
    where = f"{stage}, {first}, {second}"
    ghost: list[MovedTask] = []
    if stage == "a running":
        ghost = await claim(store, "ghost", 1)
        assert [g.task_id for g in ghost] == ["a"]
    elif stage == "ended":
        await serve(store, run_id, where)
    for name in (first, second):
        with contextlib.suppress(ControlError):  # refused: nothing changed
            await OPS[name](store, run_id)
        await check(store, run_id, f"{where}: after {name}")
    # The root's attempt reports now: discarded if it was cleared or cancelled.
    await complete(store, [Succeeded(**attempt_of(g), output_json="1") for g in ghost])
    info = await store.views.run_info(run_id)
    assert info is not None
    if info["state"] == "RUNNING":
        await serve(store, run_id, where)
    await check(store, run_id, f"{where}: served to its end")


# On PostgreSQL the cases are played in this many lanes at once, each on a schema of its own
# (its own runs, its own claims): a case is some 90 round trips, and the lanes overlap one's
# client work with another's wait for the server. Every case still starts from a new run.
PG_LANES = 3


@asynccontextmanager
async def lane_stores(
    store: Store, backend: str, clock: FakeClock, lanes: int
) -> AsyncIterator[list[Store]]:
    """``store`` and ``lanes - 1`` more, each on a fresh schema of ``backend``'s server."""
    names = [await create_schema(backend) for _ in range(lanes - 1)]
    stores: list[Store] = []
    try:
        for name in names:
            stores.append(await open_store(with_params(backend, search_path=name), clock=clock))
        yield [store, *stores]
    finally:
        for s in stores:
            await s.close()
        for name in names:
            await drop_schema(backend, name)


async def play(store: Store, path: Path, policy: str, cases: list[tuple[str, str, str]]) -> None:
    for stage, first, second in cases:
        try:
            await one_case(store, path, stage, first, second)
        except Exception as exc:
            exc.add_note(f"case: {policy}, {stage}, {first}, {second}")
            raise


@pytest.mark.parametrize("policy", ["continue", "pause", "fail_fast"])
async def test_every_two_operations_leave_the_run_as_its_tasks_say(
    store: Store, backend: str, clock: FakeClock, tmp_path: Path, policy: str
) -> None:
    path = write_dag(tmp_path, DAG_SOURCE.format(policy=policy), "seq.py")
    cases = [
        (stage, first, second)
        for stage in STAGES
        for first, second in itertools.product(OPS, repeat=2)
    ]
    lanes = 1 if backend.startswith("sqlite") else PG_LANES
    async with lane_stores(store, backend, clock, lanes) as stores, asyncio.TaskGroup() as tg:
        for i, s in enumerate(stores):  # a failing lane cancels the others
            tg.create_task(play(s, path, policy, cases[i :: len(stores)]))
