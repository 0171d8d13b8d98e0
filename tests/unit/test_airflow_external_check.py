"""The native DagStateTrigger / WorkflowTrigger check (triggerer/airflow/native_external.py)
without Airflow: which rows are native and their keys (the rest go to the adapter), the
Execution API routes' counts computed from one read, and many groups answered by one read
per moment, the database away failing nothing.

The reads here come from a reader given to ``ExternalNative`` (the seam a test uses, as
native_s3's ``resolve``); tests/e2e/test_airflow_external_native.py reads Airflow's own
tables on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from support.helpers import async_wait_until

from triggerer.airflow.native_external import (
    DAGSTATE,
    WORKFLOW,
    ExternalNative,
    Need,
    Seen,
    dagstate_state,
    interval,
    workflow_status,
)
from triggerer.airflow.plans import plan
from triggers.base import TransientError

DAY = datetime(2026, 5, 1, tzinfo=UTC)


def _dagstate(**changes: object) -> dict[str, object]:
    """A DagStateTrigger's kwargs as Airflow 3's task runner defers TriggerDagRunOperator
    (provider 1.21.0's serialize(): every kwarg present)."""
    kwargs: dict[str, object] = {
        "dag_id": "target",
        "states": ["success", "failed"],
        "poll_interval": 60,
        "run_ids": ["manual__1"],
        "execution_dates": None,
    }
    kwargs.update(changes)
    return kwargs


def _workflow(**changes: object) -> dict[str, object]:
    """A WorkflowTrigger's kwargs as a deferrable ExternalTaskSensor writes them."""
    kwargs: dict[str, object] = {
        "external_dag_id": "upstream",
        "external_task_ids": ["load"],
        "external_task_group_id": None,
        "failed_states": ["failed"],
        "skipped_states": None,
        "allowed_states": ["success"],
        "poke_interval": 2.0,
        "soft_fail": False,
        "run_ids": None,
        "logical_dates": [DAY],
    }
    kwargs.update(changes)
    return kwargs


def _key(classpath: str, kwargs: dict[str, object]) -> tuple[Any, ...]:
    p = plan(classpath, kwargs)
    assert p.kind == "external", kwargs
    return p.key


# -- planning ------------------------------------------------------------------------------


def test_a_dagstate_trigger_with_run_ids_is_native_keyed_by_all_its_payload_echoes() -> None:
    key = _key(DAGSTATE, _dagstate())
    assert key == ("dagstate", "target", ("manual__1",), ("success", "failed"), None, "60")
    assert _key(DAGSTATE, _dagstate()) == key
    # Its event echoes its kwargs: anything printed differently is another check.
    for other in [
        _dagstate(poll_interval=60.0),
        _dagstate(states=["failed", "success"]),
        _dagstate(run_ids=["manual__2"]),
        _dagstate(execution_dates=[DAY]),
        _dagstate(dag_id="other"),
    ]:
        assert _key(DAGSTATE, other) != key, other
    assert interval(key, []) == 60.0


@pytest.mark.parametrize(
    "kwargs",
    [
        _dagstate(run_ids=None, execution_dates=[DAY]),  # its AF3 run() never returns
        _dagstate(run_ids=[]),
        _dagstate(run_ids=("manual__1",)),  # not a list: the provider loops for ever
        _dagstate(run_ids=[1]),
        _dagstate(states=[1]),
        _dagstate(execution_dates=[DAY.replace(tzinfo=None)]),
        _dagstate(execution_dates=[None]),
        _dagstate(poll_interval=0),
        _dagstate(poll_interval=True),
        _dagstate(dag_id=""),
        _dagstate(timeout=30),  # another version's kwarg: never ignored
        {k: v for k, v in _dagstate().items() if k != "states"},  # its constructor needs it
    ],
)
def test_dagstate_triggers_the_native_check_would_not_answer_exactly_go_to_the_adapter(
    kwargs: dict[str, object],
) -> None:
    assert plan(DAGSTATE, kwargs).kind == "adapter"


def test_a_workflow_trigger_is_native_without_its_pace_in_its_key() -> None:
    key = _key(WORKFLOW, _workflow())
    assert key == (
        "workflow",
        "upstream",
        None,
        ("2026-05-01T00:00:00+00:00",),
        ("load",),
        ("failed",),
        None,
        ("success",),
    )
    # What only paces it or what its event does not carry; order; the same instant.
    same = [
        _workflow(poke_interval=30, soft_fail=True),
        _workflow(allowed_states=("success",), failed_states={"failed"}),
        _workflow(logical_dates=[DAY.astimezone(timezone(timedelta(hours=2)))]),
    ]
    for kwargs in same:
        assert _key(WORKFLOW, kwargs) == key, kwargs
    assert (
        _key(WORKFLOW, _workflow(external_task_ids=["b", "a"]))
        == _key(WORKFLOW, _workflow(external_task_ids=["a", "b"]))
        != key
    )
    for other in [
        _workflow(failed_states=None),
        _workflow(skipped_states=["skipped"]),
        _workflow(external_task_ids=None),
        _workflow(run_ids=["r1"]),
        _workflow(logical_dates=[DAY + timedelta(days=1)]),
    ]:
        assert _key(WORKFLOW, other) != key, other
    # Only given kwargs: the provider's defaults.
    bare = _key(WORKFLOW, {"external_dag_id": "upstream", "run_ids": ["r1"]})
    assert bare == ("workflow", "upstream", ("r1",), None, None, None, None, None)
    assert interval(bare, [{"external_dag_id": "upstream"}]) == 2.0
    assert interval(key, [_workflow(poke_interval=5), _workflow(poke_interval=0.5)]) == 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        _workflow(external_task_group_id="extract"),  # its tasks come from the DAG bag
        _workflow(logical_dates=None),  # neither run ids nor dates
        _workflow(logical_dates=[], run_ids=[]),
        _workflow(execution_dates=[DAY]),  # Airflow 2's; AF3's run() ignores it
        _workflow(external_task_ids="load"),  # a str: the provider would count l, o, a, d
        _workflow(allowed_states=[1]),
        _workflow(allowed_states="success"),
        _workflow(logical_dates=[DAY.replace(tzinfo=None)]),
        _workflow(run_ids=("r1",)),
        _workflow(poke_interval="2"),
        _workflow(soft_fail="yes"),
        _workflow(deferrable=True),
        {k: v for k, v in _workflow().items() if k != "external_dag_id"},
    ],
)
def test_workflow_triggers_the_native_check_would_not_answer_exactly_go_to_the_adapter(
    kwargs: dict[str, object],
) -> None:
    assert plan(WORKFLOW, kwargs).kind == "adapter"


