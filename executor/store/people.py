"""People in the loop: a person's answer settles their wait in the answer's own transaction.

A wait for a person (``triggers/people.py``: Approval, Choice, Form, BranchChoice) is a
DEFERRED task on a trigger row keyed ``person:<task row>``: no triggerer loads it, no event
matches it, nothing polls it, and it holds no worker slot. Whoever writes the answer
(``slotless respond``, ``POST /api/v1/runs/{run}/tasks/{task}/response``, the web page's
form: all three call :meth:`Answers.respond`) does, in one transaction:

1. reads the task and its request; checks the respondent may answer and the answer fits
   the request (:class:`~triggers.people.AnswerError` naming the field: nothing written);
2. locks the row (``deferred_rows``, FOR UPDATE on PostgreSQL; SQLite's write lock) and
   checks it is still DEFERRED on that very trigger: the first valid answer wins by
   compare-and-set, a later one finds it answered and is told when (by whom only if it
   was its own answer or it lost a race as a respondent);
3. moves it through the state machine (SUCCESS with the answer as output, or FAILED for a
   rejection with ``fail_on_reject``), writes "answered by NAME" in the task's log, and
   SKIPs the children that must not run (a rejection: all; a branch choice: those not
   chosen) the way a branch does.

The timeout stays the triggerer's, like every wait's: its sweep calls
:func:`answer_by_default` for a person's wait, which takes the request's default answer if
it has one (else the wait fails as any sensor's does).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from triggers.limits import JsonLimitError, check_json_value, storable_text
from triggers.people import NEEDS_ANSWER, Answer, AnswerError, PersonWait
from triggers.registry import TriggerLoadError, load_trigger

from .. import notifications
from ..carried import Output, Resume
from ..driver.db import Row, Tx
from ..statemachine import transition
from ..states import State
from .part import Part

PERSON_KEY = "person:"  # trigger.event_key prefix of a person's wait
UI_URL_ENV = "SLOTLESS_UI_URL"  # the page's address, for the link in a notification
# Where `slotless ui` serves by default (its --host and --port): the link when nobody said
# otherwise. `slotless up` sets UI_URL_ENV for its worker and triggerer from its own.
DEFAULT_UI_URL = "http://127.0.0.1:8765"


class RespondError(Exception):
    """An answer refused; ``status`` is the HTTP status it maps to, ``field`` what it is
    about. Nothing was written."""

    status = 400

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class UnknownTask(RespondError):
    status = 404


class NotAllowed(RespondError):
    status = 403


class NotWaiting(RespondError):
    """The task is not waiting for a person (never was, or was answered: ``answered``)."""

    status = 409


@dataclass(frozen=True, slots=True)
class Responded:
    task_row: int
    run_id: str
    task_id: str
    state: str  # what the task became
    output: dict[str, Any]
    skipped: list[str]


@dataclass(frozen=True, slots=True)
class Request:
    """A pending request, as the "Needs you" list shows it."""

    task_row: int
    run_id: str
    task_id: str
    map_index: int
    dag_id: str
    logical_date: str
    waiting_since: float | None
    gives_up_at: float | None
    wait: PersonWait


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def link(task_row: int) -> str:
    """Where a respondent answers: the page's "Needs you" list, at this request."""
    base = os.environ.get(UI_URL_ENV, DEFAULT_UI_URL).rstrip("/")
    return f"{base}/needs-you#task-{task_row}"


def _wait_of(row: Row) -> PersonWait | None:
    if not (row["event_key"] or "").startswith(PERSON_KEY):
        return None
    try:
        wait = load_trigger(row["classpath"], row["kwargs"])
    except TriggerLoadError:
        return None
    return wait if isinstance(wait, PersonWait) else None


def _respondents(row: Row, wait: PersonWait | None) -> list[str] | None:
    """Who may answer the task's request (empty: anyone): the request waiting, or the
    respondents kept when it was answered; None when neither is known (a task that never
    waited for a person, or answered before they were kept)."""
    if wait is not None:
        return list(wait.respondents)
    kept = row["answered_respondents"]
    if kept is None:
        return None
    names = json.loads(kept)
    return [str(n) for n in names] if isinstance(names, list) else None


def _answer_of(row: Row) -> dict[str, Any] | None:
    """The task's output if it is a person's answer (it says by whom and when)."""
    try:
        out = json.loads(row["output"]) if row["output"] else None
    except ValueError:
        return None
    if isinstance(out, dict) and "by" in out and isinstance(out.get("at"), int | float):
        return out
    return None


def _answered(row: Row, asking: str, *, named: bool = False) -> str | None:
    """ "already answered (by NAME) at TIME" if the task's output is a person's answer. The
    name is said to a caller known to be a respondent (``named``), to the one who gave it,
    or when it is the default answer."""
    out = _answer_of(row)
    if out is not None:
        told = named or out["by"] == asking or out.get("default")
        by = f" by {out['by']}" if told else ""
        return f"already answered{by} at {when(out['at'])}"
    return None


