"""The "Needs you" page: requests waiting for a person's answer, and the answer's action.

``GET /needs-you`` lists every task waiting for a person (``triggers/people.py``), oldest
first, each with its context (DAG, run, date, how long it has waited, when it gives up,
who may answer, the default) and a form to answer it: Approve / Reject, the options of a
choice, or the fields of a form generated from its pydantic model's JSON schema. Every
form is a POST to ``/actions/respond`` with the session's CSRF token (``app.act`` checks
it, as for every write); the answer is recorded as the session's token name.

Everything a DAG or a respondent wrote is escaped: the subject, the body (a small, safe
markdown: paragraphs, ``- `` lists, ``#`` headings, ``**bold**``, ``*em*``, ```code```,
made from escaped text, so no HTML in it survives), option names, defaults.
"""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any

from markupsafe import Markup

from executor.store.people import Request, RespondError
from triggers.people import AnswerError, Approval, Choice, Form

from .actions import Act, Refused, action
from .auth import Writes
from .numbers import whole_number
from .render import View

FORM_PREFIX = "form."  # a Form's field NAME is posted as form.NAME

_INLINE = [
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"(?<![*\w])\*([^*]+)\*(?!\*)"), r"<em>\1</em>"),
]


def markdown(text: str) -> str:
    """A small markdown, safe by construction: the text is escaped first, then only these
    tags are added around it (no links, no raw HTML)."""
    out: list[str] = []
    items: list[str] = []
    para: list[str] = []

    def inline(s: str) -> str:
        s = escape(s)
        for pattern, repl in _INLINE:
            s = pattern.sub(repl, s)
        return s

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            flush()
        elif stripped.startswith(("- ", "* ")):
            if para:
                flush()
            items.append(stripped[2:])
        elif m := re.match(r"^(#{1,3})\s+(.*)$", stripped):
            flush()
            level = len(m.group(1)) + 2  # the page's own h1/h2 stay above
            out.append(f"<h{level}>{inline(m.group(2))}</h{level}>")
        else:
            if items:
                flush()
            para.append(stripped)
    flush()
    return "".join(out)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _kind_of(wait: object) -> str:
    """Which answer form a request takes (a BranchChoice is a Choice)."""
    if isinstance(wait, Approval):
        return "approval"
    if isinstance(wait, Choice):
        return "choice"
    if isinstance(wait, Form):
        return "form"
    return ""


def needs_you_view(
    count: int, requests: list[Request], w: Writes, now: float, kept: dict[str, str]
) -> View:
    """The list, read in one snapshot (``count`` and ``requests`` agree); ``kept``: what a
    refused answer's form held (its values and the error's field), drawn back into that
    request's form."""
    ctx = {
        "count": count,
        "requests": requests,
        "now": now,
        "form_kept": kept,
        "ago": _ago,
        "kind_of": _kind_of,
        "dumps": json.dumps,
        # Safe by construction: markdown() escapes the text before adding its few tags.
        "markdown": lambda text: Markup(markdown(text)),
    }
    return View("needs_you.html", "needs you", ctx)


# -- the action ------------------------------------------------------------------------


class AnswerRefused(Refused):
    """A refused answer: its message flashed, and the field it is about drawn beside it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@action("respond")
async def respond(a: Act) -> str:
    """Answer a person's wait as the signed-in session's token name."""
    run_id, task_id = a.field("run_id"), a.field("task_id")
    map_index = whole_number(a.field("map_index", "-1"), low=-1)
    if map_index is None:
        raise Refused("map_index must be -1 or a task instance's index")
    answer = await _answer(a, run_id, task_id, map_index)
    comment = a.field("comment", "").strip()
    if comment:
        answer["comment"] = comment
    try:
        done = await a.store.answers.respond(
            run_id, task_id, answer, who=a.who, map_index=map_index
        )
    except RespondError as exc:
        raise AnswerRefused(f"{exc}; nothing was changed", exc.field) from None
    except AnswerError as exc:
        raise AnswerRefused(f"{exc}; nothing was changed", exc.field) from None
    skipped = f"; skipped {', '.join(done.skipped)}" if done.skipped else ""
    return f"{task_id} answered by {a.who}: {done.state}{skipped}"


async def _answer(a: Act, run_id: str, task_id: str, map_index: int) -> dict[str, Any]:
    if "approve" in a.form:
        return {"approve": a.field("approve") == "true"}
    chosen = [v for v in a.form.getall("choose", []) if isinstance(v, str)]
    if chosen:
        return {"choose": chosen if len(chosen) > 1 else chosen[0]}
    texts = {k.removeprefix(FORM_PREFIX): v for k, v in a.form.items()
             if k.startswith(FORM_PREFIX) and isinstance(v, str)}  # fmt: skip
    wait = await a.store.answers.person_request(run_id, task_id, map_index)
    if isinstance(wait, Form):
        return {"form": wait.coerce(texts)}
    if isinstance(wait, Choice):
        raise AnswerRefused("choose: pick an option; nothing was changed", "choose")
    return {}  # the store says what is wrong (unknown task, not waiting, answered)