# -- the routes' counts --------------------------------------------------------------------


def _seen() -> Seen:
    """Two runs of "upstream" (one on DAY, one the day after), one of "other"; a mapped
    task "load" (three instances per run) and a task "check"."""
    seen = Seen()
    seen.add_run("upstream", "r1", DAY, "success")
    seen.add_run("upstream", "r2", DAY + timedelta(days=1), "running")
    seen.add_run("other", "r1", DAY, "failed")
    seen.add_tis("upstream", "r1", "load", "success", 2)
    seen.add_tis("upstream", "r1", "load", "failed", 1)
    seen.add_tis("upstream", "r1", "check", None, 1)
    seen.add_tis("upstream", "r2", "load", "success", 3)
    seen.add_tis("upstream", "r2", "check", "upstream_failed", 1)
    return seen


def test_workflow_status_is_the_providers_order_on_the_routes_counts() -> None:
    seen = _seen()
    day2 = DAY + timedelta(days=1)

    def status(**changes: object) -> str | None:
        return workflow_status(_key(WORKFLOW, _workflow(**changes)), seen)

    # A failed mapped instance in r1: failed first, whatever the rest.
    assert status(run_ids=["r1"], logical_dates=None) == "failed"
    assert status(failed_states=None, skipped_states=["failed"]) == "skipped"
    # 2 of 3 instances succeeded: int(2 / 1) is 2, not len(runs) (1): not yet.
    assert status(failed_states=None) is None
    # Every map index counts: 3 successes in r2 over one task id is 3, not 1.
    assert status(failed_states=None, logical_dates=[day2]) is None
    one = {"failed_states": None, "external_task_ids": ["check"], "logical_dates": [day2]}
    assert status(**one, allowed_states=["upstream_failed"]) == "success"
    # Two task ids: the instance count over two, as the provider's int(count / n). In r1,
    # 2 load successes and a check with no state: int(3 / 2) == 1 run, whatever the failure.
    two = {"failed_states": None, "external_task_ids": ["load", "check"]}
    assert status(**two, allowed_states=["success", "null"]) == "success"
    assert status(**two, allowed_states=["failed"]) is None  # int(1 / 2) == 0
    # The dag-run count: r1 success, r2 running.
    runs = {"external_task_ids": None, "failed_states": ["failed"]}
    assert status(**runs) == "success"
    assert status(**runs, logical_dates=[DAY, day2]) is None
    assert status(**runs, logical_dates=[DAY, day2], allowed_states=["success", "running"]) == (
        "success"
    )
    # Dates and run ids both given: both filter; the run ids are the number expected.
    assert status(**runs, run_ids=["r1", "r2"], logical_dates=[DAY]) is None
    assert status(**runs, run_ids=["r1"], logical_dates=[day2]) is None
    # A run that does not exist is not counted.
    assert status(**runs, run_ids=["r1", "gone"]) is None


