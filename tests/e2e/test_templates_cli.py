"""Templates through the real command line: examples/templated_sensor.py (the sensor of
docs/migrating-from-airflow.md, ``{{ macros.ds_add(ds, -1) }}``) runs to the end and waited
for the day before its logical date; a template that cannot parse, or names what is not
there, is refused before anything runs (``slotless run``: one line, exit status 2) and
listed as a broken file by ``slotless dags list``, naming the task and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.helpers import REPO, cli, cli_env, sql, write_dag

pytestmark = pytest.mark.slow

SYNTAX_ERROR = """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG("bad_syntax")
dag.sensor("wait", FileTrigger(path="/in/{{ macros.ds_add(ds, -1) }.csv"))
"""

UNKNOWN_NAME = """
from executor import DAG

dag = DAG("bad_name")


@dag.task(templates={"key": "in/{{ prev_ds }}.csv"})
def load(ctx):
    return ctx.templates["key"]
"""


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {stderr!r}"
    assert lines[0].startswith("slotless: error: "), lines[0]
    return lines[0]


def test_the_templated_sensor_example_waits_for_yesterdays_file(tmp_path: Path) -> None:
    env = cli_env(SLOTLESS_DEMO_DIR=str(tmp_path))
    db = f"sqlite:///{tmp_path / 'example.db'}"
    example = str(REPO / "examples" / "templated_sensor.py")
    proc = cli("run", example, "--db", db, "--logical-date", "2024-03-01", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["state"] == "SUCCESS", result
    landed = tmp_path / "templated" / "landing" / "2024-02-29" / "settlement.csv"  # a leap day
    assert landed.exists()
    [trigger] = sql(tmp_path / "example.db", "SELECT kwargs FROM trigger")
    assert json.loads(trigger["kwargs"])["path"] == str(landed)
    report = tmp_path / "templated" / "reports" / "south" / "20240301.json"
    assert json.loads(report.read_text()) == {
        "title": "Settlements of 29 Feb 2024",
        "total_paise": 223000,
    }


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (
            SYNTAX_ERROR,
            "DAG 'bad_syntax': sensor 'wait': field path: template "
            "'/in/{{ macros.ds_add(ds, -1) }.csv': TemplateSyntaxError: unexpected '}'",
        ),
        (
            UNKNOWN_NAME,
            "DAG 'bad_name': task 'load': field templates.key: template 'in/{{ prev_ds }}.csv': "
            "unknown name 'prev_ds' (removed in Airflow 3: use macros.ds_add(ds, -1), or "
            "data_interval_start | ds)",
        ),
    ],
)
def test_a_bad_template_is_refused_before_anything_runs(
    tmp_path: Path, source: str, said: str
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    dag_file = write_dag(dags, source, "bad.py")
    db_path = tmp_path / "refused.db"
    db = f"sqlite:///{db_path}"

    proc = cli("run", str(dag_file), "--db", db, timeout=30)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc.stderr)
    assert said in line, line

    listed = cli("dags", "list", "--db", db, "--dags", str(dags), "--json", "--parse-timeout", "10")
    assert listed.returncode == 0, listed.stderr  # a broken file is listed, as any other
    shown = json.loads(listed.stdout)
    assert shown["dags"] == []
    [broken] = shown["broken_files"]
    assert said in broken["error"] and "\n" not in broken["error"], broken["error"]
    assert sql(db_path, "SELECT count(*) AS n FROM dag_run") == [{"n": 0}]
