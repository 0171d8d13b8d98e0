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

from pathlib import Path

import pytest
from support.helpers import cli, write_dag

pytestmark = pytest.mark.slow


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
