"""executor/pools.py's rules on their own: names, sizes, --queues, admission, held-back
reasons; and a DAG's pool and queue options checked at declaration."""

from __future__ import annotations

from typing import Any

import pytest

from executor import DAG
from executor.dag import DagError
from executor.pools import (
    Candidate,
    PoolError,
    PoolUse,
    admit,
    check_name,
    check_slots,
    held_back,
    parse_queues,
    unknown,
)
from executor.store.runs import RunShape
from triggers.files import FileTrigger


def noop(ctx: Any) -> None:
    return None


@pytest.mark.parametrize("name", ["warehouse", "gpu", "a", "eu-west.1", "A_b", "x" * 64])
def test_good_names(name: str) -> None:
    assert check_name("pool", name) == name


@pytest.mark.parametrize("name", ["", " ", "bad name", "-x", ".x", "x" * 65, "é", None, 3])
def test_bad_names_are_refused_naming_them(name: Any) -> None:
    with pytest.raises(PoolError, match=f"invalid pool name {name!r}"):
        check_name("pool", name)


def test_slots() -> None:
    assert check_slots("4") == 4 and check_slots(0) == 0
    for bad in (-1, "-1", "four", 1.5, True, None):
        with pytest.raises(PoolError, match="whole number >= 0"):
            check_slots(bad)


def test_parse_queues() -> None:
    assert parse_queues("gpu,default") == ("gpu", "default")
    assert parse_queues(" gpu , gpu,default ") == ("gpu", "default")
    with pytest.raises(PoolError, match="names no queue"):
        parse_queues(" , ")
    with pytest.raises(PoolError, match="invalid queue name 'g p u'"):
        parse_queues("g p u")


def c(i: int, pool: str = "default", slots: int = 1) -> Candidate:
    return Candidate(i, "PENDING", pool, slots)


def test_admit_takes_what_fits_in_order_and_names_full_pools() -> None:
    used = {"wh": 2}
    taken, full = admit(
        [c(1, "wh"), c(2), c(3, "wh", 2), c(4, "wh"), c(5, "other"), c(6)],
        {"wh": 4, "other": None},  # other: locked by another claimer
        used,
    )
    assert [x.id for x in taken] == [1, 2, 4, 6]  # 3 needs 2 with 1 left; 4 takes the last
    assert full == {"wh", "other"}
    assert used == {"wh": 4}


def test_admit_with_nothing_but_default_locks_nothing() -> None:
    taken, full = admit([c(1), c(2)], {}, {})
    assert [x.id for x in taken] == [1, 2] and full == set()


def row(pool: str = "default", queue: str = "default", slots: int = 1) -> dict[str, Any]:
    return {"pool": pool, "queue": queue, "pool_slots": slots}


def test_held_back_reasons() -> None:
    pools = {"default": PoolUse("default", None, 7, 0), "wh": PoolUse("wh", 4, 4, 3)}
    served = {"default"}
    assert held_back(row("wh"), pools, served) == "waiting for pool wh (4/4 used)"
    assert held_back(row("gone"), pools, served) == (
        "waiting for pool gone (no such pool: slotless pools set gone SLOTS)"
    )
    assert held_back(row(queue="gpu"), pools, served) == (
        "waiting for a worker of queue gpu (no live worker serves it)"
    )
    roomy = {"wh": PoolUse("wh", 4, 2, 3)}
    assert held_back(row("wh", slots=3), roomy, served) == "waiting for pool wh (2/4 used, needs 3)"
    assert held_back(row("wh"), roomy, served) is None  # room: only waiting for a worker slot
    assert held_back(row(), pools, served) is None


def test_unknown_names_each_and_its_tasks() -> None:
    assert unknown("pool", {"a": ["t1", "t2"], "default": ["t3"]}, ["b"], "fix it") == (
        "unknown pool 'a' (task t1, t2): fix it"
    )
    assert unknown("pool", {"a": ["t1"]}, ["a"], "fix it") is None


def test_a_dag_declares_pools_and_queues_on_tasks_and_sensors() -> None:
    dag = DAG("opts")
    dag.task(noop, task_id="load", pool="warehouse", pool_slots=2)
    dag.task(noop, task_id="train", queue="gpu")
    dag.sensor("wait", FileTrigger(path="/x"), pool="warehouse", queue="io")
    shape = {t.task_id: t for t in RunShape.of(dag).tasks}
    assert (shape["load"].pool, shape["load"].pool_slots, shape["load"].queue) == (
        "warehouse", 2, "default",
    )  # fmt: skip
    assert shape["train"].queue == "gpu" and shape["train"].pool == "default"
    assert (shape["wait"].pool, shape["wait"].queue) == ("warehouse", "io")
    # The shape keeps them through its JSON (the catalogue's form), and an older stored
    # shape without them reads as the defaults.
    again = RunShape.from_json("opts", RunShape.of(dag).to_json())
    assert again == RunShape.of(dag)
    old = RunShape.from_json("opts", '[["a", [], "all_success", 0, null, null, 1]]')
    assert (old.tasks[0].pool, old.tasks[0].pool_slots, old.tasks[0].queue) == (
        "default", 1, "default",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"pool": "ware house"}, "task 'bad': invalid pool name 'ware house'"),
        ({"queue": ""}, "task 'bad': invalid queue name ''"),
        ({"pool_slots": 0}, "task 'bad': pool_slots must be a whole number >= 1, not 0"),
        ({"pool_slots": 1.5}, "pool_slots must be a whole number >= 1, not 1.5"),
    ],
)
def test_bad_options_are_refused_at_declaration(options: dict[str, Any], said: str) -> None:
    dag = DAG("bad_opts")
    with pytest.raises(DagError, match=said.replace("(", r"\(").replace(".", r"\.")):
        dag.task(noop, task_id="bad", **options)
    assert dag.tasks == {}
