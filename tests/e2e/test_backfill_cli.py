"""``slotless backfill`` through the real command line against a running ``slotless worker``
(SQLite): one run per daily interval, never more than ``--max-active`` running at once, the
intervals in ``ctx``; again creates nothing; a failed date exits 1 and ``--rerun-failed``
reruns it once; Ctrl-C stops the following, not the runs; bad input is one line, exit 2."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from support.helpers import cli, sql, start_cli, start_worker, stop_process, wait_until, write_dag

pytestmark = pytest.mark.slow

DAILY = """
import time

from executor import DAG

dag = DAG("daily", schedule="@daily", timezone="Europe/Paris")


@dag.task
def work(ctx):
    time.sleep(0.3)  # long enough for runs to overlap if the limit did not hold
    return [ctx.ds, ctx.data_interval_start.isoformat(), ctx.data_interval_end.isoformat()]
"""

FLAKY = """
from executor import DAG

dag = DAG("flaky", schedule="0 6 * * *")


@dag.task
def load(ctx):
    if ctx.ds == "2026-05-03":
        raise RuntimeError("no data for 3 May")
    return ctx.ds
"""

ADHOC = """
from executor import DAG

dag = DAG("adhoc")


@dag.task
def work(ctx):
    return 1
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    dags = tmp_path / "dags"
    dags.mkdir()
    for name, source in (("daily", DAILY), ("flaky", FLAKY), ("adhoc", ADHOC)):
        write_dag(dags, source, f"{name}.py")
    return dags


@pytest.fixture
def worker(folder: Path, db_url: str, tmp_path: Path):
    """The catalogue made (so the schema exists before anything reads it), then a worker."""
    assert cli("dags", "list", "--db", db_url, "--dags", str(folder)).returncode == 0
    log = tmp_path / "worker.log"
    proc = start_worker(db_url, "--poll-interval", "0.05", "--slots", "8", log=log)
    yield
    assert stop_process(proc) == 0, log.read_text()


