"""Mapping forms and mapped task groups on both backends: a cross product of several lists
(literal or upstream), expand_kwargs over a list of dicts, a literal list, a mapped group
whose instance i of a task waits for instance i of its parents in the group, the width
cap, and expanding again creating nothing twice."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

from support import backends
from support.exchanging import claim, complete
from support.helpers import attempt_of, raw_sql, run_to_end

from executor import DAG, TaskContext
from executor.outcomes import Failed, Outcome, Succeeded
from executor.rows import MovedTask, TaskRow
from executor.statemachine import evaluate
from executor.store import Store

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 4, 25)


async def rows_of(url: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
    """A task's instances in index order (its template row when it has none)."""
    rows = await raw_sql(
        url,
        f"SELECT * FROM task WHERE run_id = '{run_id}' AND task_id = '{task_id}' "
        "ORDER BY map_index",
    )
    return [dict(r) for r in rows]


async def template(url: str, run_id: str, task_id: str) -> dict[str, Any]:
    return (await rows_of(url, run_id, task_id))[0]


def output(row: dict[str, Any]) -> Any:
    return None if row["output"] is None else json.loads(row["output"])


def ok(row: MovedTask, value: Any = None) -> Outcome:
    return Succeeded(**attempt_of(row), output_json=json.dumps(value))


def failed(row: MovedTask) -> Outcome:
    return Failed(**attempt_of(row), message="boom")


async def test_a_cross_product_of_a_literal_list_and_an_upstream(store: Store, url: str) -> None:
    dag = DAG("product")

    @dag.task
    def sizes(ctx: TaskContext) -> list[int]:
        return [10, 20, 30]

    @dag.task
    def resize(ctx: TaskContext, fmt: str, size: int, quality: int) -> str:
        assert ctx.item == {"fmt": fmt, "size": size}
        return f"{fmt}@{size}q{quality}"

    resize.partial(quality=90).expand(fmt=["png", "jpg"], size=sizes)

    @dag.task(parents=[resize])
    def done(ctx: TaskContext) -> list[str]:
        return ctx.inputs["resize"]

    run_id = await store.runs.create_run(dag, DAY)
    assert (await run_to_end(store, run_id, dags={dag.dag_id: dag}))["state"] == "SUCCESS"
    instances = await rows_of(url, run_id, "resize")
    # itertools.product order: the first argument varies slowest.
    assert output(await template(url, run_id, "done")) == [
        "png@10q90", "png@20q90", "png@30q90", "jpg@10q90", "jpg@20q90", "jpg@30q90",
    ]  # fmt: skip
    assert [r["map_index"] for r in instances[1:]] == list(range(6))
    assert instances[0]["map_total"] == 6


async def test_expand_kwargs_over_an_upstream_list_of_dicts(store: Store, url: str) -> None:
    dag = DAG("kwargs")

    @dag.task
    def jobs(ctx: TaskContext) -> list[dict[str, Any]]:
        return [{"table": "a", "rows": 1}, {"table": "b", "rows": 2}]

    @dag.task
    def copy(ctx: TaskContext, table: str, rows: int, schema: str) -> str:
        return f"{schema}.{table}:{rows}"

    copy.partial(schema="raw").expand_kwargs(jobs)

    @dag.task
    def literal(ctx: TaskContext, x: int) -> int:
        return x * 2

    literal.expand_kwargs([{"x": 1}, {"x": 2}, {"x": 3}])

    run_id = await store.runs.create_run(dag, DAY)
    assert (await run_to_end(store, run_id, dags={dag.dag_id: dag}))["state"] == "SUCCESS"
    assert [output(r) for r in (await rows_of(url, run_id, "copy"))[1:]] == ["raw.a:1", "raw.b:2"]
    assert [output(r) for r in (await rows_of(url, run_id, "literal"))[1:]] == [2, 4, 6]


async def test_expand_kwargs_over_something_not_dicts_fails_naming_the_item(
    store: Store, url: str
) -> None:
    dag = DAG("kwargs_bad")

    @dag.task
    def jobs(ctx: TaskContext) -> list[Any]:
        return [{"x": 1}, 5]

    @dag.task
    def use(ctx: TaskContext, x: int) -> int:
        return x

    use.expand_kwargs(jobs)
    run_id = await store.runs.create_run(dag, DAY)
    assert (await run_to_end(store, run_id, dags={dag.dag_id: dag}))["state"] == "FAILED"
    tpl = await template(url, run_id, "use")
    assert tpl["state"] == "FAILED" and len(await rows_of(url, run_id, "use")) == 1
    [reason] = await raw_sql(
        url,
        f"SELECT message FROM task_event WHERE task_row = {tpl['id']} AND to_state = 'FAILED'",
    )
    assert "item 1 is int 5, not a dict of keyword arguments" in reason["message"]


