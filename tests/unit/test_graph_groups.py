"""The run page's graph with task groups folded (``?fold=``): a folded group is one node
standing for its tasks at every depth, the edges into and out of it are drawn once each,
its colour is the grid's summary of its tasks' states, and its box unfolds it."""

from __future__ import annotations

import html
import re
from dataclasses import MISSING, fields
from typing import Any

import pytest
from support.helpers import REPO

from executor.loader import load_dag
from executor.rows import TaskRow
from executor.store.runs import RunShape
from executor.taskgroups import group_tree, run_tree, tree_from_ids
from slotless.web.graph import Drawing, drawing, fold, group_key, parse_fold
from slotless.web.render import environment, run_href, with_query

EXAMPLE = load_dag(REPO / "examples" / "task_groups.py")
TASKS = list(EXAMPLE.tasks)
EDGES = [(p, t) for t, spec in EXAMPLE.tasks.items() for p in spec.parents]
TREE = group_tree(RunShape.of(EXAMPLE).to_json())
PER_FILE = group_key("per_file")
CHECKS = group_key("per_file.checks")


def row(task_id: str, state: str, **more: Any) -> TaskRow:
    blank: dict[str, Any] = {
        f.name: None for f in fields(TaskRow) if f.default is MISSING and f.name != "id"
    }
    blank.update(run_id="r1", task_id=task_id, map_index=-1, state=state, attempt=1,
                 max_attempts=1, pool="default", pool_slots=1, queue="default", **more)  # fmt: skip
    return TaskRow(id=0, **blank)


def href(fold_ids: tuple[str, ...]) -> str:
    return with_query(run_href("r1"), {"fold": list(fold_ids)})


def test_nothing_folded_is_every_task_and_edge() -> None:
    shown = fold(TASKS, EDGES, TREE, ())
    assert shown.nodes == TASKS and shown.edges == EDGES and not shown.groups


def test_a_folded_group_stands_for_its_tasks_at_every_depth_and_its_edges_once() -> None:
    shown = fold(TASKS, EDGES, TREE, ("per_file",))
    assert shown.nodes == [
        "setup.check_quota", "setup.make_batch", "list_files", PER_FILE, "report",
    ]  # fmt: skip
    assert shown.members[PER_FILE] == [
        "per_file.extract", "per_file.checks.row_count", "per_file.checks.schema",
        "per_file.load",
    ]  # fmt: skip
    # Into the group: from each of its tasks' parents outside it, once; out of it: to report
    # (load's child), once; none between its own tasks.
    assert sorted(shown.edges) == sorted([
        ("setup.check_quota", "setup.make_batch"), ("setup.make_batch", PER_FILE),
        (PER_FILE, "report"),
    ])  # fmt: skip
    assert len(shown.edges) == len(set(shown.edges))


def test_a_folded_subgroup_and_a_folded_group_inside_a_folded_one() -> None:
    inner = fold(TASKS, EDGES, TREE, ("per_file.checks",))
    assert CHECKS in inner.nodes and "per_file.checks.schema" not in inner.nodes
    # extract had an edge to each check: one edge now; load had one from each: one.
    assert inner.edges.count(("per_file.extract", CHECKS)) == 1
    assert inner.edges.count((CHECKS, "per_file.load")) == 1
    assert ("per_file.extract", "per_file.load") in inner.edges  # around the group, kept
    both = fold(TASKS, EDGES, TREE, ("per_file.checks", "per_file"))
    assert both.nodes == fold(TASKS, EDGES, TREE, ("per_file",)).nodes  # the outer one wins
    assert CHECKS not in both.nodes


def test_an_unknown_group_is_ignored_and_a_task_named_as_a_group_stays_itself() -> None:
    ids = ["extract", "extract.a", "extract.b", "load"]
    edges = [("extract", "extract.a"), ("extract", "extract.b"), ("extract.a", "load"),
             ("extract.b", "load")]  # fmt: skip
    tree = tree_from_ids(ids)  # not catalogued: groups read from the dots
    shown = fold(ids, edges, tree, ("extract", "nope"))
    assert shown.nodes == ["extract", group_key("extract"), "load"]
    assert shown.edges == [("extract", group_key("extract")), (group_key("extract"), "load")]


