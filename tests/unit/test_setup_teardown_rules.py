"""A teardown's rule with its setups' outcomes, and which tasks' failures decide a run
(Airflow 3's "effective leaves"), as pure functions; and the declaration's checks."""

from __future__ import annotations

import pytest

from executor import DAG
from executor.dag import DagError
from executor.rules import (
    LEAF,
    LEAF_BEFORE_TEARDOWN,
    LEAF_NO,
    LEAF_QUIET,
    Counts,
    Decision,
    Node,
    TriggerRule,
    decide,
    leaf_kinds,
)
from executor.store.runs import RunShape

RULE = TriggerRule.ALL_DONE_SETUP_SUCCESS


@pytest.mark.parametrize(
    ("counts", "decision"),
    [
        (Counts(total=3, done=2, success=1, failed=1), Decision.WAIT),
        # the work failed, the setup succeeded: the teardown runs
        (Counts(total=2, done=2, success=1, failed=1, setups=1, setups_succeeded=1), Decision.RUN),
        # every setup skipped: nothing to tear down
        (Counts(total=2, done=2, skipped=2, setups=1, setups_skipped=1), Decision.SKIP),
        # the setup failed: upstream failed
        (Counts(total=2, done=2, failed=1, upstream_failed=1, setups=1), Decision.UPSTREAM_FAILED),
        # two setups, one of them ran: tear down what it set up
        (Counts(total=2, done=2, success=1, failed=1, setups=2, setups_succeeded=1), Decision.RUN),
        # no setup among the parents: all_done
        (Counts(total=2, done=2, failed=2), Decision.RUN),
    ],
)
def test_a_teardowns_rule(counts: Counts, decision: Decision) -> None:
    assert decide(RULE, counts) is decision


def test_the_tasks_before_a_quiet_teardown_decide_the_run() -> None:
    kinds = leaf_kinds(
        [
            Node("setup", ()),
            Node("work", ("setup",)),
            Node("teardown", ("setup", "work"), quiet=True),
            Node("report", ("work",)),
        ]
    )
    # work has a child that decides (report): its failure reaches the run through it
    assert kinds == {"setup": LEAF_NO, "work": LEAF_NO, "teardown": LEAF_QUIET, "report": LEAF}


def test_a_teardown_that_fails_the_run_is_a_plain_leaf() -> None:
    kinds = leaf_kinds([Node("s", ()), Node("w", ("s",)), Node("t", ("s", "w"))])
    assert kinds == {"s": LEAF_NO, "w": LEAF_NO, "t": LEAF}
    quiet = leaf_kinds([Node("s", ()), Node("w", ("s",)), Node("t", ("s", "w"), quiet=True)])
    assert quiet == {"s": LEAF_NO, "w": LEAF_BEFORE_TEARDOWN, "t": LEAF_QUIET}


def test_a_dag_of_quiet_teardowns_alone_is_judged_by_its_leaves() -> None:
    assert leaf_kinds([Node("t", (), quiet=True)]) == {"t": LEAF}


def test_teardown_of_marks_the_setup_and_makes_it_a_parent() -> None:
    dag = DAG("d")
    create = dag.task(lambda ctx: 1, task_id="create")
    work = dag.task(lambda ctx: 2, task_id="work", parents=[create])
    delete = dag.task(lambda ctx: 3, task_id="delete", parents=[work], teardown_of=[create])
    assert create.setup and delete.teardown and delete.parents == ["work", "create"]
    assert delete.trigger_rule is RULE
    shape = RunShape.from_json("d", RunShape.of(dag).to_json())
    roles = {t.task_id: (t.role, t.fails_run) for t in shape.tasks}
    assert roles == {
        "create": ("setup", False),
        "work": (None, False),
        "delete": ("teardown", False),
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"setup": True, "teardown": True}, "a setup or a teardown, not both"),
        ({"on_failure_fail_run": True}, "on_failure_fail_run is for a teardown"),
        ({"teardown_of": ["nope"]}, "teardown_of names 'nope', which is not a task"),
        ({"setup": True, "expand": "src"}, "a setup task cannot be mapped"),
    ],
)
def test_a_wrong_declaration_is_one_line(kwargs: dict, message: str) -> None:
    dag = DAG("d")
    dag.task(lambda ctx: [1], task_id="src")
    with pytest.raises(DagError, match=message):
        dag.task(lambda ctx: 1, task_id="t", **kwargs)
