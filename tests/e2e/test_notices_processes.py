"""What a person reads from the commands, in real processes.

* ``slotless up``: an approval notice links to the page this very command serves (its
  port, not another default), and a second ``up`` on the same database says, in one line,
  which worker and triggerer of this machine already serve it;
* ``slotless logs`` on a run that does not exist says so, in one line, exit 2;
* ``slotless run``: its summary shows each failed task's error (a mapped task's failed
  instances by index) and it exits 1 when a task failed, although an ``all_done`` leaf
  after it succeeded and so the run did;
* a mapped task's failure notice names its failed instances and their errors.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from support.helpers import cli, free_port, sql, start_cli, stop_process, wait_until, write_dag
from support.ops import wait_for_http
from support.receivers import HttpReceiver

pytestmark = pytest.mark.slow

APPROVAL = """
from executor import DAG
from triggers.people import Approval

dag = DAG("linked")
dag.sensor("sign_off", Approval(subject="Sign off", respondents=["alice"], notify={url!r}),
           timeout="1h")
"""


def test_up_links_its_notices_to_the_page_it_serves(
    tmp_path: Path, http_receiver: HttpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLOTLESS_UI_URL", raising=False)
    dag_file = write_dag(tmp_path, APPROVAL.format(url=http_receiver.json_url("ask")))
    port, log = free_port(), tmp_path / "up.log"
    up = start_cli(
        "up", str(dag_file), "--db", f"sqlite:///{tmp_path / 'up.db'}", "--port", str(port),
        log=log,
    )  # fmt: skip
    try:
        [got] = http_receiver.wait_for(1, timeout=60)
        [row] = sql(tmp_path / "up.db", "SELECT id FROM task WHERE task_id = 'sign_off'")
        assert f"http://127.0.0.1:{port}/needs-you#task-{row['id']}" in got.json["message"], (
            got.json
        )
        # ... and the page answers there.
        assert wait_for_http(f"http://127.0.0.1:{port}/needs-you", up, log)[0] == 200
    finally:
        assert stop_process(up, signal.SIGINT) == 0, log.read_text()


def test_a_second_up_on_the_same_database_says_who_already_serves_it(tmp_path: Path) -> None:
    db_path = tmp_path / "twice.db"
    db = f"sqlite:///{db_path}"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start_cli("up", "--db", db, "--port", str(free_port()), log=first_log)
    second = None
    try:
        pids = wait_until(
            lambda: re.findall(r"(worker|triggerer) \(pid (\d+)\)", first_log.read_text()),
            what="the first stack's pids",
        )
        wait_until(
            lambda: (
                sql(db_path, "SELECT count(*) AS n FROM worker")[0]["n"]
                and sql(db_path, "SELECT count(*) AS n FROM triggerer")[0]["n"]
            ),
            what="the first worker and triggerer to register",
        )
        second = start_cli("up", "--db", db, "--port", str(free_port()), log=second_log)
        wait_until(lambda: "started; Ctrl-C" in second_log.read_text(), what="the second up")
        [line] = [ln for ln in second_log.read_text().splitlines() if "already serve" in ln]
        for name, pid in pids:
            assert re.search(rf"{name} [^ ]+:{pid}:", line), (line, pids)
    finally:
        codes = [stop_process(p, signal.SIGINT) for p in (second, first) if p is not None]
    assert "already serve" not in first_log.read_text()
    assert codes == [0] * len(codes), (first_log.read_text(), second_log.read_text())


def test_logs_of_a_run_that_does_not_exist_says_so(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'logs.db'}"
    dag_file = write_dag(tmp_path, HELLO)
    assert cli("run", str(dag_file), "--db", db, "--json").returncode == 0
    proc = cli("logs", "no-such-run", "hello", "--db", db)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == ["slotless: error: no run 'no-such-run' in this database"]


HELLO = """
from executor import DAG

dag = DAG("hello")


@dag.task
def hello(ctx):
    return "hi"
"""

MAPPED = """
from executor import DAG

dag = DAG("mapped_fail", notify={url!r})


@dag.task
def items(ctx):
    return [1, 2, 3, 4]


@dag.task(expand=items)
def each(ctx):
    if ctx.item in (2, 4):
        raise ValueError(f"bad item {{ctx.item}}")
    return ctx.item


@dag.task
def lone(ctx):
    raise RuntimeError("lone broke")


@dag.task(parents=[each, lone], trigger_rule="all_done")
def cleanup(ctx):
    return "cleaned"
"""


def _mapped_run(tmp_path: Path, receiver: HttpReceiver, *extra: str) -> Any:
    dag_file = write_dag(tmp_path, MAPPED.format(url=receiver.json_url("alerts")))
    return cli("run", str(dag_file), "--db", f"sqlite:///{tmp_path / 'm.db'}", *extra)


def test_run_shows_each_failed_tasks_error_and_exits_1(
    tmp_path: Path, http_receiver: HttpReceiver
) -> None:
    proc = _mapped_run(tmp_path, http_receiver)
    # The run itself succeeded (its leaf, all_done, did), but two tasks failed: exit 1,
    # as `airflow dags test` would, and the summary says why.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "SUCCESS" in out
    assert "each[1]: ValueError: bad item 2" in out, out
    assert "each[3]: ValueError: bad item 4" in out, out
    assert "lone: RuntimeError: lone broke" in out, out
    assert re.search(r"3 task\(s\) failed", out), out


def test_run_json_exits_1_when_a_task_failed_and_names_the_errors(
    tmp_path: Path, http_receiver: HttpReceiver
) -> None:
    proc = _mapped_run(tmp_path, http_receiver, "--json")
    assert proc.returncode == 1, proc.stderr
    got = json.loads(proc.stdout)
    assert got["state"] == "SUCCESS"
    assert got["failed"] == {
        "each[1]": "ValueError: bad item 2",
        "each[3]": "ValueError: bad item 4",
        "lone": "RuntimeError: lone broke",
    }


def test_a_mapped_tasks_failure_notice_names_its_failed_instances_and_errors(
    tmp_path: Path, http_receiver: HttpReceiver
) -> None:
    _mapped_run(tmp_path, http_receiver, "--json")
    [notice] = [
        r.json for r in http_receiver.matching() if r.json["title"].endswith("each failure")
    ]
    text = notice["message"]
    assert "each[1]: ValueError: bad item 2" in text, text
    assert "each[3]: ValueError: bad item 4" in text, text
