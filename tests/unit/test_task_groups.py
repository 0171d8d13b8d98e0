"""Task groups and mapping forms as declared: ids prefixed by their groups, edges from
group to group, cycles and bad declarations refused in one line at parse time, groups kept
in the DAG's shape and read back as a tree."""

from __future__ import annotations

from typing import Any

import pytest

from executor import DAG, TaskContext
from executor.dag import DagError
from executor.mapping import decode
from executor.store.runs import RunShape
from executor.taskgroups import group_of, group_tree


def noop(ctx: TaskContext) -> None:
    return None


def etl() -> tuple[DAG, Any, Any, Any]:
    dag = DAG("etl")
    start = dag.task(noop, task_id="start")
    with dag.group("extract") as extract:
        a = dag.task(noop, task_id="a")
        with dag.group("s3"):
            dag.task(noop, task_id="load", parents=[a])
        dag.task(noop, task_id="b")
    with dag.group("transform") as transform:
        x = dag.task(noop, task_id="x")
        dag.task(noop, task_id="y", parents=[x])
    start >> extract >> transform
    return dag, start, extract, transform


def test_ids_are_prefixed_by_their_groups_nested_ones_too() -> None:
    dag, *_ = etl()
    assert list(dag.tasks) == [
        "start", "extract.a", "extract.s3.load", "extract.b", "transform.x", "transform.y",
    ]  # fmt: skip
    assert dag.tasks["extract.s3.load"].parents == ["extract.a"]  # not a root of extract
    assert list(dag.groups) == ["extract", "extract.s3", "transform"]


def test_group_to_group_puts_every_leaf_before_every_root() -> None:
    dag, _, extract, _ = etl()
    assert [t.task_id for t in extract.roots()] == ["extract.a", "extract.b"]
    assert [t.task_id for t in extract.leaves()] == ["extract.s3.load", "extract.b"]
    assert dag.tasks["transform.x"].parents == ["extract.s3.load", "extract.b"]
    assert dag.tasks["transform.y"].parents == ["transform.x"]  # not a root: untouched
    # task >> group: every root of the group.
    assert dag.tasks["extract.a"].parents == ["start"]
    assert dag.tasks["extract.b"].parents == ["start"]
    dag.validate()


def test_a_group_in_parents_names_its_leaves_and_group_to_task_works() -> None:
    dag, _, extract, transform = etl()
    end = dag.task(noop, task_id="end", parents=[transform, extract])
    assert end.parents == ["transform.y", "extract.s3.load", "extract.b"]
    other = dag.task(noop, task_id="other")
    transform >> other
    [extract, transform] >> dag.task(noop, task_id="last")
    assert other.parents == ["transform.y"]
    assert dag.tasks["last"].parents == ["extract.s3.load", "extract.b", "transform.y"]


def test_a_cycle_between_groups_is_refused_in_one_line() -> None:
    dag, _, extract, transform = etl()
    transform >> extract
    with pytest.raises(DagError) as err:
        dag.validate()
    message = str(err.value)
    assert message.startswith("cycle: ") and "\n" not in message
    assert "extract." in message and "transform." in message


