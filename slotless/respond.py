"""``slotless respond RUN TASK --approve | --reject | --choose X | --form JSON``.

Answers a person's wait (``triggers/people.py``) from a shell, in the same transaction
that settles it (:meth:`executor.store.people.Answers.respond`), exactly as the API and
the page do. The CLI reaches the database itself, so it is trusted like any process with
the database URL: the respondent is ``--as NAME`` (default: the OS user), checked against
the request's ``respondents``. Every refusal is one line on stderr and exit status 2,
with nothing written: an unknown run or task, a task not waiting for a person, an answer
that does not fit (the field named), a respondent not allowed, an answer already given
("already answered at TIME"; by whom only to the one who answered).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from executor.store import open_store
from executor.store.people import RespondError
from triggers.people import AnswerError

from .options import db_opt


def add_commands(sub: Any) -> None:
    """``respond``, on the ``slotless`` parser's subparsers."""
    p = sub.add_parser("respond", help="answer a task waiting for a person (approve, choose, form)")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("task_id", metavar="TASK")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--approve", action="store_true", help="approve (an Approval)")
    what.add_argument("--reject", action="store_true", help="reject (an Approval)")
    what.add_argument(
        "--choose", action="append", metavar="X",
        help="choose option X (a Choice or BranchChoice; repeat with multiple=True)",
    )  # fmt: skip
    what.add_argument("--form", metavar="JSON", help="a Form's fields as a JSON object")
    p.add_argument("--comment", default="", metavar="TEXT", help="a comment kept with the answer")
    p.add_argument(
        "--as", dest="who", default=None, metavar="NAME",
        help="who answers (default: the OS user); checked against the request's respondents",
    )  # fmt: skip
    p.add_argument("--map-index", type=int, default=-1, help="a mapped instance's index")
    p.add_argument("--json", action="store_true", help="print the recorded answer as JSON")
    db_opt(p)
    p.set_defaults(func=respond_command)


def _answer(args: argparse.Namespace) -> dict[str, Any]:
    answer: dict[str, Any]
    if args.approve or args.reject:
        answer = {"approve": bool(args.approve)}
    elif args.choose:
        answer = {"choose": args.choose[0] if len(args.choose) == 1 else args.choose}
    else:
        try:
            form = json.loads(args.form)
        except ValueError as exc:
            raise AnswerError(f"--form is not JSON: {exc}", "form") from None
        answer = {"form": form}
    if args.comment:
        answer["comment"] = args.comment
    return answer


async def respond_command(args: argparse.Namespace) -> int:
    try:
        answer = _answer(args)
    except AnswerError as exc:
        print(f"slotless: error: {exc}", file=sys.stderr)
        return 2
    who = args.who or getpass.getuser()
    store = await open_store(args.db, create=False)
    try:
        done = await store.answers.respond(
            args.run_id, args.task_id, answer, who=who, map_index=args.map_index
        )
    except (RespondError, AnswerError) as exc:
        print(f"slotless: error: {exc}", file=sys.stderr)
        return 2
    finally:
        await store.close()
    if args.json:
        print(json.dumps({"run_id": done.run_id, "task_id": done.task_id, "state": done.state,
                          "output": done.output, "skipped": done.skipped}))  # fmt: skip
        return 0
    skipped = f"; skipped {', '.join(done.skipped)}" if done.skipped else ""
    print(f"{done.run_id}/{done.task_id}: answered by {who}; {done.state}{skipped}")
    return 0