def _check_json(answer: Any) -> None:
    """The same bound on an answer's values as on an event's payload (depth, valid text,
    finite numbers): an answer becomes the task's output, which every reader serves."""
    if not isinstance(answer, dict):
        return  # check_answer refuses it, naming the body
    for key, value in answer.items():
        try:
            check_json_value(value, str(key)[:60])
        except JsonLimitError as exc:
            raise AnswerError(str(exc), exc.field) from None


class Answers(Part):
    """People in the loop: their answers to waits, and what waits for them."""

    async def respond(
        self, run_id: str, task_id: str, answer: Any, *, who: str, map_index: int = -1
    ) -> Responded:
        """Answer the person's wait of ``task_id`` in ``run_id`` as ``who``; the first valid
        answer wins. Raises :class:`RespondError` (UnknownTask, NotAllowed, NotWaiting:
        "already answered at TIME") or :class:`AnswerError`; nothing is written then.

        >>> await answers.respond(run, "sign_off", {"approve": True}, who="alice")  # doctest: +SKIP
        """
        _check_json(answer)
        if not storable_text(run_id):
            raise UnknownTask(f"no run {run_id[:200]!r}", "run_id")
        if not storable_text(task_id):
            raise UnknownTask(f"run {run_id} has no task {task_id[:200]!r}", "task_id")
        now = self.clock()
        async with self.db.write() as tx:
            row = await tx.fetchone(
                "person_task", run_id=run_id, task_id=task_id, map_index=map_index
            )
            if row is None:
                if await tx.fetchone("run_info", run_id=run_id) is None:
                    raise UnknownTask(f"no run {run_id!r}", "run_id")
                raise UnknownTask(f"run {run_id} has no task {task_id!r}", "task_id")
            wait = _wait_of(row)
            # Who may answer is checked before what state the task is in: a stranger
            # learns nothing of the request's fate. Once answered, its request is gone
            # (the trigger row with it), and who could answer it was kept instead.
            respondents = _respondents(row, wait)
            if respondents and who not in respondents:
                raise NotAllowed(
                    f"{who!r} may not answer this request (respondents: {', '.join(respondents)})",
                    "respondent",
                )
            if row["state"] != State.DEFERRED.value or wait is None:
                done = _answered(row, who, named=respondents is not None)
                raise NotWaiting(
                    done or f"task {task_id} is not waiting for a person (it is {row['state']})",
                    "task_id",
                )
            checked = wait.check_answer(answer)  # AnswerError: nothing written
            # The compare-and-set: locked, still DEFERRED on this very trigger.
            locked = [r for r in await tx.fetch("deferred_rows", ids=[row["id"]])
                      if r["trigger_id"] == row["trigger_id"]]  # fmt: skip
            if not locked:
                again = await tx.fetchone(
                    "person_task", run_id=run_id, task_id=task_id, map_index=map_index
                )
                # ``who`` passed may_answer above: a respondent is told who won.
                raise NotWaiting(
                    (again and _answered(again, who, named=True))
                    or f"task {task_id} is no longer waiting",
                    "task_id",
                )
            return await settle_answer(
                tx, row, wait, checked, who=who, now=now,
                resume=locked[0]["next_method"] is not None,
            )  # fmt: skip

    async def person_request(
        self, run_id: str, task_id: str, map_index: int = -1
    ) -> PersonWait | None:
        """What the task waits for if it is waiting for a person (else None)."""
        async with self.db.read() as tx:
            row = await tx.fetchone(
                "person_task", run_id=run_id, task_id=task_id, map_index=map_index
            )
        if row is None or row["state"] != State.DEFERRED.value:
            return None
        return _wait_of(row)

    async def needs_you(self, limit: int = 200) -> tuple[int, list[Request]]:
        """How many requests wait for a person, and the oldest ``limit`` of them."""
        async with self.db.snapshot() as tx:  # the count and the list at one moment
            count = await tx.fetchone("needs_you_count")
            rows = await tx.fetch("needs_you", limit=limit)
        out = []
        for r in rows:
            wait = _wait_of({**dict(r), "event_key": PERSON_KEY})
            if wait is None:
                continue
            out.append(
                Request(
                    r["id"], r["run_id"], r["task_id"], r["map_index"], r["dag_id"],
                    r["logical_date"], r["wait_started_at"], r["wait_timeout_at"], wait,
                )
            )  # fmt: skip
        return (int(count["n"]) if count else 0), out


