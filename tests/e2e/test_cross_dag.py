"""Cross-DAG dependencies: runs have logical dates; Views.external_states answers many
"has DAG X (or its task T) reached a state for date D" questions in one query; and
`slotless run FILE --logical-date` creates a run for a given date."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable
from datetime import date, timedelta
from pathlib import Path
from typing import TypeVar

from support.exchanging import claim
from support.helpers import REPO, FakeClock, cli, cli_env, run_to_end, sql, wait_until, write_dag

from executor import DAG
from executor.store import Store, open_store

DAY = date(2026, 4, 25)
T = TypeVar("T")


def ingest_dag(fail: bool = False) -> DAG:
    dag = DAG("ingest")

    @dag.task
    def fetch(ctx):
        return ctx.ds

    @dag.task(parents=[fetch])
    def load(ctx):
        if fail:
            raise RuntimeError("load failed")
        return "loaded"

    return dag


def q(dag_id: str, day: date, task_id: str | None = None) -> dict:
    return {"dag_id": dag_id, "logical_date": day.isoformat(), "task_id": task_id}


async def count_statements(store: Store, coro: Awaitable[T]) -> tuple[T, list[str]]:
    statements: list[str] = []
    conn = store.db._conn  # type: ignore[attr-defined]
    await conn.set_trace_callback(statements.append)
    try:
        result = await coro
    finally:
        await conn.set_trace_callback(None)
    return result, statements


async def test_many_questions_answered_in_one_query(store: Store) -> None:
    good, bad = ingest_dag(), ingest_dag(fail=True)
    today = await store.runs.create_run(good, DAY)
    await run_to_end(store, today, dags={"ingest": good})
    yesterday = await store.runs.create_run(bad, DAY - timedelta(days=1))
    await run_to_end(store, yesterday, dags={"ingest": bad})
    running = await store.runs.create_run(DAG("report"), DAY)  # no tasks: ends at once
    waiting = await store.runs.create_run(ingest_dag(), DAY + timedelta(days=1))  # not served

    # The caller turns "the day before D" into a date; the store only matches dates.
    offset = -1
    questions = [
        q("ingest", DAY),  # 0: the DAG's state
        q("ingest", DAY, "load"),  # 1: one task's state
        q("ingest", DAY + timedelta(days=offset)),  # 2: D - 1: that run failed
        q("ingest", DAY + timedelta(days=offset), "fetch"),  # 3
        q("ingest", DAY + timedelta(days=offset), "load"),  # 4
        q("ingest", DAY + timedelta(days=1), "fetch"),  # 5: a run that has not started
        q("ingest", DAY + timedelta(days=1)),  # 6
        q("ingest", DAY - timedelta(days=30)),  # 7: no run for that date
        q("nobody", DAY),  # 8: no such DAG
        q("ingest", DAY, "no_such_task"),  # 9: the run exists, the task does not
        q("report", DAY),  # 10
    ]
    answers, statements = await count_statements(store, store.views.external_states(questions))
    assert len(statements) == 1, statements  # one query for all questions
    got = [(a["q"], a["state"], a["run_id"]) for a in answers]
    assert got == [
        (0, "SUCCESS", today),
        (1, "SUCCESS", today),
        (2, "FAILED", yesterday),
        (3, "SUCCESS", yesterday),
        (4, "FAILED", yesterday),
        (5, "PENDING", waiting),
        (6, "RUNNING", waiting),
        (7, None, None),
        (8, None, None),
        (9, None, today),
        (10, "SUCCESS", running),
    ]


async def test_a_thousand_questions_are_still_one_query(store: Store) -> None:
    await run_to_end(
        store, await store.runs.create_run(ingest_dag(), DAY), dags={"ingest": ingest_dag()}
    )
    questions = [
        q("ingest", DAY - timedelta(days=i), "load" if i % 2 else None) for i in range(1000)
    ]
    answers, statements = await count_statements(store, store.views.external_states(questions))
    assert len(statements) == 1
    assert len(answers) == 1000
    assert [a["q"] for a in answers] == list(range(1000))
    assert answers[0]["state"] == "SUCCESS"
    assert all(a["state"] is None for a in answers[1:])


async def test_the_latest_run_of_a_date_answers(db_url: str, clock: FakeClock) -> None:
    store = await open_store(db_url, clock=clock)
    try:
        dag = ingest_dag()
        first = await store.runs.create_run(dag, DAY)
        clock.advance(60)
        second = await store.runs.create_run(dag, DAY)  # a re-run of the same date
        [fetch] = [r for r in await claim(store, "w", 10) if r.run_id == first]
        (answer,) = await store.views.external_states([q("ingest", DAY)])
        assert (answer["run_id"], answer["state"]) == (second, "RUNNING")
        (task,) = await store.views.external_states([q("ingest", DAY, "fetch")])
        assert (task["run_id"], task["state"]) == (second, "RUNNING")
        assert fetch.run_id == first
    finally:
        await store.close()


async def test_runs_created_in_the_same_instant_answer_with_the_newest(
    db_url: str, clock: FakeClock
) -> None:
    """Two runs of one date created at the same clock reading (a fake clock, a coarse
    one, a backfill): state and run id must both come from the newer run."""
    store = await open_store(db_url, clock=clock)
    try:
        dag = ingest_dag()
        older = await store.runs.create_run(dag, DAY, run_id="ingest:older")
        newer = await store.runs.create_run(dag, DAY, run_id="ingest:newer")
        # only the older run's first task is running
        await claim(store, "w", 1)
        rows = sql(
            db_url[len("sqlite:///") :],
            "SELECT run_id, state FROM task WHERE task_id = 'fetch' ORDER BY id",
        )
        assert rows == [
            {"run_id": older, "state": "RUNNING"},
            {"run_id": newer, "state": "PENDING"},
        ]
        (answer,) = await store.views.external_states([q("ingest", DAY, "fetch")])
        assert (answer["run_id"], answer["state"]) == (newer, "PENDING")
    finally:
        await store.close()


def test_slotless_run_creates_a_run_for_the_given_logical_date(tmp_path: Path) -> None:
    dag_file = write_dag(
        tmp_path,
        """
        from executor import DAG

        dag = DAG("dated")

        @dag.task
        def which_day(ctx):
            return {"ds": ctx.ds, "logical_date": ctx.logical_date.isoformat()}
        """,
    )
    db = tmp_path / "dated.db"
    url = f"sqlite:///{db}"
    for day in ("2026-04-25", "2026-04-24"):
        proc = cli("run", str(dag_file), "--db", url, "--logical-date", day, "--json")
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["state"] == "SUCCESS"
        assert result["run_id"].startswith(f"dated:{day}:")
        (run,) = sql(db, "SELECT logical_date FROM dag_run WHERE run_id = ?", result["run_id"])
        assert run["logical_date"] == day
        (task,) = sql(
            db,
            "SELECT output FROM task WHERE run_id = ? AND task_id = 'which_day'",
            result["run_id"],
        )
        assert json.loads(task["output"]) == {"ds": day, "logical_date": day}

    status = json.loads(cli("status", "--db", url, "--json").stdout)
    assert sorted(r["logical_date"] for r in status["runs"]) == ["2026-04-24", "2026-04-25"]


async def test_a_date_from_the_command_line_is_what_other_dags_ask_about(tmp_path: Path) -> None:
    dag_file = write_dag(
        tmp_path,
        """
        from executor import DAG

        dag = DAG("upstream")
        dag.task(lambda ctx: ctx.ds, task_id="publish")
        """,
    )
    url = f"sqlite:///{tmp_path / 'x.db'}"
    proc = cli("run", str(dag_file), "--db", url, "--logical-date", "2026-04-25", "--json")
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout)["run_id"]
    store = await open_store(url)
    try:
        answers = await store.views.external_states(
            [q("upstream", DAY, "publish"), q("upstream", DAY + timedelta(days=1), "publish")]
        )
    finally:
        await store.close()
    assert [(a["state"], a["run_id"]) for a in answers] == [("SUCCESS", run_id), (None, None)]


def test_a_bad_logical_date_is_refused(tmp_path: Path) -> None:
    dag_file = write_dag(tmp_path, "from executor import DAG\ndag = DAG('d')\n")
    proc = cli(
        "run",
        str(dag_file),
        "--db",
        f"sqlite:///{tmp_path / 'x.db'}",
        "--logical-date",
        "25/04/2026",
    )
    assert proc.returncode == 2
    assert "not a date (YYYY-MM-DD): '25/04/2026'" in proc.stderr
    assert not (tmp_path / "x.db").exists()


def deferred(db: Path) -> bool:
    try:
        return bool(sql(db, "SELECT 1 FROM task WHERE state = 'DEFERRED'"))
    except sqlite3.OperationalError:  # the file exists before its tables do
        return False


def test_a_run_waits_for_yesterdays_run_of_another_dag(tmp_path: Path) -> None:
    """The whole pattern through the CLI: report@D waits (deferred, no slot held) until
    ingest@D-1 has loaded, then runs with the other run's id and state as its input."""
    ingest = write_dag(
        tmp_path,
        """
        from executor import DAG

        dag = DAG("ingest")
        dag.task(lambda ctx: ctx.ds, task_id="load")
        """,
        name="ingest.py",
    )
    report = write_dag(
        tmp_path,
        """
        from executor import DAG
        from triggers.external import ExternalDagRunTrigger

        dag = DAG("report")
        wait = dag.sensor(
            "wait_for_yesterday",
            ExternalDagRunTrigger(
                dag_id="ingest", task_id="load", logical_date="{{ ds }}", offset_days=-1,
                poke_interval=0.1,
            ),
            mode="deferrable",
            timeout="1h",
        )

        @dag.task(parents=[wait])
        def build(ctx):
            return ctx.inputs["wait_for_yesterday"]
        """,
        name="report.py",
    )
    db = tmp_path / "x.db"
    url = f"sqlite:///{db}"
    date_args = ["--logical-date", "2026-04-25", "--json"]
    waiting = subprocess.Popen(
        [sys.executable, "-m", "slotless", "run", str(report), "--db", url, *date_args],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: deferred(db), what="the report's sensor to defer")
        assert waiting.poll() is None
        loaded = cli("run", str(ingest), "--db", url, "--logical-date", "2026-04-24", "--json")
        assert loaded.returncode == 0, loaded.stderr
        out, err = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 0, err
    result = json.loads(out)
    assert result["tasks"] == {"wait_for_yesterday": "SUCCESS", "build": "SUCCESS"}
    (row,) = sql(db, "SELECT output FROM task WHERE task_id = 'build'")
    assert json.loads(row["output"]) == {
        "dag_id": "ingest",
        "task_id": "load",
        "logical_date": "2026-04-24",
        "run_id": json.loads(loaded.stdout)["run_id"],
        "state": "SUCCESS",
    }
