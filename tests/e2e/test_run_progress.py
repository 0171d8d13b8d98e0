"""`slotless run` on a terminal shows the run live (under a real pseudo-terminal: a sensor
waits for a file the test creates once the view names it, then the summary replaces the
view); piped, it prints what it always printed: the summary table on stdout, nothing else."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from datetime import date
from pathlib import Path

import pytest
from support.helpers import REPO, cli, cli_env, sql, wait_until, write_dag

pytestmark = pytest.mark.slow

SENSOR_DAG = """
from executor import DAG
from triggers.files import FileTrigger

dag = DAG("live")


@dag.task
def extract(ctx):
    return [1, 2, 3]


@dag.task(expand=extract)
def shard(ctx):
    return ctx.item


wait_for_file = dag.sensor(
    "wait_for_file",
    FileTrigger(path={flag!r}, poke_interval=0.1),
    mode="deferrable",
    timeout="1h",
)


@dag.task(parents=[shard, wait_for_file])
def load(ctx):
    return 1
"""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


class Terminal:
    """A process on a pseudo-terminal 200 columns wide; what it wrote, escapes removed."""

    def __init__(self, *args: str) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        env = cli_env(TERM="xterm-256color", COLUMNS="200", LINES="50")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "slotless", *args],
            cwd=REPO,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
        )
        os.close(slave)
        self.master = master
        self.raw = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the process closed the terminal
                return
            if not chunk:
                return
            self.raw += chunk

    def text(self) -> str:
        return ANSI.sub("", bytes(self.raw).decode("utf-8", "replace"))

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        self.reader.join(5)
        os.close(self.master)
        return code


def test_the_live_view_names_the_waited_file_then_the_summary_replaces_it(
    tmp_path: Path, db_url: str
) -> None:
    flag = tmp_path / "inbox" / "ready.flag"
    flag.parent.mkdir()
    dag_file = write_dag(tmp_path, SENSOR_DAG.format(flag=str(flag)))
    term = Terminal("run", str(dag_file), "--db", db_url)
    try:
        wait_until(
            lambda: f"file://{flag}" in term.text() or term.proc.poll() is not None,
            timeout=15,
            what="the live view to name the file the sensor waits for",
        )
        seen = term.text()
        assert f"file://{flag}" in seen, seen
        assert re.search(r"wait_for_file +DEFERRED +file://\S+ +since \d\d:\d\d:\d\d \(", seen)
        assert re.search(r"shard +[━╺╸]+ 3/3", seen), seen  # the mapped task's bar
        assert re.search(r"elapsed \d", seen), seen
        flag.touch()
    finally:
        code = term.finish(timeout=15)
    text = term.text()
    assert code == 0, text
    summary = text.rindex(": SUCCESS")  # the summary table's title
    assert text.rindex(f"file://{flag}") < summary
    assert re.search(r"│ wait_for_file +│ SUCCESS +│ 1 +│", text[summary:]), text[summary:]
    assert re.search(r"│ shard +│ SUCCESS \(3 success\) +│", text[summary:]), text[summary:]


GOOD = """
from executor import DAG

dag = DAG("good")


@dag.task
def extract(ctx):
    return [1, 2, 3]


@dag.task(expand=extract)
def shard(ctx):
    return ctx.item


@dag.task(parents=[shard])
def load(ctx):
    print("hello from load")
    return 1
"""

# What `slotless run` printed on a pipe before the live view, byte for byte (run id and
# durations filled in from the store).
PIPED = """\
hello from load
            {run_id}: SUCCESS            
┏━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┓
┃ task    ┃ state               ┃ attempts ┃ duration ┃
┡━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━┩
│ extract │ SUCCESS             │ 1        │ {extract:<8} │
│ shard   │ SUCCESS (3 success) │ 1        │ {shard:<8} │
│ load    │ SUCCESS             │ 1        │ {load:<8} │
└─────────┴─────────────────────┴──────────┴──────────┘
"""  # noqa: W291 - the title is centred with spaces


def test_piped_output_is_unchanged(tmp_path: Path, db_path: Path, db_url: str) -> None:
    dag_file = write_dag(tmp_path, GOOD)
    day = date.today().isoformat()
    started = time.monotonic()
    proc = cli("run", str(dag_file), "--db", db_url, "--logical-date", day, timeout=20)
    assert time.monotonic() - started < 20
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    rows = sql(db_path, "SELECT * FROM task WHERE map_index = -1")
    took = {r["task_id"]: f"{r['ended_at'] - r['started_at']:.2f} s" for r in rows}
    (run,) = sql(db_path, "SELECT run_id FROM dag_run")
    assert proc.stdout == PIPED.format(run_id=run["run_id"], **took)
