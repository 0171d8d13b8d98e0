"""Named values (ctx.push / ctx.pull) and setup/teardown tasks on both backends, through
real runs served by an in-process worker: values written with the SUCCESS and only then,
read downstream (a mapped task's as a list), bounded, cleared with their task; teardowns
that run after a failure, are skipped with their setup, and fail the run only when asked.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from support import backends
from support.helpers import run_to_end

from executor import DAG
from executor.context import MAX_VALUE_BYTES, Published, TaskContext
from executor.store import Store
from executor.store.values import Values

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

DAY = date(2026, 4, 25)


async def run(store: Store, dag: DAG, **kw: Any) -> tuple[str, dict[str, Any]]:
    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=2, **kw)
    return run_id, info


async def states(store: Store, run_id: str) -> dict[str, str]:
    return {
        r["task_id"]: r["state"] for r in await store.views.run_tasks(run_id) if r["map_index"] < 0
    }


async def published(store: Store, run_id: str, *task_ids: str) -> dict[str, Published]:
    return await Values(store.db, store.clock).published(run_id, list(task_ids))


async def error_of(store: Store, run_id: str, task_id: str) -> str:
    [row] = await store.views.failed_tasks(run_id, 5, task_id)
    return str(row["error"])


def values_dag() -> DAG:
    dag = DAG("values")

    @dag.task
    def extract(ctx: TaskContext) -> list[int]:
        ctx.push("rows", 12)
        ctx.push("source", {"bucket": "raw", "key": "2026-04-25.csv"})
        return [1, 2, 3]

    @dag.task(expand=extract)
    def square(ctx: TaskContext) -> int:
        if ctx.item != 2:  # instance 1 pushes nothing: None in the list
            ctx.push("sq", ctx.item * ctx.item)
        return int(ctx.item)

    @dag.task(parents=[square])
    def load(ctx: TaskContext) -> dict[str, Any]:
        return {
            "rows": ctx.pull("extract", "rows"),  # a grandparent: an ancestor
            "source": ctx.pull("extract", "source"),
            "extracted": ctx.pull("extract"),  # its return value
            "squares": ctx.pull("square", "sq"),
            "items": ctx.pull("square"),
            "missing": ctx.pull("extract", "nope", default="none"),
        }

    return dag


async def test_a_value_pushed_is_pulled_downstream_and_a_mapped_tasks_as_a_list(
    store: Store,
) -> None:
    run_id, info = await run(store, values_dag())
    assert info["state"] == "SUCCESS"
    got = await published(store, run_id, "load", "extract", "square")
    assert got["load"].output == {
        "rows": 12,
        "source": {"bucket": "raw", "key": "2026-04-25.csv"},
        "extracted": [1, 2, 3],
        "squares": [1, None, 9],
        "items": [1, 2, 3],
        "missing": "none",
    }
    assert got["extract"].values == {
        "rows": 12,
        "source": {"bucket": "raw", "key": "2026-04-25.csv"},
    }
    assert got["square"].values == {"sq": [1, None, 9]}


async def test_a_value_over_the_limit_fails_the_task_in_one_line_naming_key_and_limit(
    store: Store,
) -> None:
    dag = DAG("big")

    @dag.task
    def big(ctx: TaskContext) -> None:
        ctx.push("blob", "x" * MAX_VALUE_BYTES)  # its JSON quotes make it 2 bytes over

    run_id, info = await run(store, dag)
    assert info["state"] == "FAILED"
    error = await error_of(store, run_id, "big")
    assert "'blob'" in error and f"limit of {MAX_VALUE_BYTES} bytes" in error
    assert "\n" not in error


async def test_a_key_that_cannot_be_stored_fails_the_push_not_the_recording(
    store: Store,
) -> None:
    dag = DAG("badkey")

    @dag.task
    def nul(ctx: TaskContext) -> None:
        ctx.push("a\x00b", 1)  # PostgreSQL's text holds no NUL

    run_id, info = await run(store, dag)
    assert info["state"] == "FAILED"
    assert "ctx.push: the key must be a name" in await error_of(store, run_id, "nul")


async def test_a_failed_attempts_pushes_are_discarded_and_a_retry_keeps_its_own(
    store: Store,
) -> None:
    dag = DAG("retried")

    @dag.task(retries=1, retry_delay=0)
    def flaky(ctx: TaskContext) -> str:
        ctx.push("attempt", ctx.attempt)
        if ctx.attempt == 1:
            ctx.push("first_only", True)
            raise RuntimeError("the first attempt fails after pushing")
        return "ok"

    @dag.task
    def doomed(ctx: TaskContext) -> None:
        ctx.push("never", 1)
        raise RuntimeError("fails for good")

    run_id, info = await run(store, dag)
    assert info["state"] == "FAILED"
    got = await published(store, run_id, "flaky", "doomed")
    assert got["flaky"].values == {"attempt": 2}
    assert got["doomed"].values == {}


async def test_pulling_from_a_task_that_is_not_upstream_fails_in_one_line(store: Store) -> None:
    dag = DAG("sideways")

    @dag.task
    def a(ctx: TaskContext) -> None:
        ctx.push("k", 1)

    @dag.task
    def b(ctx: TaskContext) -> Any:
        return ctx.pull("a", "k")

    run_id, info = await run(store, dag)
    assert info["state"] == "FAILED"
    assert await states(store, run_id) == {"a": "SUCCESS", "b": "FAILED"}
    error = await error_of(store, run_id, "b")
    assert "ctx.pull('a'): a is not upstream of b" in error and "\n" not in error


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_values_cross_a_forked_slot_and_are_forgotten_when_cleared(
    store: Store, isolation: str
) -> None:
    dag = values_dag()
    run_id, info = await run(store, dag, isolation=isolation)
    assert info["state"] == "SUCCESS"
    assert (await published(store, run_id, "load")).get("load", Published()).output["squares"] == [
        1,
        None,
        9,
    ]
    done = await store.runs.clear(run_id, ["extract"], downstream=True)
    assert done.tasks == ["extract", "square", "load"]
    got = await published(store, run_id, "extract", "square", "load")
    assert got["extract"].values == {} and got["square"].values == {}
    assert got["load"].output is None
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=2)
    assert info["state"] == "SUCCESS"
    assert (await published(store, run_id, "extract"))["extract"].values["rows"] == 12


# -- setup and teardown -------------------------------------------------------------------


def cluster_dag(
    *, work_fails: bool = False, teardown_fails: bool = False, setup: str = "ok",
    fail_run: bool = False,
) -> DAG:  # fmt: skip
    dag = DAG("cluster")

    @dag.task(branch=True)
    def choose(ctx: TaskContext) -> list[str]:
        return [] if setup == "skipped" else ["create"]

    @dag.task(parents=[choose], setup=True)
    def create(ctx: TaskContext) -> str:
        if setup == "fails":
            raise RuntimeError("no capacity")
        ctx.push("cluster", "c-1")
        return "c-1"

    @dag.task(parents=[create])
    def query(ctx: TaskContext) -> int:
        if work_fails:
            raise RuntimeError("query failed")
        return 7

    @dag.task(parents=[query], teardown_of=[create], on_failure_fail_run=fail_run)
    def delete(ctx: TaskContext) -> str:
        if teardown_fails:
            raise RuntimeError("delete failed")
        return f"deleted {ctx.pull('create', 'cluster')}"

    return dag


async def test_a_teardown_runs_after_its_work_failed_and_the_run_still_fails(
    store: Store,
) -> None:
    run_id, info = await run(store, cluster_dag(work_fails=True))
    assert await states(store, run_id) == {
        "choose": "SUCCESS", "create": "SUCCESS", "query": "FAILED", "delete": "SUCCESS",
    }  # fmt: skip
    assert (await published(store, run_id, "delete"))["delete"].output == "deleted c-1"
    assert info["state"] == "FAILED"  # the work before the teardown decides


async def test_a_teardowns_failure_does_not_fail_the_run_unless_asked(store: Store) -> None:
    run_id, info = await run(store, cluster_dag(teardown_fails=True))
    assert (await states(store, run_id))["delete"] == "FAILED"
    assert info["state"] == "SUCCESS"


async def test_a_teardown_that_says_so_fails_the_run(store: Store) -> None:
    run_id, info = await run(store, cluster_dag(teardown_fails=True, fail_run=True))
    assert (await states(store, run_id))["delete"] == "FAILED"
    assert info["state"] == "FAILED"


async def test_a_teardown_is_skipped_with_its_setup(store: Store) -> None:
    run_id, info = await run(store, cluster_dag(setup="skipped"))
    assert await states(store, run_id) == {
        "choose": "SUCCESS", "create": "SKIPPED", "query": "SKIPPED", "delete": "SKIPPED",
    }  # fmt: skip
    assert info["state"] == "SUCCESS"


async def test_a_teardown_whose_setup_failed_does_not_run(store: Store) -> None:
    run_id, info = await run(store, cluster_dag(setup="fails"))
    assert await states(store, run_id) == {
        "choose": "SUCCESS", "create": "FAILED", "query": "UPSTREAM_FAILED",
        "delete": "UPSTREAM_FAILED",
    }  # fmt: skip
    assert info["state"] == "FAILED"


async def test_clearing_a_task_clears_its_setup_and_teardown(store: Store) -> None:
    dag = cluster_dag(work_fails=True)
    run_id, _ = await run(store, dag)
    done = await store.runs.clear(run_id, ["query"])
    assert done.tasks == ["create", "query", "delete"]
    assert (await published(store, run_id, "create"))["create"].values == {}
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=2)
    assert info["state"] == "FAILED"  # the query fails again; the cluster was set up again
    assert (await states(store, run_id))["delete"] == "SUCCESS"
    # Above the setup is outside its scope: cleared alone. The setup brings its teardown.
    assert (await store.runs.clear(run_id, ["choose"])).tasks == ["choose"]
    await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=2)
    assert (await store.runs.clear(run_id, ["create"])).tasks == ["create", "delete"]