def backfill(db_url: str, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("backfill", *args, "--db", db_url, "--dags", str(folder), timeout=30)


def runs(db_path: Path, dag_id: str) -> list[dict]:
    return sql(db_path, "SELECT * FROM dag_run WHERE dag_id = ? ORDER BY run_key", dag_id)


def test_five_days_two_at_a_time_then_again_creates_nothing(
    folder: Path, db_path: Path, db_url: str, tmp_path: Path, worker: None
) -> None:
    log = tmp_path / "backfill.log"
    proc = start_cli(
        "backfill", "daily", "--from", "2026-05-01", "--to", "2026-05-05", "--max-active", "2",
        "--db", db_url, "--dags", str(folder), log=log,
    )  # fmt: skip
    most = 0

    def ended() -> bool:
        nonlocal most
        running = sql(db_path, "SELECT count(*) AS n FROM dag_run WHERE state = 'RUNNING'")
        most = max(most, running[0]["n"])
        return proc.poll() is not None

    try:
        wait_until(ended, 25, interval=0.01, what="the backfill to end")
    finally:
        stop_process(proc)  # a failed wait must not leave it following forever
    out = log.read_text()
    assert proc.returncode == 0, out
    assert most == 2, out  # two ran at once, never three
    assert out.splitlines()[0].startswith(
        "backfill daily: 5 intervals, 2026-05-01 to 2026-05-05 (every day at 00:00 "
        "Europe/Paris): 5 created, 0 rerun, 0 already had a run; at most 2 running at once"
    )
    assert "backfill daily: 5 runs: 5 succeeded, 0 failed" in out

    made = runs(db_path, "daily")
    assert [r["state"] for r in made] == ["SUCCESS"] * 5
    # Keyed as the schedule keys them: midnight in Paris is 22:00 UTC the day before.
    assert [r["run_key"] for r in made] == [
        "2026-04-30T22:00:00Z",
        "2026-05-01T22:00:00Z",
        "2026-05-02T22:00:00Z",
        "2026-05-03T22:00:00Z",
        "2026-05-04T22:00:00Z",
    ]
    outputs = [
        json.loads(row["output"])
        for row in sql(
            db_path,
            "SELECT t.output FROM task t JOIN dag_run r ON r.run_id = t.run_id"
            " WHERE r.dag_id = 'daily' ORDER BY r.run_key",
        )
    ]
    assert outputs[0] == ["2026-05-01", "2026-04-30T22:00:00+00:00", "2026-05-01T22:00:00+00:00"]
    assert [o[0] for o in outputs] == [f"2026-05-0{d}" for d in range(1, 6)]

    again = backfill(
        db_url, folder, "daily", "--from", "2026-05-01", "--to", "2026-05-05", "--json"
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert (report["created"], report["existing"], report["rerun"]) == (0, 5, 0)
    assert [r["run_id"] for r in report["runs"]] == [r["run_id"] for r in made]
    assert {r["state"] for r in report["runs"]} == {"SUCCESS"}
    assert len(runs(db_path, "daily")) == 5


def test_a_failed_date_exits_1_and_rerun_failed_reruns_it_once(
    folder: Path, db_path: Path, db_url: str, worker: None
) -> None:
    window = ("flaky", "--from", "2026-05-01", "--to", "2026-05-04")
    first = backfill(db_url, folder, *window)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "backfill flaky: 4 runs: 3 succeeded, 1 failed" in first.stdout
    [failed] = [r for r in runs(db_path, "flaky") if r["state"] == "FAILED"]
    assert failed["run_key"] == "2026-05-03T06:00:00Z"
    assert f"FAILED 2026-05-03 06:00: {failed['run_id']}" in first.stdout

    # Without the flag the failure is reported and left alone; the exit status says it.
    again = backfill(db_url, folder, *window, "--no-wait")
    assert again.returncode == 0, again.stderr
    assert f"{failed['run_id']} FAILED, left alone" in again.stdout
    assert len(runs(db_path, "flaky")) == 4

    rerun = backfill(db_url, folder, *window, "--rerun-failed", "--json")
    assert rerun.returncode == 1, rerun.stderr  # the date fails again
    report = json.loads(rerun.stdout)
    assert (report["created"], report["existing"], report["rerun"]) == (0, 3, 1)
    [new] = [r for r in report["runs"] if r["how"] == "rerun"]
    assert new["rerun_of"] == failed["run_id"] and new["state"] == "FAILED"
    assert new["run_key"] == "2026-05-03T06:00:00Z~rerun-1"
    assert len(runs(db_path, "flaky")) == 5


def test_ctrl_c_stops_following_not_the_runs_of_a_paused_dag(
    folder: Path, db_path: Path, db_url: str, tmp_path: Path
) -> None:
    assert cli("dags", "list", "--db", db_url, "--dags", str(folder)).returncode == 0
    assert cli("dags", "pause", "flaky", "--db", db_url).returncode == 0
    log = tmp_path / "backfill.log"
    proc = start_cli(
        "backfill", "flaky", "--from", "2026-05-01", "--to", "2026-05-02", "--db", db_url, log=log
    )  # no worker: the runs cannot end
    try:
        wait_until(lambda: "is paused" in log.read_text(), 20, what="the backfill to start")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130, log.read_text()
    finally:
        stop_process(proc)
    out = log.read_text()
    assert "DAG 'flaky' is paused: these runs will run; its schedule stays paused" in out
    assert "2 runs: 0 succeeded, 0 failed, 2 running, 0 queued" in out
    assert "interrupted: 2 runs not ended go on in the workers" in out
    assert [r["state"] for r in runs(db_path, "flaky")] == ["RUNNING", "RUNNING"]


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slotless: error: "), proc.stderr
    return lines[0].removeprefix("slotless: error: ")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("nope", "--from", "2026-05-01", "--to", "2026-05-02"), "no DAG 'nope' in the catalogue"),
        (("adhoc", "--from", "2026-05-01", "--to", "2026-05-02"), "DAG 'adhoc' has no schedule"),
        (("daily", "--from", "2026-05-05", "--to", "2026-05-01"), "--from 2026-05-05 is after"),
        (("daily", "--from", "2026-05-01", "--to", "5 May"), "--to: not a date (YYYY-MM-DD)"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(
    folder: Path, db_path: Path, db_url: str, args: tuple[str, ...], error: str
) -> None:
    assert one_error(backfill(db_url, folder, *args)).startswith(error)
    assert sql(db_path, "SELECT * FROM dag_run") == []
