"""Declaring DAGs: parents, ``>>``, validation (unknown parent, duplicate id, cycles), levels."""

from __future__ import annotations

import itertools
import re
from datetime import date, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.helpers import sql

from executor import DAG, DagError, TriggerRule
from executor.dag import find_cycle
from executor.store import Store


def noop(ctx):
    return None


def dag_of(edges: dict[str, list[str]], dag_id: str = "d") -> DAG:
    """A DAG whose task ``t`` has the parents ``edges[t]``, declared in dict order."""
    dag = DAG(dag_id)
    for tid, parents in edges.items():
        dag.task(noop, task_id=tid, parents=parents)
    return dag


def assert_real_cycle(message: str, dag: DAG) -> list[str]:
    m = re.fullmatch(r"cycle: (.+)", message)
    assert m, message
    path = m.group(1).split(" -> ")
    assert len(path) >= 2 and path[0] == path[-1], message
    for parent, child in itertools_pairwise(path):
        assert parent in dag.tasks[child].parents, f"{parent} -> {child} is not an edge"
    return path


def itertools_pairwise(seq: list[str]):
    return itertools.pairwise(seq)


def test_cycle_error_names_the_cycle() -> None:
    dag = DAG("cyc")
    a, b, c = (dag.task(noop, task_id=t) for t in "abc")
    a >> b >> c >> a
    with pytest.raises(DagError, match=r"^cycle: a -> b -> c -> a$"):
        dag.validate()


def test_cycle_behind_an_acyclic_prefix_names_only_the_cycle() -> None:
    dag = dag_of({"x": [], "a": ["x", "c"], "b": ["a"], "c": ["b"], "y": ["c"]})
    with pytest.raises(DagError) as err:
        dag.validate()
    assert str(err.value) == "cycle: a -> b -> c -> a"


def test_self_loop_is_a_cycle() -> None:
    dag = dag_of({"a": [], "b": ["a", "b"]})
    with pytest.raises(DagError, match=r"^cycle: b -> b$"):
        dag.validate()


def test_a_deferrable_sensor_on_a_class_not_allow_listed_is_refused_by_validate() -> None:
    from support.triggers import UnlistedTrigger

    dag = DAG("waits")
    dag.sensor("wait", UnlistedTrigger(name="x"))
    with pytest.raises(DagError, match=r"sensor 'wait': trigger class .*Unlisted\w* is not allow"):
        dag.validate()
    # Checked in the worker's slot, not by the triggerer: no allow-list to pass.
    slot = DAG("slot")
    slot.sensor("wait", UnlistedTrigger(name="x"), mode="reschedule")
    slot.validate()


def test_unknown_parent() -> None:
    dag = dag_of({"a": [], "b": ["a", "ghost"]})
    with pytest.raises(DagError, match=r"task 'b' has unknown parent 'ghost'"):
        dag.validate()


def test_duplicate_task_id() -> None:
    dag = DAG("dup")
    dag.task(noop, task_id="a")
    with pytest.raises(DagError, match=r"duplicate task id 'a' in DAG 'dup'"):
        dag.task(noop, task_id="a")

    @dag.task
    def b(ctx):
        return 1

    with pytest.raises(DagError, match="duplicate task id 'b'"):

        @dag.task
        def b(ctx):
            return 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trigger_rule": "sometimes"}, "unknown trigger rule 'sometimes'"),
        ({"retries": -1}, "retries must be >= 0"),
        ({"map_cap": -1, "expand": "a"}, "map_cap must be >= 0"),
        ({"expand": "a", "trigger_rule": "one_success"}, "cannot use trigger rule one_success"),
    ],
)
def test_bad_task_options(kwargs: dict, message: str) -> None:
    dag = DAG("opts")
    dag.task(noop, task_id="a")
    with pytest.raises(DagError, match=re.escape(message)):
        dag.task(noop, task_id="b", **kwargs)


@pytest.mark.parametrize("bad", ["", "has space", "semi;colon", "slash/id"])
def test_bad_dag_id(bad: str) -> None:
    with pytest.raises(DagError, match="invalid DAG id"):
        DAG(bad)


def test_durations_are_parsed() -> None:
    dag = DAG("durations")
    t = dag.task(noop, task_id="t", retry_delay="1m30s", execution_timeout=timedelta(minutes=2))
    assert t.retry_delay == 90.0
    assert t.execution_timeout == 120.0
    with pytest.raises(ValueError, match="cannot read"):
        dag.task(noop, task_id="u", retry_delay="soon")


def test_rshift_sets_parents() -> None:
    dag = DAG("shift")
    a, b, c, d, e = (dag.task(noop, task_id=t) for t in "abcde")
    assert (a >> b) is b
    a >> b  # twice: no duplicate edge
    b >> [c, d]
    [c, d] >> e
    assert a.parents == []
    assert b.parents == ["a"]
    assert c.parents == ["b"] and d.parents == ["b"]
    assert e.parents == ["c", "d"]
    chain = DAG("chain")
    x, y, z = (chain.task(noop, task_id=t) for t in "xyz")
    x >> y >> z
    assert (y.parents, z.parents) == (["x"], ["y"])


