"""``slotless trigger`` through the real command line against a running ``slotless worker``:
a run is created once per run key, the worker runs it to SUCCESS with ``ctx.params`` from
``--conf``; a bad conf, an unknown DAG or a paused DAG is one error line, exit 2, and
stores nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.helpers import cli, sql, start_worker, stop_process, wait_until, write_dag

pytestmark = pytest.mark.slow

REPORT = """
from pydantic import BaseModel

from executor import DAG


class Window(BaseModel):
    region: str
    days: int = 1


dag = DAG("report", params=Window)
print("report.py imported")  # must not spoil `--json` on stdout


@dag.task
def build(ctx):
    return {"params": ctx.params.model_dump(), "ds": ctx.ds}


@dag.task(parents=[build])
def publish(ctx):
    return ctx.inputs["build"]["params"]["region"]
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    dags = tmp_path / "dags"
    dags.mkdir()
    write_dag(dags, REPORT, "report.py")
    return dags


def trigger(db_url: str, folder: Path, *extra: str) -> tuple[int, str, str]:
    proc = cli("trigger", "report", "--db", db_url, "--dags", str(folder), *extra)
    return proc.returncode, proc.stdout, proc.stderr


def runs(db_path: Path) -> list[dict]:
    return sql(db_path, "SELECT * FROM dag_run ORDER BY created_at")


def test_a_run_is_created_once_per_key_and_the_worker_runs_it_with_its_params(
    folder: Path, db_path: Path, db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    worker = start_worker(db_url, "--poll-interval", "0.05", log=log)
    try:
        conf = '{"region": "us", "days": "3"}'
        code, out, err = trigger(
            db_url, folder, "--conf", conf, "--run-key", "us-2026-05-01",
            "--logical-date", "2026-05-01", "--json",
        )  # fmt: skip
        assert code == 0, err
        first = json.loads(out)
        assert first["created"] is True and first["run_key"] == "us-2026-05-01"
        assert "report.py imported" in err

        # The same trigger again (a retried script): nothing new, the run named (exit 0).
        code, out, err = trigger(db_url, folder, "--conf", conf, "--run-key", "us-2026-05-01")
        assert code == 0, err
        assert out.strip() == (
            f"{first['run_id']}: already exists for run key us-2026-05-01; nothing created"
        )
        [run] = runs(db_path)
        assert run["run_id"] == first["run_id"]
        assert run["dag_file"] == str((folder / "report.py").resolve())
        assert json.loads(run["conf"]) == {"region": "us", "days": "3"}

        def state() -> str:
            return str(runs(db_path)[0]["state"])

        wait_until(lambda: state() != "RUNNING", 30, what="the worker to end the run")
        assert state() == "SUCCESS", log.read_text()
        outputs = {
            r["task_id"]: json.loads(r["output"])
            for r in sql(
                db_path, "SELECT task_id, output FROM task WHERE run_id = ?", run["run_id"]
            )
        }
        assert outputs["build"] == {"params": {"region": "us", "days": 3}, "ds": "2026-05-01"}
        assert outputs["publish"] == "us"

        # Without a key, each trigger is a run of its own (several manual runs per date).
        for _ in range(2):
            code, out, err = trigger(db_url, folder, "--conf", '{"region": "eu"}')
            assert code == 0, err
            assert "created (run key" in out
        assert len(runs(db_path)) == 3
        wait_until(
            lambda: all(r["state"] == "SUCCESS" for r in runs(db_path)), 30, what="both runs"
        )
    finally:
        assert stop_process(worker) == 0, log.read_text()


def one_error(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slotless: error: "), err
    return lines[0]


def test_a_bad_conf_an_unknown_dag_and_a_paused_dag_are_refused_storing_nothing(
    folder: Path, db_path: Path, db_url: str
) -> None:
    # The catalogue exists (and holds the DAG) before any refusal.
    assert cli("dags", "list", "--db", db_url, "--dags", str(folder)).returncode == 0

    code, _, err = trigger(db_url, folder, "--conf", '{"region": ')
    assert "--conf is not JSON" in one_error(code, err)
    code, _, err = trigger(db_url, folder, "--conf", '{"region": "us", "days": "many"}')
    assert one_error(code, err.replace("report.py imported\n", "")) == (
        "slotless: error: bad conf for DAG 'report': days: Input should be a valid integer, "
        "unable to parse string as an integer (got 'many')"
    )
    code, _, err = trigger(db_url, folder, "--conf", '{"region": "us", "colour": "red"}')
    assert "unknown param 'colour'" in one_error(code, err.replace("report.py imported\n", ""))
    code, _, err = trigger(db_url, folder)  # region is required
    assert "region: Field required" in one_error(code, err.replace("report.py imported\n", ""))

    proc = cli("trigger", "no_such_dag", "--db", db_url)
    assert one_error(proc.returncode, proc.stderr).startswith(
        "slotless: error: no DAG 'no_such_dag' in the catalogue"
    )

    assert cli("dags", "pause", "report", "--db", db_url).returncode == 0
    code, _, err = trigger(db_url, folder, "--conf", '{"region": "us"}')
    assert "DAG 'report' is paused" in one_error(code, err)
    assert runs(db_path) == []

    # --force: a person's explicit start of a paused DAG is created (and would run).
    code, out, err = trigger(db_url, folder, "--conf", '{"region": "us"}', "--force", "--json")
    assert code == 0, err
    assert json.loads(out)["created"] is True
    assert len(runs(db_path)) == 1
