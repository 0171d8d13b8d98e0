"""Templates on both backends, with a real worker, a real triggerer and real files: a
sensor templated with ``{{ macros.ds_add(ds, -1) }}`` waits on yesterday's path (not
today's) and fires when that file lands; a task's ``templates=`` reach ``ctx.templates``
rendered; a template that fails at render time fails its task once (no retry can change
it), saying the template and the error on one line (executor/templating.py)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from support import backends
from support.catalogued import all_runs, catalogue_file
from support.helpers import FakeClock, async_wait_until, loaded_waits, ops, raw_sql, write_dag
from support.triggers import log_text, serving

from executor import DAG
from executor.store import Store
from triggerer.store import Fire, TriggererBatch
from triggers.files import FileTrigger

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
live_store, store = backends.live_store, backends.store  # fixtures

DAY = date(2026, 11, 26)  # the run's ds; its yesterday is 2026-11-25


async def task_row(store: Store, url: str, run_id: str, task_id: str) -> dict[str, Any]:
    rows = await raw_sql(
        url,
        f"SELECT state, attempt, output FROM task WHERE run_id = '{run_id}' "
        f"AND task_id = '{task_id}'",
    )
    assert len(rows) == 1
    return rows[0]


async def run_state(store: Store, run_id: str) -> str:
    info = await store.views.run_info(run_id)
    assert info is not None
    return str(info["state"])


def landing_dag(folder: Path) -> DAG:
    dag = DAG("landing", params={"table": "sales", "part": "all"})
    path = str(folder / "{{ macros.ds_add(ds, -1) }}" / "{{ params.table }}.csv")
    dag.sensor("yesterday", FileTrigger(path=path, poke_interval=0.1), timeout=120)

    @dag.task(
        parents=["yesterday"],
        templates={
            "out": str(folder / "out" / "{{ ds_nodash }}" / "{{ dag_run.conf['part'] }}.json"),
            "ids": ["{{ run_id }}", "{{ task_id }}", 7],
        },
    )
    def report(ctx: Any) -> Any:
        return {"templates": ctx.templates, "event": ctx.inputs["yesterday"]}

    return dag


async def test_a_templated_sensor_waits_on_yesterdays_path_and_fires_when_it_lands(
    live_store: Store, url: str, tmp_path: Path
) -> None:
    dag = landing_dag(tmp_path)
    yesterday = tmp_path / "2026-11-25" / "sales.csv"
    today = tmp_path / "2026-11-26" / "sales.csv"
    async with serving(live_store, dag):
        run_id = await live_store.runs.create_run(dag, DAY, conf={"part": "p1"})

        async def deferred() -> bool:
            return (await task_row(live_store, url, run_id, "yesterday"))["state"] == "DEFERRED"

        await async_wait_until(deferred, timeout=30, what="the sensor deferred")
        [trigger] = await raw_sql(url, "SELECT kwargs, description FROM trigger")
        assert json.loads(trigger["kwargs"])["path"] == str(yesterday)  # stored rendered

        # Today's file is not what it waits for; yesterday's is.
        today.parent.mkdir()
        today.write_text("today\n")
        yesterday.parent.mkdir()
        yesterday.write_text("yesterday\n")

        async def ended() -> bool:
            return await run_state(live_store, run_id) in ("SUCCESS", "FAILED")

        await async_wait_until(ended, timeout=60, what="the run ended")
    assert await run_state(live_store, run_id) == "SUCCESS"
    report = await task_row(live_store, url, run_id, "report")
    assert json.loads(report["output"]) == {
        "templates": {
            "out": str(tmp_path / "out" / "20261126" / "p1.json"),
            "ids": [run_id, "report", 7],
        },
        "event": {"paths": [str(yesterday)]},
    }


def broken_dag(folder: Path) -> DAG:
    # Each parses (names and syntax are right); each fails once it meets the run's values.
    dag = DAG("broken_templates", params={"days": "two"})
    path = str(folder / "{{ macros.ds_add(ds, params.days) }}.csv")
    dag.sensor("wait", FileTrigger(path=path), retries=3)
    dag.task(
        lambda ctx: "never runs",
        task_id="load",
        retries=3,
        templates={"key": "in/{{ dag_run.conf.partition }}.csv"},
    )
    return dag


async def test_a_template_that_fails_fails_its_task_once_saying_the_template_and_the_error(
    live_store: Store, url: str, tmp_path: Path
) -> None:
    dag = broken_dag(tmp_path)
    async with serving(live_store, dag, triggerer=False):
        run_id = await live_store.runs.create_run(dag, DAY)

        async def ended() -> bool:
            return await run_state(live_store, run_id) in ("SUCCESS", "FAILED")

        await async_wait_until(ended, timeout=30, what="the run ended")
    assert await run_state(live_store, run_id) == "FAILED"
    for task_id in ("wait", "load"):
        row = await task_row(live_store, url, run_id, task_id)
        assert (row["state"], row["attempt"]) == ("FAILED", 1)  # retries cannot change it
    wait_log = await log_text(live_store, run_id, "wait")
    template = str(tmp_path / "{{ macros.ds_add(ds, params.days) }}.csv")
    said = (
        f"cannot render the sensor's trigger: path: template {template!r} failed: "
        "TypeError: unsupported type for timedelta days component: str"
    )
    assert said in wait_log.splitlines()[-1], wait_log
    load_log = await log_text(live_store, run_id, "load")
    said = (
        "cannot render the task's templates: templates.key: template "
        "'in/{{ dag_run.conf.partition }}.csv' failed: UndefinedError: 'dict object' has no "
        "attribute 'partition'"
    )
    assert said in load_log.splitlines()[-1], load_log


CONDITION = """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG("yesterdays", timezone="Europe/Paris",
          start_when=FileTrigger(path="/in/{{ macros.ds_add(ds, -1) }}/{{ dag_id }}.csv"))

@dag.task
def work(ctx):
    return ctx.start_event
"""


async def test_a_start_condition_is_rendered_with_macros_for_its_date_and_the_next(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    # 2026-11-20 23:30 UTC is already the 21st in Paris: the condition is for the 21st.
    clock.set(datetime(2026, 11, 20, 23, 30, tzinfo=UTC).timestamp())
    await catalogue_file(store, write_dag(tmp_path, CONDITION))
    [wait] = await store.catalogue.start_waits()
    assert wait["logical_date"] == "2026-11-21"
    assert "/in/2026-11-20/yesterdays.csv" in wait["description"]
    waits = await loaded_waits(store, "start")
    fired = TriggererBatch(fires=[Fire(waits, json.dumps({"paths": ["x"]}), "fired")])
    await ops(store).triggerer_commit(fired)
    [run] = await all_runs(store)
    assert run["logical_date"] == "2026-11-21"
    [wait] = await store.catalogue.start_waits()  # re-armed for the next date, rendered
    assert wait["logical_date"] == "2026-11-22"
    assert "/in/2026-11-21/yesterdays.csv" in wait["description"]