def test_parents_given_as_specs_or_ids() -> None:
    dag = DAG("refs")
    a = dag.task(noop, task_id="a")
    b = dag.task(noop, task_id="b", parents=[a])
    c = dag.task(noop, task_id="c", parents=["a", b])
    assert b.parents == ["a"]
    assert c.parents == ["a", "b"]
    assert dag.children("a") == ["b", "c"]
    assert c.trigger_rule is TriggerRule.ALL_SUCCESS


def test_a_long_chain_validates_without_recursion() -> None:
    n = 10_000
    parents = {f"t{i}": ([f"t{i - 1}"] if i else []) for i in range(n)}
    assert find_cycle(parents) is None
    parents["t0"] = [f"t{n - 1}"]
    cycle = find_cycle(parents)
    assert cycle is not None and len(cycle) == n + 1 and cycle[0] == cycle[-1]


@st.composite
def graphs(draw) -> dict[str, list[str]]:
    """Random graphs on up to 12 nodes: a random order plus forward edges, some back edges."""
    n = draw(st.integers(1, 12))
    names = [f"n{i}" for i in draw(st.permutations(range(n)))]
    parents: dict[str, list[str]] = {name: [] for name in names}
    for j in range(n):
        for i in range(j):
            if draw(st.booleans()):
                parents[names[j]].append(names[i])
    back = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2))
    for i, j in back:
        if i >= j and names[j] not in parents[names[i]]:
            parents[names[i]].append(names[j])  # an edge from a later node to an earlier one
    return parents


def has_cycle(parents: dict[str, list[str]]) -> bool:
    """Kahn's algorithm: a cycle is whatever cannot be peeled off."""
    waiting = {t: len(ps) for t, ps in parents.items()}
    ready = [t for t, n in waiting.items() if n == 0]
    seen = 0
    while ready:
        t = ready.pop()
        seen += 1
        for child, ps in parents.items():
            for p in ps:
                if p == t:
                    waiting[child] -= 1
                    if waiting[child] == 0:
                        ready.append(child)
    return seen < len(parents)


@given(graphs())
def test_validate_finds_exactly_the_cyclic_graphs(parents: dict[str, list[str]]) -> None:
    dag = dag_of(parents)
    if has_cycle(parents):
        with pytest.raises(DagError) as err:
            dag.validate()
        path = assert_real_cycle(str(err.value), dag)
        assert len(set(path[:-1])) == len(path) - 1, "a simple cycle visits each task once"
    else:
        dag.validate()


async def test_invalid_dag_writes_nothing(store: Store, db_path) -> None:
    """Validation runs before any row is written: a bad DAG leaves the store empty."""
    dag = dag_of({"a": ["c"], "b": ["a"], "c": ["b"]}, dag_id="bad")
    with pytest.raises(DagError, match="cycle"):
        await store.runs.create_run(dag, date(2026, 1, 1))
    dag2 = dag_of({"a": ["nope"]}, dag_id="bad2")
    with pytest.raises(DagError, match="unknown parent"):
        await store.runs.create_run(dag2, date(2026, 1, 1))
    for table in ("dag_run", "task", "edge", "task_event"):
        assert sql(db_path, f"SELECT count(*) AS n FROM {table}")[0]["n"] == 0


async def test_a_parent_named_twice_is_one_edge(store: Store, db_path) -> None:
    dag = DAG("twice")
    a = dag.task(noop, task_id="a")
    b = dag.task(noop, task_id="b", parents=[a, "a"])
    assert b.parents == ["a"]
    run_id = await store.runs.create_run(dag, date(2026, 1, 1))
    (row,) = sql(db_path, "SELECT n_parents FROM task WHERE run_id = ? AND task_id = 'b'", run_id)
    assert row["n_parents"] == 1


async def test_create_run_makes_only_roots_claimable(store: Store, db_path) -> None:
    dag = dag_of({"a": [], "b": ["a"], "c": ["a", "b"], "d": []})
    run_id = await store.runs.create_run(dag, date(2026, 1, 1))
    rows = {r["task_id"]: r for r in sql(db_path, "SELECT * FROM task WHERE run_id = ?", run_id)}
    assert {t for t, r in rows.items() if r["ready_at"] is not None} == {"a", "d"}
    assert {t: r["n_parents"] for t, r in rows.items()} == {"a": 0, "b": 1, "c": 2, "d": 0}
    assert {t: r["is_leaf"] for t, r in rows.items()} == {"a": 0, "b": 0, "c": 1, "d": 1}
    edges = sql(db_path, "SELECT parent, child FROM edge WHERE run_id = ?", run_id)
    assert sorted((e["parent"], e["child"]) for e in edges) == [("a", "b"), ("a", "c"), ("b", "c")]


def test_a_context_reads_back_its_log_lines_in_order() -> None:
    from executor.context import TaskContext

    ctx = TaskContext("r", "d", "t", date(2026, 1, 1), attempt=1, max_attempts=1)
    assert ctx.lines == []
    ctx.log("first")
    ctx.log(2)
    assert [text for _, text in ctx.lines] == ["first", "2"]
    assert ctx.lines[0][0] <= ctx.lines[1][0]