def test_the_folded_box_summarises_its_tasks_as_the_grid_does_and_unfolds() -> None:
    states = {"setup.check_quota": "SUCCESS", "setup.make_batch": "SUCCESS",
              "list_files": "SUCCESS", "per_file.extract": "SUCCESS",
              "per_file.checks.row_count": "FAILED", "per_file.checks.schema": "SUCCESS",
              "per_file.load": "UPSTREAM_FAILED", "report": "UPSTREAM_FAILED"}  # fmt: skip
    tasks = [row(t, states[t]) for t in TASKS]
    d = drawing(tasks, EDGES, {}, lambda t: f"/t/{t}", tree=TREE, folded=("per_file",),
                fold_href=href)  # fmt: skip
    [box] = [b for b in d.boxes if b.group_id]
    assert box.group_id == "per_file" and box.task_id == ""
    assert box.state == "FAILED"  # trouble first, as the grid's folded row
    assert [(s.state, s.n) for s in box.strip] == [("SUCCESS", 2), ("FAILED", 1),
                                                   ("UPSTREAM_FAILED", 1)]  # fmt: skip
    assert box.href == "/runs/r1"  # unfolding it: nothing left folded
    assert "mapped group" in box.sub and "over list_files" in box.title
    assert "4 tasks: 2 ok / 1 failed / 1 upstream failed" in box.title
    assert len(d.boxes) == 5 and len(d.edges) == 3
    # The links: per_file unfolds, setup folds (keeping per_file folded); per_file.checks,
    # inside a folded group, has none.
    links = {g.group_id: g for g in d.groups}
    assert set(links) == {"setup", "per_file"}
    assert links["per_file"].folded and links["per_file"].href == "/runs/r1"
    assert links["setup"].href == "/runs/r1?fold=per_file&fold=setup"
    assert d.fold_all == "/runs/r1?fold=setup&fold=per_file" and d.unfold_all == "/runs/r1"
    nothing = drawing(tasks, EDGES, {}, str, tree=TREE, fold_href=href)
    assert nothing.unfold_all == "" and len(nothing.boxes) == len(TASKS)
    assert next(g for g in nothing.groups if g.group_id == "per_file.checks").href == (
        "/runs/r1?fold=per_file.checks"
    )


def test_a_run_without_groups_has_no_links_and_a_pending_group_is_pending() -> None:
    flat = drawing([row("a", "SUCCESS")], [], {}, str, tree=run_tree(None, ["a"]), fold_href=href)
    assert flat.groups == [] and flat.fold_all == ""
    tasks = [row(t, "PENDING") for t in TASKS]
    d = drawing(tasks, EDGES, {}, str, tree=TREE, folded=("setup",), fold_href=href)
    assert next(b for b in d.boxes if b.group_id).state == "PENDING"


def test_group_ids_are_escaped_in_the_drawing() -> None:
    ids = ['<b x="1">g</b>.t', "after"]
    tree = tree_from_ids(ids)
    d = drawing([row(t, "SUCCESS") for t in ids], [(ids[0], "after")], {}, str, tree=tree,
                folded=('<b x="1">g</b>',), fold_href=href)  # fmt: skip
    env = environment()
    page = env.from_string(
        '{% from "_graph.html" import graph, group_links %}{{ group_links(d) }}{{ graph(d) }}'
    ).render(d=d)
    assert "<b x=" not in page and "&lt;b x=&#34;1&#34;&gt;g&lt;/b&gt;" in page
    groups = [html.unescape(g) for g in re.findall(r'data-group="([^"]*)"', page)]
    assert groups == ['<b x="1">g</b>']
    assert isinstance(d, Drawing)


@pytest.mark.parametrize(
    ("values", "message"),
    [([f"g{i}" for i in range(51)], "fold: at most 50 groups at once"),
     (["a\x00b"], "fold: a group id without NUL or lone surrogates")],
)  # fmt: skip
def test_a_bad_fold_is_one_line(values: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fold(values)
    assert parse_fold(["a", "", "a", "b"]) == ("a", "b")
