"""``slotless run FILE``: one DAG file run once, in this process, until it ends.

The process is a worker and a triggerer of its own on the run's database; the live view
(:mod:`.progress`) goes to a terminal's stderr, ``--json`` prints one object at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from executor.loader import load_dag
from executor.pools import DEFAULT as DEFAULT_QUEUE
from executor.rows import TaskRow
from executor.states import RUN_TERMINAL, RunState
from executor.store import Store
from executor.store.viewrows import RunRow
from executor.worker import Worker

from .opening import open_writable
from .options import db_opt, isolation_opt, logical_date, slots
from .status import failure_cause
from .views import task_name

out = Console()
err = Console(stderr=True)


def add_commands(sub: Any) -> None:
    run = sub.add_parser("run", help="run a DAG file once, in this process, until it ends")
    run.add_argument("file")
    db_opt(run)
    run.add_argument("--dag", help="the DAG id, if the file defines several")
    run.add_argument("--slots", type=slots, default=8)
    isolation_opt(run)
    run.add_argument(
        "--logical-date", type=logical_date, default=None, help="YYYY-MM-DD (default today)"
    )
    run.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    run.set_defaults(func=cmd_run)


async def cmd_run(args: argparse.Namespace) -> int:
    dag = load_dag(args.file, args.dag)
    dag.validate()
    store = await open_writable(args.db)
    try:
        run_id = await store.runs.create_run(
            dag, args.logical_date or date.today(), dag_file=str(Path(args.file).resolve())
        )
        from triggerer.service import Triggerer

        triggerer = Triggerer(store.views)
        worker = Worker(
            store,
            slots=args.slots,
            isolation=args.isolation,
            dags={dag.dag_id: dag},
            poll_interval=0.05,
            on_defer=triggerer.poke,
            # This process runs the whole DAG: every queue it names.
            queues=sorted({DEFAULT_QUEUE} | {t.queue for t in dag.tasks.values()}),
        )
        ended = asyncio.Event()
        view = None
        if not args.json and err.is_terminal:
            from .progress import follow

            # The live view goes to the terminal; a piped stdout keeps what tasks print.
            view = asyncio.create_task(
                follow(store, run_id, err, ended, redirect_stdout=out.is_terminal)
            )
        sidecar = asyncio.create_task(triggerer.run())
        try:
            await asyncio.gather(worker.run(), _watch(store, run_id, worker))
        finally:
            ended.set()
            if view is not None:
                await view
            triggerer.stop()
            await sidecar
        found = await store.views.run_info(run_id)
        assert found is not None
        info = RunRow.of(found)
        tasks = TaskRow.all(await store.views.run_tasks(run_id))
        failed = {
            task_name(r["task_id"], r["map_index"]): failure_cause(r["error"])
            for r in await store.views.failed_tasks(run_id, FAILED_KEPT)
        }
        if args.json:
            print(
                json.dumps(
                    {
                        "dag_id": dag.dag_id,
                        "run_id": run_id,
                        "state": info.state,
                        "tasks": {t.task_id: t.state for t in tasks},
                        "failed": failed,
                    }
                )
            )
        else:
            _summary(run_id, info, tasks, await store.views.mapped_counts(run_id))
            _failures(info, failed)
            if info.state == RunState.PAUSED:
                print(f"{info.state_reason}\ngo on with: slotless resume {run_id}")
        # A task that failed fails the command, although an all_done (or similar) leaf may
        # have let the run succeed: the run's state follows its leaves, as in Airflow, but
        # whoever runs a file by hand or in CI wants to hear of any failure.
        return 0 if info.state == RunState.SUCCESS and not failed else 1
    finally:
        await store.close()


async def _watch(store: Store, run_id: str, worker: Worker) -> None:
    """Stop the worker once the run has ended (or paused: on_task_failure="pause", it waits
    for a person) and its callbacks and notifications were delivered or given up (they are
    retried with backoff: docs/dag-patterns.md); what it holds is finished first."""
    settled = asyncio.Event()
    chained = worker.on_exchange

    def on_exchange(recorded: list[Any], claimed: list[Any]) -> None:
        if chained is not None:
            chained(recorded, claimed)
        # Outcomes recorded and nothing new to run: the run may have ended in that
        # transaction. Look now: waiting for the next poll was a tenth of a second at the
        # end of every run (an eighth of a 1,000-task chain's time).
        if recorded and not claimed:
            settled.set()

    worker.on_exchange = on_exchange
    while True:
        settled.clear()  # before the read: an exchange that ends the run meanwhile wakes us
        info = await store.views.run_info(run_id)
        if info is None or info["state"] in RUN_TERMINAL or info["state"] == RunState.PAUSED:
            callbacks = await store.callbacks.run_callbacks(run_id)
            if all(c["state"] in ("DONE", "FAILED") for c in callbacks):
                worker.stop()
                return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.25):
                await settled.wait()


FAILED_KEPT = 1000  # failed tasks read for the summary and --json, at most
FAILED_SHOWN = 20  # of them printed under the table


def _failures(info: RunRow, failed: dict[str, str]) -> None:
    """Each failed task's error under the table, and why the exit code is 1 if the run
    itself succeeded."""
    if not failed:
        return
    more = len(failed) - FAILED_SHOWN
    count = f"{len(failed)}{'+' if len(failed) >= FAILED_KEPT else ''}"
    out.print(f"{count} task(s) failed:", style="bold red", highlight=False)
    for name, error in list(failed.items())[:FAILED_SHOWN]:
        out.print(f"  {name}: {error}", markup=False, highlight=False, soft_wrap=True)
    if more > 0:
        out.print(f"  ... and {more} more (slotless logs RUN TASK[INDEX] for each)")
    if info.state == RunState.SUCCESS:
        out.print(
            "the run succeeded (its leaves decide its state, as in Airflow), but a task "
            "failed: exit code 1",
            highlight=False,
            soft_wrap=True,
        )


def _summary(
    run_id: str, info: RunRow, tasks: list[TaskRow], mapped: dict[str, dict[str, int]]
) -> None:
    table = Table(title=f"{run_id}: {info.state}")
    for col in ("task", "state", "attempts", "duration"):
        table.add_column(col)
    for t in tasks:
        state = t.state
        if t.task_id in mapped:
            state += (
                " ("
                + ", ".join(f"{n} {s.lower()}" for s, n in sorted(mapped[t.task_id].items()))
                + ")"
            )
        dur = ""
        if t.started_at and t.ended_at:
            dur = f"{t.ended_at - t.started_at:.2f} s"
        table.add_row(t.task_id, state, str(t.attempt), dur)
    out.print(table)
