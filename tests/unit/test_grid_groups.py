"""A DAG page's grid with task groups: a row per group above its tasks (indented under it),
its cells its tasks' states together; a folded group is one row; a group's tasks are kept
together even where the topological order splits them."""

from __future__ import annotations

from executor.store.grid import Grid, GridCell, GridRun
from slotless.web.dag_page import Query, grid_shown

TASKS = ["start", "extract.a", "extract.s3.b", "load", "extract.c"]  # topological
STATES = {"start": "SUCCESS", "extract.a": "SUCCESS", "extract.s3.b": "FAILED",
          "load": "UPSTREAM_FAILED", "extract.c": "UPSTREAM_FAILED"}  # fmt: skip


def grid() -> Grid:
    run = GridRun("r1", "2026-11-26", "FAILED", 1.0, 9.0, None, None, None)
    cells = {("r1", t): GridCell("r1", t, s, 2.0, 3.0) for t, s in STATES.items()}
    # Not catalogued: the groups are read from the dots in the task ids.
    return Grid("etl", None, None, [run], TASKS, cells, {}, {}, None, None, True, 10.0)


def rows(q: Query) -> list[tuple[str, bool, int]]:
    return [(r.task_id, r.group, r.depth) for r in grid_shown(grid(), q).rows]


def test_each_group_is_a_row_above_its_tasks_which_stay_together() -> None:
    assert rows(Query()) == [
        ("start", False, 0),
        ("extract", True, 0),
        ("extract.a", False, 1),
        ("extract.s3", True, 1),
        ("extract.s3.b", False, 2),
        ("extract.c", False, 1),  # after its group's others, not after load
        ("load", False, 0),
    ]


def test_a_groups_cell_is_its_tasks_states_together_and_opens_the_run() -> None:
    shown = {r.task_id: r for r in grid_shown(grid(), Query()).rows}
    [cell] = shown["extract"].cells
    assert cell is not None and cell.state == "FAILED" and cell.mixed
    assert cell.href == "/runs/r1"
    assert "extract" in cell.title and "3 tasks" in cell.title
    [inner] = shown["extract.s3"].cells
    assert inner is not None and inner.state == "FAILED" and not inner.mixed


def test_a_folded_group_is_one_row_and_its_link_unfolds_it() -> None:
    folded = Query(fold=("extract",))
    assert rows(folded) == [("start", False, 0), ("extract", True, 0), ("load", False, 0)]
    row = next(r for r in grid_shown(grid(), folded).rows if r.group)
    assert not row.expanded and "fold=" not in row.toggle  # unfolding: back to no fold
    opened = next(r for r in grid_shown(grid(), Query()).rows if r.task_id == "extract")
    assert opened.expanded and "fold=extract" in opened.toggle
    # A folded subgroup: its parent still opens, the subgroup is one row.
    inner = Query(fold=("extract.s3",))
    assert ("extract.s3.b", False, 2) not in rows(inner)
    assert ("extract.s3", True, 1) in rows(inner) and ("extract.c", False, 1) in rows(inner)