async def test_a_literal_list_needs_no_upstream(store: Store, url: str) -> None:
    dag = DAG("literal")

    @dag.task(expand=["eu", "us", "ap"])
    def region(ctx: TaskContext) -> str:
        return f"{ctx.index}:{ctx.item}/{ctx.total}"

    run_id = await store.runs.create_run(dag, DAY)
    assert (await run_to_end(store, run_id, dags={dag.dag_id: dag}))["state"] == "SUCCESS"
    rows = await rows_of(url, run_id, "region")
    assert [output(r) for r in rows[1:]] == ["0:eu/3", "1:us/3", "2:ap/3"]
    assert rows[0]["n_parents"] == 3  # counted instances, as any mapped task


def per_file_dag(files: list[str] | None = None) -> DAG:
    dag = DAG("per_file")

    @dag.task
    def list_files(ctx: TaskContext) -> list[str]:
        return files or ["a.csv", "b.csv", "c.csv"]

    with dag.group("per_file", expand=list_files) as per_file:

        @dag.task
        def extract(ctx: TaskContext) -> str:
            return ctx.item.upper()

        @dag.task(parents=[extract])
        def load(ctx: TaskContext) -> str:
            return f"{ctx.item}->{ctx.inputs['per_file.extract']}"

    @dag.task(parents=[per_file])
    def report(ctx: TaskContext) -> list[str]:
        return ctx.inputs["per_file.load"]

    return dag


async def test_a_mapped_group_runs_each_index_as_a_unit(store: Store, url: str) -> None:
    run_id = await store.runs.create_run(per_file_dag(), DAY)
    [first] = await claim(store, "w", 10)
    assert first.task_id == "list_files"
    # Both members expand with the group; only extract's instances are ready.
    ready = await store.exchange.exchange([ok(first, ["a.csv", "b.csv", "c.csv"])], "w", 10)
    assert sorted((r.task_id, r.map_index) for r in ready) == [
        ("per_file.extract", 0), ("per_file.extract", 1), ("per_file.extract", 2),
    ]  # fmt: skip
    loads = await rows_of(url, run_id, "per_file.load")
    assert [(r["map_index"], r["state"], r["ready_at"]) for r in loads] == [
        (-1, "RUNNING", None), (0, "PENDING", None), (1, "PENDING", None), (2, "PENDING", None),
    ]  # fmt: skip
    by_index = {r.map_index: r for r in ready}
    # extract[1] ends: load[1] is claimable while extract[0] and extract[2] still run.
    [load1] = await store.exchange.exchange([ok(by_index[1], "B.CSV")], "w", 10)
    assert (load1.task_id, load1.map_index) == ("per_file.load", 1)
    # extract[0] fails: load[0] ends UPSTREAM_FAILED, without running.
    await complete(store, [failed(by_index[0]), ok(load1, "b.csv->B.CSV")])
    [load2] = await store.exchange.exchange([ok(by_index[2], "C.CSV")], "w", 10)
    assert load2.map_index == 2 and json.loads(str(load2.item)) == {
        "item": "c.csv",
        "inputs": {"per_file.extract": "C.CSV"},
    }
    await complete(store, [ok(load2, "c.csv->C.CSV")])
    loads = await rows_of(url, run_id, "per_file.load")
    states = ["UPSTREAM_FAILED", "UPSTREAM_FAILED", "SUCCESS", "SUCCESS"]  # template first
    assert [r["state"] for r in loads] == states
    report = await template(url, run_id, "report")
    assert report["state"] == "UPSTREAM_FAILED"
    info = await store.views.run_info(run_id)
    assert info is not None and info["state"] == "FAILED"


async def test_a_mapped_group_end_to_end_with_a_worker(store: Store, url: str) -> None:
    dag = per_file_dag()
    run_id = await store.runs.create_run(dag, DAY)
    assert (await run_to_end(store, run_id, dags={dag.dag_id: dag}))["state"] == "SUCCESS"
    assert output(await template(url, run_id, "report")) == [
        "a.csv->A.CSV", "b.csv->B.CSV", "c.csv->C.CSV",
    ]  # fmt: skip


async def test_a_cross_product_past_the_cap_fails_naming_the_cap(store: Store, url: str) -> None:
    dag = DAG("capped")

    @dag.task(map_cap=5)
    def pair(ctx: TaskContext, a: int, b: int) -> int:
        return a * b

    pair.expand(a=[1, 2, 3], b=[4, 5, 6])

    @dag.task(parents=[pair], trigger_rule="all_done")
    def after(ctx: TaskContext) -> str:
        return "ran"

    run_id = await store.runs.create_run(dag, DAY)
    await run_to_end(store, run_id, dags={dag.dag_id: dag})
    rows = await rows_of(url, run_id, "pair")
    assert len(rows) == 1 and rows[0]["state"] == "FAILED"
    [event] = await raw_sql(
        url,
        f"SELECT message FROM task_event WHERE task_row = {rows[0]['id']} AND to_state = 'FAILED'",
    )
    assert "fan-out of 9 instances (3 (a) x 3 (b)) exceeds the cap of 5" in event["message"]
    assert output(await template(url, run_id, "after")) == "ran"


