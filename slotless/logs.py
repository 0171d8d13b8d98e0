"""``slotless logs RUN TASK``: a task's log, oldest first: transitions, log lines, errors."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

from executor.store import open_store
from executor.store.viewrows import EventRow

from .options import db_opt


def add_commands(sub: Any) -> None:
    logs = sub.add_parser("logs", help="a task's log: transitions, log lines, errors")
    logs.add_argument("run_id")
    logs.add_argument("task_id", help="TASK or TASK[INDEX] for one instance of a mapped task")
    db_opt(logs)
    logs.set_defaults(func=cmd_logs)


async def cmd_logs(args: argparse.Namespace) -> int:
    task_id, map_index = args.task_id, -1
    if task_id.endswith("]") and "[" in task_id:
        task_id, _, idx = task_id[:-1].partition("[")
        map_index = int(idx)
    store = await open_store(args.db, create=False)
    try:
        # A run id mistyped and a task id mistyped are different mistakes: say which.
        run = await store.views.run_info(args.run_id)
        events = await store.views.task_log(args.run_id, task_id, map_index) if run else None
    finally:
        await store.close()
    if run is None:
        print(f"slotless: error: no run {args.run_id!r} in this database", file=sys.stderr)
        return 2
    if events is None:
        print(f"slotless: error: no task {args.task_id!r} in run {args.run_id!r}", file=sys.stderr)
        return 2
    for e in EventRow.all(events):
        print(entry_line(e))
    return 0


def entry_line(e: EventRow) -> str:
    """One entry of a task's log as `slotless logs` prints it (and the page's download)."""
    ts = datetime.fromtimestamp(e.ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    line = e.message
    if e.kind == "transition":
        line = f"{e.from_state} -> {e.to_state}: {e.message}"
    return f"{ts} [attempt {e.attempt}] {e.kind:<10} {line}"