def test_ti_states_follow_the_null_rule_and_dag_run_states_do_not() -> None:
    seen = _seen()
    only_null = _key(WORKFLOW, _workflow(external_task_ids=["check"], allowed_states=["null"]))
    assert workflow_status(only_null, seen) == "success"  # r1's check has no state
    seen.add_run("upstream", "r3", DAY + timedelta(days=2), None)
    runs = _workflow(external_task_ids=None, failed_states=None, run_ids=["r3"], logical_dates=None)
    assert workflow_status(_key(WORKFLOW, {**runs, "allowed_states": ["null"]}), seen) is None
    assert workflow_status(_key(WORKFLOW, {**runs, "allowed_states": None}), seen) == "success"


def test_a_dagstate_trigger_is_done_once_all_its_runs_are_in_its_states() -> None:
    seen = _seen()
    one = _dagstate(dag_id="upstream", run_ids=["r1"])
    assert dagstate_state(_key(DAGSTATE, one), seen) == "success"
    both = _dagstate(dag_id="upstream", run_ids=["r1", "r2"])
    assert dagstate_state(_key(DAGSTATE, both), seen) is None
    # Done: the state of the first run id, as the provider's event carries it.
    both_states = {**both, "states": ["success", "running"]}
    assert dagstate_state(_key(DAGSTATE, both_states), seen) == "success"
    first_r2 = {**both_states, "run_ids": ["r2", "r1"]}
    assert dagstate_state(_key(DAGSTATE, first_r2), seen) == "running"
    assert dagstate_state(_key(DAGSTATE, {**both, "states": []}), seen) == "success"  # no filter
    # A duplicated run id is one run: never len(run_ids), as for the provider.
    assert (
        dagstate_state(_key(DAGSTATE, _dagstate(dag_id="upstream", run_ids=["r1"] * 2)), seen)
        is None
    )
    dated = _dagstate(dag_id="upstream", run_ids=["r1"], execution_dates=[DAY + timedelta(days=1)])
    assert dagstate_state(_key(DAGSTATE, dated), seen) is None


# -- one read per moment ---------------------------------------------------------------------


class Tables:
    """A reader over rows in memory, counting its reads and what each one asked."""

    def __init__(self) -> None:
        self.seen = _seen()
        self.reads: list[list[Need]] = []
        self.down = 0  # reads left to fail as the database away would

    def __call__(self, needs: list[Need]) -> Seen:
        self.reads.append(needs)
        if self.down:
            self.down -= 1
            raise TransientError("OperationalError: connection refused")
        return self.seen


async def test_groups_due_together_share_one_read_and_fire_when_it_says() -> None:
    tables = Tables()
    native = ExternalNative(reader=tables)
    checks: list[str] = []
    keys = [
        _key(WORKFLOW, _workflow(external_task_ids=[f"t{i}"], run_ids=["r2"], logical_dates=None))
        for i in range(40)
    ]
    tasks = [
        asyncio.create_task(native.wait(k, workflow_status, lambda: 0.2, checks.append))
        for k in keys
    ]
    try:
        await async_wait_until(lambda: len(checks) >= 40 * 4, timeout=10, what="four rounds")
        # Every round is one read for all 40 groups (a round read mid-way: one off).
        rounds = len(checks) / 40
        assert rounds - 1 <= len(tables.reads) <= rounds + 1, (len(tables.reads), rounds)
        assert native.reads == len(tables.reads)
        assert max(len(needs) for needs in tables.reads) == 40
        assert not any(t.done() for t in tasks)
        for i in range(40):
            tables.seen.add_tis("upstream", "r2", f"t{i}", "success", 1)
        done = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert done == ["success"] * 40
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_database_away_is_retried_said_once_and_fails_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tables = Tables()
    tables.down = 4
    native = ExternalNative(reader=tables)
    checks: list[str] = []
    key = _key(DAGSTATE, _dagstate(dag_id="upstream", run_ids=["r1"], poll_interval=0.05))
    with caplog.at_level(logging.WARNING, logger="slotless.airflow"):
        found = await asyncio.wait_for(
            native.wait(key, dagstate_state, lambda: 0.05, checks.append), 10
        )
    assert found == "success"
    assert checks[:4] == ["retrying: OperationalError: connection refused"] * 4
    assert checks[-1] == "found"
    said = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(said) == 1 and "connection refused" in said[0].getMessage()


async def test_a_group_leaving_does_not_cancel_the_read_others_wait_on() -> None:
    native = ExternalNative(reader=Tables())
    key = _key(DAGSTATE, _dagstate(dag_id="upstream", run_ids=["r1"]))
    leaving = asyncio.create_task(native.wait(key, dagstate_state, lambda: 60.0, lambda _: None))
    staying = asyncio.create_task(native.wait(key, dagstate_state, lambda: 60.0, lambda _: None))
    # One turn of the loop: both tasks start and join the one read before one leaves.
    await asyncio.sleep(0)
    leaving.cancel()
    assert await asyncio.wait_for(staying, 5) == "success"
    with contextlib.suppress(asyncio.CancelledError):
        await leaving
