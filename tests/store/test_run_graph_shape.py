"""The run page's read carries its DAG's catalogued shape on both backends, read in the
same snapshot as the run (the graph folds the shape's task groups); a run of a DAG the
catalogue does not hold has none, and its groups are read from the dots in its ids."""

from __future__ import annotations

from datetime import date

from support import backends
from support.helpers import REPO

from executor.loader import load_dag
from executor.store import Store
from executor.store.catalogue import DeclaredDag
from executor.store.runs import RunShape
from executor.taskgroups import run_tree

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

EXAMPLE = REPO / "examples" / "task_groups.py"


async def test_the_run_graph_has_the_catalogued_shape_and_its_groups(store: Store) -> None:
    dag = load_dag(str(EXAMPLE))
    shape = RunShape.of(dag).to_json()
    await store.catalogue.record_parse(
        str(EXAMPLE), 1.0, [DeclaredDag(dag.dag_id, shape=shape)], None
    )
    run_id = await store.runs.create_run(dag, date(2026, 6, 1))
    g = await store.views.run_graph(run_id)
    assert g is not None and g.shape == shape
    tree = run_tree(g.shape, [t.task_id for t in g.tasks])
    assert [(gr.group_id, gr.over) for _, gr in tree.walk()] == [
        ("setup", None), ("per_file", "list_files"), ("per_file.checks", None),
    ]  # fmt: skip


async def test_a_run_of_a_dag_not_catalogued_has_its_groups_from_its_ids(store: Store) -> None:
    run_id = await store.runs.create_run(load_dag(str(EXAMPLE)), date(2026, 6, 1))
    g = await store.views.run_graph(run_id)
    assert g is not None and g.shape is None
    tree = run_tree(g.shape, [t.task_id for t in g.tasks])
    assert [gr.group_id for _, gr in tree.walk()] == ["setup", "per_file", "per_file.checks"]
    assert all(gr.over is None for _, gr in tree.walk())  # mapped groups not told apart
