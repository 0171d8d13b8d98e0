"""The command line, in subprocesses: ``run --json``, ``status --json``, ``logs``, and bad
input (a DAG file that does not import, output JSON cannot hold, an unknown --db scheme, a
database from a newer slotless): one-line errors, exit status 2, nothing half-written."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import date
from pathlib import Path

import pytest
from support.helpers import cli, cli_env, sql, write_dag

from executor.loader import load_dag
from executor.store import open_store

pytestmark = pytest.mark.slow

GOOD = """
from executor import DAG

dag = DAG("good")


@dag.task
def extract(ctx):
    ctx.log("extracting for " + ctx.ds)
    return [1, 2, 3]


@dag.task(parents=[extract])
def load(ctx):
    return sum(ctx.inputs["extract"])
"""

FAILING = """
from executor import DAG

dag = DAG("failing")


@dag.task
def ok(ctx):
    return 1


@dag.task(parents=[ok])
def broken(ctx):
    raise RuntimeError("broken on purpose")


@dag.task(parents=[broken])
def never(ctx):
    return 2
"""

NOT_JSON = """
from executor import DAG

dag = DAG("not_json")


@dag.task
def odd(ctx):
    return {"a set": {1, 2}}
"""


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {stderr!r}"
    assert lines[0].startswith("slotless: error: "), lines[0]
    return lines[0]


def run_json(dag_file: Path, db_url: str, *extra: str) -> tuple[int, dict]:
    proc = cli("run", str(dag_file), "--db", db_url, "--json", *extra, timeout=30)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, f"--json must print one line, got {proc.stdout!r} / {proc.stderr}"
    return proc.returncode, json.loads(lines[0])


def tables(db_path: Path) -> list[tuple]:
    return [
        tuple(r.values())
        for r in sql(db_path, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    ]


def test_run_json_success_status_and_logs(tmp_path: Path, db_path: Path, db_url: str) -> None:
    dag_file = write_dag(tmp_path, GOOD)
    code, out = run_json(dag_file, db_url, "--logical-date", "2026-02-03", "--slots", "2")
    assert code == 0
    assert set(out) == {"dag_id", "run_id", "state", "tasks", "failed"}
    assert out["failed"] == {}  # each failed task (TASK or TASK[INDEX]) with its error
    assert out["dag_id"] == "good" and out["state"] == "SUCCESS"
    assert out["tasks"] == {"extract": "SUCCESS", "load": "SUCCESS"}
    run_id = out["run_id"]
    (run,) = sql(db_path, "SELECT * FROM dag_run")
    assert (run["run_id"], run["logical_date"], run["dag_file"]) == (
        run_id,
        "2026-02-03",
        str(dag_file.resolve()),
    )

    logs = cli("logs", run_id, "extract", "--db", db_url)
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert len(lines) == 3
    assert "PENDING -> RUNNING: claimed by" in lines[0]
    assert lines[1].endswith("extracting for 2026-02-03") and "[attempt 1]" in lines[1]
    assert "RUNNING -> SUCCESS: succeeded" in lines[2]

    missing = cli("logs", run_id, "nope", "--db", db_url)
    assert missing.returncode == 2
    assert "no task 'nope'" in one_error_line(missing.stderr)

    status = cli("status", "--db", db_url, "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    (listed,) = [r for r in data["runs"] if r["run_id"] == run_id]
    assert listed["state"] == "SUCCESS" and listed["dag_id"] == "good"
    assert listed["logical_date"] == "2026-02-03"
    assert listed["tasks"] == {"SUCCESS": 2}


def test_run_json_failure_exits_1(tmp_path: Path, db_url: str) -> None:
    code, out = run_json(write_dag(tmp_path, FAILING), db_url)
    assert code == 1
    assert out["state"] == "FAILED"
    assert out["tasks"] == {"ok": "SUCCESS", "broken": "FAILED", "never": "UPSTREAM_FAILED"}
    logs = cli("logs", out["run_id"], "broken", "--db", db_url)
    assert "RuntimeError: broken on purpose" in logs.stdout
    assert "Traceback" in logs.stdout


def test_output_json_cannot_hold_fails_the_task(tmp_path: Path, db_path, db_url) -> None:
    code, out = run_json(write_dag(tmp_path, NOT_JSON), db_url)
    assert code == 1
    assert out["tasks"] == {"odd": "FAILED"} and out["state"] == "FAILED"
    logs = cli("logs", out["run_id"], "odd", "--db", db_url)
    assert "output cannot be stored as JSON" in logs.stdout
    assert "set is not JSON serializable" in logs.stdout
    assert sql(db_path, "SELECT output FROM task")[0]["output"] is None


HUNG_THREAD = """
import time

from executor import DAG

dag = DAG("hung_thread")


@dag.task(execution_timeout=0.5)
def stuck(ctx):
    time.sleep(3600)