async def test_expanding_again_creates_nothing_twice(store: Store, url: str) -> None:
    run_id = await store.runs.create_run(per_file_dag(), DAY)
    [first] = await claim(store, "w", 10)
    await complete(store, [ok(first, ["a.csv", "b.csv"])])
    before = {t: await rows_of(url, run_id, t) for t in ("per_file.extract", "per_file.load")}
    # As a second worker replaying the expansion would (a takeover, a retried
    # transaction): the templates PENDING again, decided again.
    await raw_sql(
        url,
        f"UPDATE task SET state = 'PENDING', ready_at = NULL, n_parents = 1, n_done = 1, "
        f"n_success = 1 WHERE run_id = '{run_id}' AND map_index = -1 "
        "AND task_id LIKE 'per_file.%'",
    )
    async with store.db.write() as tx:
        rows = TaskRow.all(await tx.fetch("run_tasks", run_id=run_id))
        await evaluate(tx, rows, store.clock())
    for task_id, rows_before in before.items():
        after = await rows_of(url, run_id, task_id)
        assert [(r["id"], r["map_index"]) for r in after] == [
            (r["id"], r["map_index"]) for r in rows_before
        ]


async def finish(store: Store, outputs: dict[tuple[str, int], Any], fail: set[Any]) -> None:
    """Play a worker: claim and complete until nothing is claimable; ``fail`` names the
    (task, index) attempts that fail."""
    while claimed := await claim(store, "w", 50):
        await complete(
            store,
            [
                failed(r)
                if (r.task_id, r.map_index) in fail
                else ok(r, outputs.get((r.task_id, r.map_index)))
                for r in claimed
            ],
        )


async def test_clearing_a_task_of_a_mapped_group_runs_the_whole_group_again(
    store: Store, url: str
) -> None:
    run_id = await store.runs.create_run(per_file_dag(), DAY)
    outputs = {("list_files", -1): ["a", "b"]}
    await finish(store, outputs, fail={("per_file.extract", 0)})
    assert (await store.views.run_info(run_id) or {})["state"] == "FAILED"
    done = await store.runs.clear(run_id, ["per_file.extract"], downstream=True)
    # Its mate in the group is cleared with it (load's edge to it is per index, not in
    # the edge table), then what follows the group.
    assert done.tasks == ["per_file.extract", "per_file.load", "report"]
    await finish(store, outputs, fail=set())
    assert (await store.views.run_info(run_id) or {})["state"] == "SUCCESS"
    loads = await rows_of(url, run_id, "per_file.load")
    assert [r["state"] for r in loads] == ["SUCCESS"] * 3


async def test_clearing_only_failed_tasks_counts_the_group_parents_that_kept_their_instances(
    store: Store, url: str
) -> None:
    run_id = await store.runs.create_run(per_file_dag(), DAY)
    outputs = {("list_files", -1): ["a", "b"], ("per_file.extract", 1): "B"}
    await finish(store, outputs, fail={("per_file.load", 1)})
    extract = await rows_of(url, run_id, "per_file.extract")
    assert [r["state"] for r in extract] == ["SUCCESS"] * 3
    done = await store.runs.clear(run_id, failed_only=True)
    assert done.tasks == ["per_file.load", "report"]
    # load's new instances are ready at once: extract's instances ended before.
    claimed = await claim(store, "w", 10)
    assert sorted((r.task_id, r.map_index) for r in claimed) == [
        ("per_file.load", 0), ("per_file.load", 1),
    ]  # fmt: skip
    assert json.loads(str(claimed[1].item))["inputs"] == {"per_file.extract": "B"}
    await complete(store, [ok(r) for r in claimed])
    await finish(store, outputs, fail=set())
    assert (await store.views.run_info(run_id) or {})["state"] == "SUCCESS"
    assert [r["id"] for r in await rows_of(url, run_id, "per_file.extract")] == [
        r["id"] for r in extract
    ]  # not run again


async def test_a_group_over_a_literal_list_waits_for_a_parent_of_any_of_its_tasks(
    store: Store, url: str
) -> None:
    dag = DAG("literal_group")

    @dag.task
    def config(ctx: TaskContext) -> str:
        return "v2"

    with dag.group("per_region", expand=["eu", "us"]):

        @dag.task
        def fetch(ctx: TaskContext) -> str:
            return f"{ctx.item}-{ctx.index}"

        # A parent outside the group, declared on a task that is not a root of it: every
        # task of the group waits for it before the group expands.
        @dag.task(parents=[fetch, config], trigger_rule="all_done")
        def publish(ctx: TaskContext) -> list[str]:
            return [ctx.inputs["per_region.fetch"], ctx.inputs["config"]]

    run_id = await store.runs.create_run(dag, DAY)
    fetches = await rows_of(url, run_id, "per_region.fetch")
    assert [(r["state"], r["n_parents"]) for r in fetches] == [("PENDING", 1)]  # no instance
    assert (await run_to_end(store, run_id, dags={dag.dag_id: dag}))["state"] == "SUCCESS"
    assert [output(r) for r in (await rows_of(url, run_id, "per_region.publish"))[1:]] == [
        ["eu-0", "v2"], ["us-1", "v2"],
    ]  # fmt: skip