async def settle_answer(
    tx: Tx, row: Row, wait: PersonWait, answer: Answer, *, who: str, now: float,
    default: bool = False, resume: bool = False,
) -> Responded:  # fmt: skip
    """Move the locked, still-waiting task ``row`` on with ``answer``, in ``tx``: a sensor
    ends (SUCCESS, or FAILED for a rejection with ``fail_on_reject``); a task that deferred
    with a method (``resume``) goes back to PENDING with the answer as its event, and
    decides itself what a rejection means."""
    output = answer.output(who, now, default=default)
    text = json.dumps(output, separators=(",", ":"))
    await tx.execute(
        "keep_respondents", task_row=row["id"], trigger_id=row["trigger_id"],
        respondents=json.dumps(list(wait.respondents)),
    )  # fmt: skip
    how = _say(answer)
    whose = "the default answer (timeout)" if default else f"answered by {who}"
    message = f"{whose} at {when(now)}: {how}" + (
        f"; comment: {answer.comment}" if answer.comment else ""
    )
    if resume:
        moved = await transition(
            tx, [row["id"]], State.DEFERRED, State.PENDING, now=now, message=message,
            ready_at=now, carry=Resume(text),
        )  # fmt: skip
        if not moved:
            raise NotWaiting(f"task {row['task_id']} is no longer waiting", "task_id")
        await tx.execute("delete_triggers", ids=[row["trigger_id"]])
        return Responded(row["id"], row["run_id"], row["task_id"], "PENDING", output, [])
    failed = answer.rejected and getattr(wait, "fail_on_reject", False)
    new = State.FAILED if failed else State.SUCCESS
    moved = await transition(
        tx, [row["id"]], State.DEFERRED, new, now=now, message=message,
        carry=Output(text),
    )  # fmt: skip
    if not moved:  # lost the compare-and-set after all: the caller's lock says it cannot
        raise NotWaiting(f"task {row['task_id']} is no longer waiting", "task_id")
    await tx.execute("delete_triggers", ids=[row["trigger_id"]])
    skipped: list[str] = []
    if not failed and (answer.rejected or answer.skip):
        rows = await tx.fetch("task_children", run_id=row["run_id"], parent=row["task_id"])
        children = [r["child"] for r in rows]
        # A rejection skips every child; a branch choice the children not chosen (an
        # option naming a task that is not a child touches nothing).
        skipped = children if answer.rejected else [c for c in children if c in (answer.skip or [])]
        if skipped:
            ids = await tx.fetch("ids_by_task_id", run_id=row["run_id"], task_ids=skipped)
            why = (f"rejected by {who}" if answer.rejected
                   else f"branch not taken ({who} chose {answer.value})")  # fmt: skip
            await transition(
                tx, [r["id"] for r in ids], State.PENDING, State.SKIPPED, now=now, message=why
            )
    return Responded(row["id"], row["run_id"], row["task_id"], new.value, output, skipped)


def _say(answer: Answer) -> str:
    if answer.kind == "approval":
        return "approved" if answer.value else "rejected"
    if answer.kind == "form":
        return "form " + json.dumps(answer.value, sort_keys=True)
    return f"chose {answer.value}"


async def answer_by_default(tx: Tx, ids: list[int], now: float) -> set[int]:
    """The triggerer's timeout sweep: of these expired waits, end the persons' waits that
    have a default answer with it (the rest time out as any wait). Returns those ended."""
    ended: set[int] = set()
    if not ids:
        return ended
    for r in await tx.fetch("person_waits_of", ids=ids):
        wait = _wait_of({**dict(r), "event_key": PERSON_KEY})
        if wait is None or wait.default is None:
            continue
        try:
            answer = wait.check_answer(wait.default)
        except AnswerError:
            continue  # a rendered default that no longer fits: time out instead
        locked = [x for x in await tx.fetch("deferred_rows", ids=[r["id"]])
                  if x["trigger_id"] == r["trigger_id"]]  # fmt: skip
        if not locked:
            continue
        full = await tx.fetchone(
            "person_task", run_id=r["run_id"], task_id=r["task_id"], map_index=-1
        )
        if full is None:
            continue
        await settle_answer(
            tx, full, wait, answer, who="default", now=now, default=True,
            resume=locked[0]["next_method"] is not None,
        )  # fmt: skip
        ended.add(r["id"])
    return ended


async def request_made(tx: Tx, run_id: str, task_row: int, wait: PersonWait, now: float) -> None:
    """A person's wait has begun: tell its ``notify=`` URLs (a callback row, sent by a
    worker after the commit, like every notification)."""
    if not wait.notify:
        return
    await notifications.record(
        tx,
        NEEDS_ANSWER,
        run_id=run_id,
        task_row=task_row,
        now=now,
        message=wait.subject,
        context={
            "needs": wait.kind,
            "subject": wait.subject,
            "respondents": ", ".join(wait.respondents) or "anyone with a token",
            "answer at": link(task_row),
        },
        key=f"{NEEDS_ANSWER}:{task_row}:{now}",
    )


__all__ = [
    "PERSON_KEY",
    "Answers",
    "NotAllowed",
    "NotWaiting",
    "Request",
    "RespondError",
    "Responded",
    "UnknownTask",
    "answer_by_default",
    "link",
    "request_made",
    "settle_answer",
]