"""


def test_run_ends_when_a_timed_out_thread_never_returns(tmp_path: Path, db_url: str) -> None:
    """Thread isolation cannot stop a task past its execution timeout; ``slotless run``
    must still report the run and exit instead of waiting for the thread forever."""
    code, out = run_json(write_dag(tmp_path, HUNG_THREAD), db_url)
    assert code == 1
    assert out["tasks"] == {"stuck": "FAILED"}
    logs = cli("logs", out["run_id"], "stuck", "--db", db_url)
    assert "execution timeout: still running after 0.5 s" in logs.stdout


@pytest.mark.parametrize(
    ("source", "cause"),
    [
        ("raise RuntimeError('kaboom')\n", "RuntimeError: kaboom (line 1)"),
        ("x = 1\nimport no_such_module_zz\n", "No module named 'no_such_module_zz' (line 2)"),
        ("def broken(:\n", "SyntaxError"),
        ("x = 1\n", "must define exactly one DAG"),
        (
            "from executor import DAG\ndag = DAG('c')\n"
            "a = dag.task(lambda ctx: 1, task_id='a')\n"
            "b = dag.task(lambda ctx: 1, task_id='b', parents=['a'])\nb >> a\n",
            "cycle: a -> b -> a",
        ),
        (
            "from executor import DAG\ndag = DAG('u')\n"
            "dag.task(lambda ctx: 1, task_id='a', parents=['ghost'])\n",
            "unknown parent 'ghost'",
        ),
    ],
    ids=["raises", "import-error", "syntax", "no-dag", "cycle", "unknown-parent"],
)
def test_bad_dag_file(tmp_path: Path, db_path: Path, db_url: str, source: str, cause: str):
    dag_file = write_dag(tmp_path, source)
    proc = cli("run", str(dag_file), "--db", db_url, "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    line = one_error_line(proc.stderr)
    assert cause in line
    assert "Traceback" not in proc.stderr
    # nothing was written: the store was not even opened
    assert not db_path.exists() or sql(db_path, "SELECT count(*) AS n FROM dag_run")[0]["n"] == 0


@pytest.mark.parametrize("command", [["run", "F"], ["worker"]])
def test_zero_slots_is_refused_before_anything_is_written(tmp_path: Path, command) -> None:
    dag_file = write_dag(tmp_path, GOOD)
    args = [str(dag_file) if a == "F" else a for a in command]
    db = tmp_path / "zero.db"
    proc = cli(*args, "--db", f"sqlite:///{db}", "--slots", "0", timeout=30)
    assert proc.returncode == 2
    assert "argument --slots: must be a whole number of at least 1: '0'" in proc.stderr
    assert not db.exists()


def test_missing_dag_file(tmp_path: Path, db_url: str) -> None:
    proc = cli("run", str(tmp_path / "nope.py"), "--db", db_url)
    assert proc.returncode == 2
    assert "does not exist" in one_error_line(proc.stderr)


@pytest.mark.parametrize("command", [["status"], ["worker"], ["logs", "r", "t"], ["run", "F"]])
def test_unknown_db_scheme(tmp_path: Path, command: list[str]) -> None:
    dag_file = write_dag(tmp_path, GOOD)
    args = [str(dag_file) if a == "F" else a for a in command]
    proc = cli(*args, "--db", "foo://x", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown database URL scheme 'foo'" in one_error_line(proc.stderr)
    assert list(tmp_path.iterdir()) == [dag_file]  # no database file appeared anywhere


def make_newer(db_path: Path, db_url: str, tmp_path: Path) -> None:
    """A database that a later slotless wrote: schema version 999, and one run in it."""

    async def seed() -> None:
        store = await open_store(db_url)
        try:
            await store.runs.create_run(
                load_dag(write_dag(tmp_path, GOOD, "seed.py")), date.today()
            )
        finally:
            await store.close()

    asyncio.run(seed())
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("INSERT INTO schema_version VALUES (999, 'from_the_future', 0)")
    conn.close()


def snapshot(db_path: Path) -> tuple:
    return (
        tables(db_path),
        sql(db_path, "SELECT * FROM schema_version ORDER BY version"),
        sql(db_path, "SELECT * FROM dag_run"),
        sql(db_path, "SELECT * FROM task ORDER BY id"),
        sql(db_path, "SELECT * FROM task_event ORDER BY id"),
    )


def test_newer_schema_is_refused(tmp_path: Path, db_path: Path, db_url: str) -> None:
    make_newer(db_path, db_url, tmp_path)
    before = snapshot(db_path)
    dag_file = write_dag(tmp_path, GOOD)
    for command in (["run", str(dag_file), "--json"], ["status", "--json"], ["worker"]):
        proc = cli(*command, "--db", db_url, timeout=30)
        assert proc.returncode == 2, command
        assert proc.stdout == ""
        line = one_error_line(proc.stderr)
        assert "schema version 999" in line and "newer" in line
        assert snapshot(db_path) == before, f"{command[0]} changed the database"


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not an SQLite database, not even close" * 100)
    before = junk.read_bytes()
    proc = cli("status", "--db", f"sqlite:///{junk}", timeout=30)
    assert proc.returncode == 2
    assert "not a database" in one_error_line(proc.stderr)
    assert junk.read_bytes() == before


def test_default_database_and_slotless_db(tmp_path: Path) -> None:
    dag_file = write_dag(tmp_path, GOOD)
    proc = cli("run", str(dag_file), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "slotless.db").exists()
    elsewhere = tmp_path / "elsewhere.db"
    env = cli_env(SLOTLESS_DB=f"sqlite:///{elsewhere}")
    proc = cli("run", str(dag_file), "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout)["run_id"]
    assert [r["run_id"] for r in sql(elsewhere, "SELECT run_id FROM dag_run")] == [run_id]
    assert len(sql(tmp_path / "slotless.db", "SELECT run_id FROM dag_run")) == 1
