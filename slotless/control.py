"""``slotless clear | mark | cancel | retry | resume``: an operator's actions on a run, from
the shell.

Each command is one call of the store's run control (:mod:`executor.store.control`), the
same the web page makes; it prints one line saying what changed (or one JSON object with
``--json``). A refused operation (an unknown run or task, a RUNNING task without
``--force``, a run that has ended, a bad ``--output``) is one error line and exit status
2, with nothing changed. Who did it is ``cli:$USER``, kept in each task's log.
"""

from __future__ import annotations

import argparse
import getpass
import json
from typing import Any

from executor.store import open_store
from executor.store.control import ControlError, Done

from .options import db_opt


def add_commands(sub: Any) -> None:
    """The four commands, on the ``slotless`` parser's subparsers."""
    clear = sub.add_parser("clear", help="run tasks of a run again (back to PENDING)")
    clear.add_argument("run_id", metavar="RUN")
    clear.add_argument("tasks", nargs="*", metavar="TASK", help="default: every task")
    clear.add_argument("--downstream", action="store_true", help="and every task after them")
    clear.add_argument("--upstream", action="store_true", help="and every task before them")
    clear.add_argument("--failed-only", action="store_true", help="only FAILED/UPSTREAM_FAILED")
    clear.add_argument(
        "--force", action="store_true", help="take back a RUNNING attempt (its result is lost)"
    )
    mark = sub.add_parser("mark", help="set a task's outcome by hand; its downstream proceeds")
    mark.add_argument("run_id", metavar="RUN")
    mark.add_argument("task_id", metavar="TASK")
    mark.add_argument("outcome", choices=["success", "failed", "skipped"])
    mark.add_argument("--output", metavar="JSON", help="the task's output (with success)")
    mark.add_argument("--downstream", action="store_true", help="and every task after it")
    cancel = sub.add_parser("cancel", help="end a run CANCELLED: nothing more of it runs")
    cancel.add_argument("run_id", metavar="RUN")
    retry = sub.add_parser("retry", help="clear every FAILED and UPSTREAM_FAILED task of a run")
    retry.add_argument("run_id", metavar="RUN")
    resume = sub.add_parser(
        "resume", help="go on with a run PAUSED by on_task_failure=pause (its failed tasks rerun)"
    )
    resume.add_argument("run_id", metavar="RUN")
    resume.add_argument(
        "--no-retry",
        action="store_true",
        help="keep the failures: they reach their children by trigger rule, as with continue",
    )
    commands = (("clear", clear), ("mark", mark), ("cancel", cancel), ("retry", retry),
                ("resume", resume))  # fmt: skip
    for name, sp in commands:
        sp.add_argument("--reason", default="", metavar="TEXT", help="kept in the tasks' logs")
        sp.add_argument("--json", action="store_true", help="print one JSON object")
        db_opt(sp)
        sp.set_defaults(func=control_command, control=name)


async def control_command(args: argparse.Namespace) -> int:
    action = args.control
    output = None
    if action == "mark" and args.output is not None:
        try:
            output = json.loads(args.output)
        except ValueError as exc:
            raise ControlError(f"--output is not JSON: {exc}") from None
    who = f"cli:{getpass.getuser()}"
    store = await open_store(args.db, create=False)
    try:
        done: Done
        if action == "clear":
            done = await store.runs.clear(
                args.run_id, args.tasks, downstream=args.downstream, upstream=args.upstream,
                failed_only=args.failed_only, force=args.force, who=who, reason=args.reason,
            )  # fmt: skip
        elif action == "mark":
            done = await store.runs.mark(
                args.run_id, args.task_id, args.outcome, output=output,
                downstream=args.downstream, who=who, reason=args.reason,
            )  # fmt: skip
        elif action == "cancel":
            done = await store.runs.cancel(args.run_id, who=who, reason=args.reason)
        elif action == "resume":
            done = await store.runs.resume(
                args.run_id, retry_failed=not args.no_retry, who=who, reason=args.reason
            )
        else:
            done = await store.runs.retry(args.run_id, who=who, reason=args.reason)
    finally:
        await store.close()
    if args.json:
        print(json.dumps({"run_id": done.run_id, "run_state": done.run_state, "tasks": done.tasks}))
    else:
        what = {"clear": "cleared", "mark": f"marked {getattr(args, 'outcome', '')}",
                "cancel": "cancelled", "retry": "cleared",
                "resume": "resumed; cleared"}[action]  # fmt: skip
        tasks = ", ".join(done.tasks) if done.tasks else "no task"
        print(f"{done.run_id}: {what} {tasks}; the run is {done.run_state}")
    return 0