def test_a_group_after_itself_is_a_cycle() -> None:
    dag = DAG("self")
    with dag.group("g") as g:
        dag.task(noop, task_id="only")
    g >> g
    with pytest.raises(DagError, match=r"cycle: g\.only -> g\.only"):
        dag.validate()


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda d: (d.group("g"), d.group("g")), "duplicate group id 'g'"),
        (lambda d: d.group("a.b"), "invalid group id 'a.b'"),
        (lambda d: d.group("g", map_cap=3), "map_cap needs expand="),
        (lambda d: d.group("g", expand="nope"), "expand= takes a task or a list"),
        (lambda d: d.task(noop, task_id="t").expand(), "expand() needs at least one list"),
        (
            lambda d: d.task(noop, task_id="t").expand(a=5),
            "expand(a=...) takes a list or an upstream",
        ),
        (lambda d: d.task(noop, task_id="t").expand(a=[object()]), "cannot be stored as JSON"),
        (lambda d: d.task(noop, task_id="t").expand_kwargs([{"a": 1}, 2]), "item 1 is not a dict"),
        (lambda d: d.task(noop, task_id="t", expand=[1]).expand(a=[1]), "is mapped already"),
        (
            lambda d: d.task(noop, task_id="t", trigger_rule="one_success").expand(a=[1]),
            "cannot use trigger rule one_success",
        ),
        (lambda d: d.task(noop, task_id="{x}"), "invalid task id"),
    ],
)
def test_bad_declarations_are_refused_in_one_line(declare: Any, message: str) -> None:
    with pytest.raises(DagError, match=None) as err:
        declare(DAG("bad"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_mapped_groups_refuse_what_they_cannot_run() -> None:
    dag = DAG("m")
    src = dag.task(noop, task_id="src")
    with dag.group("outer", expand=src):
        with pytest.raises(DagError, match="cannot be inside another mapped group"):
            dag.group("inner", expand=[1, 2])
        with pytest.raises(DagError, match="it cannot be mapped again"):
            dag.task(noop, task_id="t", expand=[1])
        with pytest.raises(DagError, match="cannot hold a branch"):
            dag.task(noop, task_id="b", branch=True)
    with dag.group("own", expand=["x"]) as own:
        dag.task(noop, task_id="t")
    assert own.over is not None and own.over.values == ("x",)


def test_a_task_outside_between_two_members_of_a_mapped_group_is_a_cycle() -> None:
    dag = DAG("through")
    with dag.group("g", expand=[1, 2]):
        a = dag.task(noop, task_id="a")
        b = dag.task(noop, task_id="b", parents=[a])
    outside = dag.task(noop, task_id="outside", parents=[a])
    outside >> b
    with pytest.raises(DagError, match="cycle through a mapped group: "):
        dag.validate()


def test_a_mapped_groups_members_wait_for_its_parents_and_each_other_per_index() -> None:
    dag = DAG("per_file")
    files = dag.task(noop, task_id="files")
    other = dag.task(noop, task_id="other")
    with dag.group("per_file", expand=files) as g:
        extract = dag.task(noop, task_id="extract")
        dag.task(noop, task_id="load", parents=[extract], trigger_rule="all_done")
    other >> g
    dag.validate()
    shape = {t.task_id: t for t in RunShape.of(dag).tasks}
    load = shape["per_file.load"]
    assert load.parents == ("per_file.extract",)  # the edge as declared, for the page
    assert load.trigger_rule == "all_success"  # its row starts with the group
    assert load.expand_from is not None
    spec = decode(load.expand_from)
    assert (spec.group, spec.after, spec.before, spec.needs, spec.rule) == (
        "per_file", ("per_file.extract",), (), ("files", "other"), "all_done",
    )  # fmt: skip
    assert dag.template_parents("per_file.extract") == ["files", "other"]
    assert [c.task_id for c in dag.mapped_consumers("files")] == [
        "per_file.extract", "per_file.load",
    ]  # fmt: skip


def test_the_old_form_is_stored_as_before_and_new_forms_as_json() -> None:
    dag = DAG("forms")
    up = dag.task(noop, task_id="up")
    dag.task(noop, task_id="old", expand=up)
    dag.task(noop, task_id="lit", expand=[1, 2])
    dag.task(noop, task_id="prod").partial(k=1).expand(a=[1, 2], b=up)
    shape = {t.task_id: t for t in RunShape.of(dag).tasks}
    assert shape["old"].expand_from == "up"
    assert decode(shape["lit"].expand_from or "").describe() == "a list of 2"
    prod = decode(shape["prod"].expand_from or "")
    assert prod.kind == "product" and prod.tasks == ["up"]
    assert shape["prod"].parents == ("up",)
    assert dag.tasks["prod"].fixed == {"k": 1}
    # Instances keep the spec without its literal lists.
    assert "[1,2]" in prod.encode() and "[1,2]" not in prod.instance_tag()


def test_groups_are_kept_in_the_shape_and_read_back_as_a_tree() -> None:
    dag, *_ = etl()
    with dag.group("per", expand=[1, 2]):
        dag.task(noop, task_id="t")
    shape = RunShape.of(dag)
    text = shape.to_json()
    assert RunShape.from_json("etl", text) == shape
    tree = group_tree(text)
    assert tree.tasks == ("start",)
    assert [g.group_id for g in tree.groups] == ["extract", "transform", "per"]
    extract = tree.groups[0]
    assert extract.tasks == ("extract.a", "extract.b")
    assert [(g.group_id, g.label, g.tasks) for g in extract.groups] == [
        ("extract.s3", "s3", ("extract.s3.load",))
    ]
    assert tree.groups[2].over == "a list of 2" and tree.groups[2].mapped
    assert [(d, g.group_id) for d, g in tree.walk()] == [
        (1, "extract"), (2, "extract.s3"), (1, "transform"), (1, "per"),
    ]  # fmt: skip
    assert group_of(text)["extract.s3.load"] == "extract.s3"
    assert tree.to_json()["groups"][0]["label"] == "extract"  # type: ignore[index]


def test_a_shape_without_groups_is_stored_as_before() -> None:
    dag = DAG("flat")
    dag.task(noop, task_id="a")
    text = RunShape.of(dag).to_json()
    assert text.startswith("[")
    assert group_tree(text).tasks == ("a",) and group_tree(None).tasks == ()


def test_a_setup_or_teardown_is_never_mapped_by_a_group_or_expand() -> None:
    dag = DAG("roles")
    with (
        dag.group("g", expand=[1, 2]),
        pytest.raises(DagError, match="a setup task cannot be mapped"),
    ):
        dag.task(noop, task_id="s", setup=True)
    made = dag.task(noop, task_id="made", setup=True)
    with pytest.raises(DagError, match="a setup task cannot be mapped"):
        made.expand(a=[1])
    with dag.group("plain"):
        up = dag.task(noop, task_id="up", setup=True)
        down = dag.task(noop, task_id="down", teardown_of=[up])
    assert down.parents == ["plain.up"] and down.teardown
