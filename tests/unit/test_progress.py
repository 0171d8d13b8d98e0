"""`slotless run`'s live view, rendered from the store's rows of a real run: a deferred
sensor and a reschedule-mode one waiting for their files, instances of a mapped task
retrying with their cause, the mapped task's bar, tasks by state, the time elapsed."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from datetime import datetime
from pathlib import Path

from rich.console import Console
from support.helpers import write_dag

from executor.loader import load_dag
from executor.store import Store
from executor.store.inspecting import RunProgress
from executor.worker import Worker
from slotless.progress import render

DAG_SOURCE = """
from executor import DAG
from triggers.files import FileTrigger

INBOX = {inbox!r}

dag = DAG("progress")


@dag.task
def extract(ctx):
    return [0, 1, 2, 3]


@dag.task(expand=extract, retries=2, retry_delay="1h")
def shard(ctx):
    if ctx.item % 2:
        raise RuntimeError(f"item {{ctx.item}} is odd\\nsecond line")
    return ctx.item


wait_for_file = dag.sensor(
    "wait_for_file",
    FileTrigger(path=INBOX + "/ready.flag", poke_interval=0.2),
    mode="deferrable",
    timeout="1h",
)
poll_marker = dag.sensor(
    "poll_marker",
    FileTrigger(path=INBOX + "/marker", poke_interval=30),
    mode="reschedule",
    timeout="1h",
)


@dag.task(parents=[shard, wait_for_file, poll_marker])
def load(ctx):
    return 1
"""

SETTLED = {
    ("extract", -1): "SUCCESS",
    ("shard", 0): "SUCCESS",
    ("shard", 1): "RETRYING",
    ("shard", 2): "SUCCESS",
    ("shard", 3): "RETRYING",
    ("wait_for_file", -1): "DEFERRED",
    ("poll_marker", -1): "SENSING",
}


def text_of(progress: RunProgress, *, styles: bool = False) -> list[str]:
    # Wide enough for the waits' file URLs under any pytest temporary directory (a parallel
    # worker's is longer): what is cut to fit a narrow terminal is not what these check.
    console = Console(record=True, width=300, force_terminal=True, color_system="standard")
    console.print(render(progress))
    return [line.rstrip() for line in console.export_text(styles=styles).splitlines()]


async def settled_run(store: Store, tmp_path: Path) -> tuple[str, Path]:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    path = write_dag(tmp_path, DAG_SOURCE.format(inbox=str(inbox)))
    dag = load_dag(str(path), None)
    run_id = await store.runs.create_run(dag, datetime(2026, 4, 25).date(), dag_file=str(path))
    worker = Worker(store, dags={dag.dag_id: dag}, poll_interval=0.02, slots=4)

    async def settled() -> bool:
        states = {
            (t["task_id"], t["map_index"]): t["state"] for t in await _instances(store, run_id)
        }
        return all(states.get(k) == v for k, v in SETTLED.items())

    await asyncio.wait_for(worker.run(until=settled), 15)
    return run_id, inbox


async def _instances(store: Store, run_id: str) -> list:
    async with store.db.read() as tx:
        tasks = await tx.fetch("run_tasks", run_id=run_id)
        shard = await tx.fetch("ops_task_instances", run_id=run_id, task_id="shard", n=10)
    return [*tasks, *({**dict(r), "task_id": "shard"} for r in shard)]


async def test_the_view_shows_states_bars_waits_and_retries(store: Store, tmp_path: Path) -> None:
    run_id, inbox = await settled_run(store, tmp_path)
    read = await store.views.run_progress(run_id)
    assert read is not None
    start = read.run.created_at
    progress = dataclasses.replace(read, now=start + 30)
    lines = text_of(progress)

    assert lines[0] == f"{run_id} RUNNING  elapsed 30 s"
    assert re.fullmatch(
        r"tasks +[━╺╸]+ 3/8 deferred=1  pending=1  retrying=2  sensing=1  success=3", lines[1]
    ), lines[1]
    assert re.fullmatch(r"shard +[━╺╸]+ 2/4", lines[2]), lines[2]  # 2 of 4 instances ended

    waits = {r.task_id: r for r in read.waits}
    assert lines[3] == "waiting (2)"
    for line, task, waits_for in (
        (lines[4], "wait_for_file", f"file://{inbox}/ready.flag"),
        (lines[5], "poll_marker", f"file://{inbox}/marker"),
    ):
        since = waits[task].wait_started_at
        assert since is not None
        clock = datetime.fromtimestamp(since).strftime("%H:%M:%S")
        state = waits[task].state
        assert re.fullmatch(
            rf"{task} +{state} +{re.escape(waits_for)} +since {clock} \(\d\d s\)", line
        ), line

    assert lines[6] == "retrying (2)"
    for line, index in ((lines[7], 1), (lines[8], 3)):
        assert re.fullmatch(
            rf"shard\[{index}\] +attempt 2 of 3 in (\d h )?\d+ min( \d+ s)?"  # jittered
            rf" +RuntimeError: item {index} is odd second line",
            line,
        ), line
    assert len(lines) == 9

    # Coloured as `slotless status` colours states: DEFERRED magenta, RETRYING bold yellow.
    styled = "\n".join(text_of(progress, styles=True))
    assert "\x1b[35mdeferred=1" in styled
    assert "\x1b[1;33mshard[1]" in styled
    assert "\x1b[32m━" in styled  # the bars: green while nothing failed


async def test_a_mapped_task_not_expanded_and_a_long_list_cut(store: Store, tmp_path: Path) -> None:
    run_id, _ = await settled_run(store, tmp_path)
    cut = await store.views.run_progress(run_id, n=1)
    assert cut is not None
    lines = text_of(cut)
    assert "waiting (2, the first 1 shown)" in lines
    assert "retrying (2, the first 1 shown)" in lines
    assert [line.split()[0] for line in lines[4:7]] == ["wait_for_file", "retrying", "shard[1]"]

    dag = load_dag(str(tmp_path / "dag_file.py"), None)
    fresh = await store.runs.create_run(dag, datetime(2026, 4, 26).date())
    before = await store.views.run_progress(fresh)
    assert before is not None
    lines = text_of(dataclasses.replace(before, now=before.run.created_at + 2.5))
    assert lines[0] == f"{fresh} RUNNING  elapsed 2.5 s"
    assert re.fullmatch(r"tasks +[━╺╸]+ 0/5 pending=5", lines[1]), lines[1]
    assert lines[2] == "shard maps over extract"
    assert len(lines) == 3
