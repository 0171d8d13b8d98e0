"""ExternalDagRunTrigger against a real store: one query per cycle, and real DAG runs."""

from __future__ import annotations

import secrets
from datetime import date
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError
from support.helpers import async_wait_until, run_to_end
from support.servers import all_events_text, run_dag, task_log

from executor import DAG
from executor.templating import Scope, render_trigger
from triggerer.settling import TRANSIENT
from triggers.base import TriggerEvent
from triggers.checking import CheckContext
from triggers.external import ExternalDagRunTrigger

BAD_DAY = "2024-01-02"


def upstream(dag_id: str) -> DAG:
    """extract succeeds; load fails on BAD_DAY."""
    dag = DAG(dag_id)

    @dag.task
    def extract(ctx):
        return 1

    @dag.task(parents=[extract])
    def load(ctx):
        if ctx.ds == BAD_DAY:
            raise RuntimeError("the warehouse said no")
        return 2

    return dag


class CountingContext(CheckContext):
    def __init__(self, store) -> None:
        super().__init__(store.views.external_states)
        self.queries = 0

    async def external_states(self, questions):
        self.queries += 1
        return await super().external_states(questions)


async def test_all_questions_answered_by_one_query(store):
    up = upstream("up_" + secrets.token_hex(3))
    ok = await store.runs.create_run(up, date(2024, 1, 1))
    assert (await run_to_end(store, ok, dags={up.dag_id: up}))["state"] == "SUCCESS"
    bad = await store.runs.create_run(up, date(2024, 1, 2))
    assert (await run_to_end(store, bad, dags={up.dag_id: up}))["state"] == "FAILED"
    await store.runs.create_run(up, date(2024, 1, 3))  # created, not run: still RUNNING

    def t(day: str, **kw) -> ExternalDagRunTrigger:
        return ExternalDagRunTrigger(dag_id=up.dag_id, logical_date=day, **kw)

    triggers = [
        t("2024-01-01"),  # 0 success -> fires
        t("2024-01-02"),  # 1 failed -> error naming the run
        t("2024-01-03"),  # 2 running -> not yet
        t("2024-01-04"),  # 3 no run -> not yet
        t("2024-01-03", offset_days=-2),  # 4 -> 2024-01-01: fires
        t("2024-01-02", task_id="extract"),  # 5 the task succeeded in a failed run
        t("2024-01-02", task_id="load"),  # 6 the task failed
        t("2024-01-02", task_id="load", failed_states=[]),  # 7 failure not named: waits
        t("2024-01-02", allowed_states=["SUCCESS", "FAILED"], failed_states=[]),  # 8 fires
        t("2024-01-01", task_id="nope"),  # 9 no such task: not yet
        ExternalDagRunTrigger(dag_id="never_ran", logical_date="2024-01-01"),  # 10
    ]
    ctx = CountingContext(store)
    results = await ExternalDagRunTrigger.poke_many(triggers, ctx)
    assert ctx.queries == 1  # eleven questions, one query
    fired = [i for i, r in enumerate(results) if isinstance(r, TriggerEvent) and not r.error]
    failed = [i for i, r in enumerate(results) if isinstance(r, TriggerEvent) and r.error]
    assert fired == [0, 4, 5, 8]
    assert failed == [1, 6]
    assert [i for i, r in enumerate(results) if r is None] == [2, 3, 7, 9, 10]
    assert results[0].payload == {
        "dag_id": up.dag_id,
        "task_id": None,
        "logical_date": "2024-01-01",
        "run_id": ok,
        "state": "SUCCESS",
    }
    assert bad in results[1].error and "FAILED" in results[1].error
    assert "task 'load'" in results[6].error and bad in results[6].error


async def test_templates_dates_and_bad_input(store):
    t = ExternalDagRunTrigger(dag_id="up", logical_date="{{ ds }}", offset_days=-1)
    on = Scope.for_date("d", date(2024, 3, 1), ZoneInfo("UTC"))
    assert render_trigger(t, on).target_date == "2024-02-29"
    assert ExternalDagRunTrigger(dag_id="up", logical_date=date(2024, 1, 5)).logical_date == (
        "2024-01-05"
    )
    with pytest.raises(ValidationError, match="neither a date"):
        ExternalDagRunTrigger(dag_id="up", logical_date="yesterday")
    with pytest.raises(ValidationError, match="both allowed and failed"):
        ExternalDagRunTrigger(dag_id="up", logical_date="2024-01-01", failed_states=["success"])
    # Never rendered (used outside a sensor): that check fails, the others are answered.
    ctx = CountingContext(store)
    unrendered, fine = await ExternalDagRunTrigger.poke_many(
        [t, ExternalDagRunTrigger(dag_id="up", logical_date="2024-01-01")], ctx
    )
    assert isinstance(unrendered, ValueError) and not isinstance(unrendered, TRANSIENT)
    assert "not rendered" in str(unrendered)
    assert fine is None and ctx.queries == 1


def waiting_dag(up_id: str, **kw) -> DAG:
    dag = DAG("down_" + secrets.token_hex(3))
    wait = dag.sensor(
        "wait_for_up",
        ExternalDagRunTrigger(dag_id=up_id, logical_date="{{ ds }}", poke_interval=0.2, **kw),
        mode="deferrable",
        timeout=30,
    )

    @dag.task(parents=[wait])
    def report(ctx):
        return ctx.inputs["wait_for_up"]["run_id"]

    return dag


async def test_e2e_waits_for_yesterdays_run_then_fires(store):
    up = upstream("up_" + secrets.token_hex(3))
    down = waiting_dag(up.dag_id, offset_days=-1)

    async def upstream_runs(run_id: str) -> None:
        async def deferred() -> bool:
            rows = await store.views.run_tasks(run_id)
            return any(r["task_id"] == "wait_for_up" and r["state"] == "DEFERRED" for r in rows)

        await async_wait_until(deferred, what="the sensor to defer")
        await store.runs.create_run(up, date(2024, 1, 3))  # yesterday of 2024-01-04

    run_id, info = await run_dag(
        store, down, logical_date=date(2024, 1, 4), during=upstream_runs, extra_dags=[up]
    )
    assert info["state"] == "SUCCESS", await all_events_text(store, run_id)
    log = await task_log(store, run_id, "wait_for_up")
    assert f"dag run {up.dag_id} @ 2024-01-03" in log


async def test_e2e_failed_upstream_fails_the_task_naming_the_run(store):
    up = upstream("up_" + secrets.token_hex(3))
    bad = await store.runs.create_run(up, date.fromisoformat(BAD_DAY))
    assert (await run_to_end(store, bad, dags={up.dag_id: up}))["state"] == "FAILED"
    down = waiting_dag(up.dag_id, task_id="load")
    run_id, info = await run_dag(store, down, logical_date=date.fromisoformat(BAD_DAY))
    assert info["state"] == "FAILED"
    log = await task_log(store, run_id, "wait_for_up")
    assert f"task 'load' of run {bad} of DAG '{up.dag_id}'" in log and "is FAILED" in log
    states = {t["task_id"]: t["state"] for t in await store.views.run_tasks(run_id)}
    assert states == {"wait_for_up": "FAILED", "report": "UPSTREAM_FAILED"}
