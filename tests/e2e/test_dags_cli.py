"""``slotless dags list|pause|unpause`` through the real command line: the folder from
``--dags`` or ``SLOTLESS_DAGS``, broken files listed with their error (exit 0), the last run
state, and an unknown DAG refused with one line and exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import REPO, cli, cli_env, sql, stop_process, wait_until, write_dag
from support.refused_dags import CYCLE, UNLISTED_SENSOR

pytestmark = pytest.mark.slow

GOOD = """
from executor import DAG

dag = DAG("nightly")


@dag.task
def work(ctx):
    return 1
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    dags = tmp_path / "dags"
    dags.mkdir()
    write_dag(dags, GOOD, "nightly.py")
    write_dag(dags, "import sys\n\nsys.exit(3)\n", "exits.py")
    return dags


def listing(db_url: str, *extra: str, env: dict[str, str] | None = None) -> dict:
    proc = cli("dags", "list", "--db", db_url, "--json", "--parse-timeout", "10", *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_list_parses_the_folder_and_shows_broken_files(folder: Path, db_url: str) -> None:
    shown = listing(db_url, "--dags", str(folder))
    assert [(d["dag_id"], d["paused"], d["schedule"]) for d in shown["dags"]] == [
        ("nightly", False, None)
    ]
    assert shown["dags"][0]["file"] == str((folder / "nightly.py").resolve())
    assert shown["dags"][0]["last_run_state"] is None
    [broken] = shown["broken_files"]
    assert broken["file"] == str((folder / "exits.py").resolve())
    assert "sys.exit(3)" in broken["error"]

    # The table, for people: both sections.
    proc = cli("dags", "list", "--db", db_url, "--dags", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert "nightly" in proc.stdout and "broken DAG files" in proc.stdout
    assert "sys.exit(3)" in proc.stdout


def test_slotless_dags_names_the_folder_and_runs_show_their_state(
    folder: Path, db_url: str, tmp_path: Path
) -> None:
    env = cli_env(SLOTLESS_DAGS=str(folder))
    assert [d["dag_id"] for d in listing(db_url, env=env)["dags"]] == ["nightly"]

    run = cli("run", str(folder / "nightly.py"), "--db", db_url, "--json")
    assert run.returncode == 0, run.stderr
    [dag] = listing(db_url)["dags"]  # no folder now: reads the catalogue as stored
    assert dag["last_run_state"] == "SUCCESS"

    (folder / "nightly.py").unlink()
    assert listing(db_url, env=env)["dags"] == []


def test_pause_and_unpause(folder: Path, db_url: str) -> None:
    listing(db_url, "--dags", str(folder))
    proc = cli("dags", "pause", "nightly", "--db", db_url)
    assert (proc.returncode, proc.stdout.strip()) == (0, "nightly: paused")
    assert listing(db_url)["dags"][0]["paused"] is True
    proc = cli("dags", "unpause", "nightly", "--db", db_url)
    assert (proc.returncode, proc.stdout.strip()) == (0, "nightly: unpaused")
    assert listing(db_url)["dags"][0]["paused"] is False


def test_an_unknown_dag_is_one_line_and_exit_2(folder: Path, db_url: str) -> None:
    listing(db_url, "--dags", str(folder))
    for action in ("pause", "unpause"):
        proc = cli("dags", action, "no_such_dag", "--db", db_url)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1
        assert lines[0].startswith("slotless: error: no DAG 'no_such_dag'")


def test_a_missing_folder_is_a_user_error(tmp_path: Path, db_url: str) -> None:
    proc = cli("dags", "list", "--db", db_url, "--dags", str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("slotless: error: DAG folder")
    assert "is not a directory" in proc.stderr


SCHEDULED = """
from datetime import datetime

from executor import DAG

dag = DAG("paris", schedule="30 2 * * *", timezone="Europe/Paris", start_date=datetime(2026, 3, 28),
          catchup=True)
"""


def test_list_shows_the_schedule_in_words_and_the_next_run(tmp_path: Path, db_url: str) -> None:
    dags = tmp_path / "scheduled"
    dags.mkdir()
    write_dag(dags, SCHEDULED, "paris.py")
    [dag] = listing(db_url, "--dags", str(dags))["dags"]
    assert (dag["schedule"], dag["timezone"]) == ("30 2 * * *", "Europe/Paris")
    assert dag["schedule_words"] == "every day at 02:30 Europe/Paris"
    # catchup from 28 March: the first run is 28 March's, due on the spring-forward day
    # at 03:00 (02:30 does not exist that night).
    assert dag["next_logical_date"] == "2026-03-28T01:30:00+00:00"
    assert dag["next_run"] == "2026-03-28 02:30 (due 2026-03-29 03:00)"

    # The table, wide enough that rich keeps each cell on one line.
    proc = cli("dags", "list", "--db", db_url, env=cli_env(COLUMNS="250"))
    assert proc.returncode == 0, proc.stderr
    assert "next run" in proc.stdout
    assert "every day at 02:30 Europe/Paris" in proc.stdout
    assert "2026-03-28 02:30 (due 2026-03-29 03:00)" in proc.stdout


def test_a_dag_that_run_would_refuse_is_listed_broken_and_nothing_is_armed(
    tmp_path: Path, db_url: str, db_path: Path
) -> None:
    dags = tmp_path / "refused"
    dags.mkdir()
    write_dag(dags, CYCLE, "cycle.py")
    write_dag(dags, UNLISTED_SENSOR, "unlisted.py")
    shown = listing(db_url, "--dags", str(dags))
    assert shown["dags"] == []
    broken = {Path(b["file"]).name: b["error"] for b in shown["broken_files"]}
    assert broken["cycle.py"].endswith("DAG 'loops_back': cycle: a -> b -> c -> a")
    assert ".Unlisted is not allow-listed, so it cannot defer" in broken["unlisted.py"]
    assert "SLOTLESS_ALLOWED_TRIGGERS" in broken["unlisted.py"]
    assert sql(db_path, "SELECT * FROM start_wait") == []


HELPED = """
from executor import DAG
from slotless_test_helper import SCHEDULE

dag = DAG("helped", schedule=SCHEDULE)


@dag.task
def work(ctx):
    return 1
"""


def test_a_shell_without_the_services_path_does_not_decide_that_a_file_is_broken(
    tmp_path: Path, db_url: str, db_path: Path
) -> None:
    # The services' environment has a helper module on PYTHONPATH; the shell's has not.
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "slotless_test_helper.py").write_text('SCHEDULE = "@hourly"\n')
    dags = tmp_path / "helped"
    dags.mkdir()
    write_dag(dags, HELPED, "helped.py")
    services = cli_env()
    services["PYTHONPATH"] = os.pathsep.join([str(lib), services["PYTHONPATH"]])

    # By hand, first: the shell is shown what it found itself.
    shown = listing(db_url, "--dags", str(dags))
    assert shown["dags"] == []
    [broken] = shown["broken_files"]
    assert "ModuleNotFoundError: No module named 'slotless_test_helper'" in broken["error"]

    # The services parse the file again and settle it: healthy, its schedule armed.
    log = tmp_path / "triggerer.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "slotless", "triggerer", "--db", db_url, "--dags", str(dags),
         "--rescan", "0.2"],
        cwd=REPO, env=services, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def settled() -> bool:
            files = sql(db_path, "SELECT parse_error, mtime FROM dag_file")
            return files[0]["parse_error"] is None and files[0]["mtime"] is not None

        wait_until(settled, 60, interval=0.1, what=f"the services' parse ({log})")
        [armed] = sql(db_path, "SELECT dag_id FROM start_wait")
        assert armed["dag_id"] == "helped"

        # By hand again: the file is unchanged since the services parsed it, so the shell
        # neither parses it nor overwrites their verdict.
        again = listing(db_url, "--dags", str(dags))
        assert [(d["dag_id"], d["parse_error"]) for d in again["dags"]] == [("helped", None)]
        assert again["broken_files"] == []
    finally:
        stop_process(proc)
