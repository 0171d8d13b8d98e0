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

from executor.store.people import Request, RespondError
from triggers.people import AnswerError, Approval, Choice, Form

from .actions import Act, Refused, action
from .auth import Writes
from .pages import action_form

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


def needs_you_page(
    count: int, requests: list[Request], w: Writes, now: float, kept: dict[str, str]
) -> str:
    """The list; ``kept``: what a refused answer's form held (its values and the error's
    field), drawn back into that request's form."""
    head = f'<h1>Needs you <span class="count" id="needs-count">{count}</span></h1>'
    if not requests:
        return head + '<p class="empty" id="needs-none">Nothing is waiting for a person.</p>'
    if w.session is None:
        note = (
            '<p class="warn">Sign in with your token to answer.</p>'
            if w.enabled
            else '<p class="warn">Read-only: this page was started without a token.</p>'
        )
    else:
        note = f'<p>Answering as <strong id="who">{escape(w.session.who)}</strong>.</p>'
    shown = "".join(_request(r, w, now, kept) for r in requests)
    more = f"<p>{count - len(requests)} more not shown.</p>" if count > len(requests) else ""
    return head + note + shown + more


def _request(r: Request, w: Writes, now: float, kept: dict[str, str]) -> str:
    wait = r.wait
    task_href = f"/runs/{escape(r.run_id)}/tasks/{escape(r.task_id)}"
    facts = [
        ("DAG", escape(r.dag_id)),
        ("run", f'<a href="/runs/{escape(r.run_id)}">{escape(r.run_id)}</a>'),
        ("task", f'<a href="{task_href}">{escape(r.task_id)}</a>'),
        ("date", escape(r.logical_date)),
        ("asks for", escape(wait.kind)),
    ]
    if r.waiting_since:
        facts.append(("waiting", _ago(now - r.waiting_since)))
    if r.gives_up_at:
        then = "the default answer" if wait.default is not None else "fails"
        facts.append(("gives up", f"in {_ago(r.gives_up_at - now)}, then {then}"))
    facts.append(("who may answer", escape(", ".join(wait.respondents) or "anyone with a token")))
    if wait.default is not None:
        facts.append(("default", f'<span class="mono">{escape(json.dumps(wait.default))}</span>'))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    mine = kept.get("task_row") == str(r.task_row)
    return (
        f'<section class="request" id="task-{r.task_row}" data-task="{escape(r.task_id)}">'
        f'<h2 class="subject">{escape(wait.subject)}</h2>'
        f'<dl class="facts">{dl}</dl>'
        f'<div class="body">{markdown(wait.body)}</div>'
        f"{_answer_forms(r, w, kept if mine else {})}</section>"
    )


def _answer_forms(r: Request, w: Writes, kept: dict[str, str]) -> str:
    if w.session is None:
        return ""
    if not r.wait.may_answer(w.session.who):
        return f'<p class="warn">{escape(w.session.who)} may not answer this request.</p>'
    base = {"run_id": r.run_id, "task_id": r.task_id, "map_index": str(r.map_index),
            "task_row": str(r.task_row)}  # fmt: skip
    comment = (
        '<label>comment <input name="comment" maxlength="4000" '
        f'value="{escape(kept.get("comment", ""))}"></label>'
    )
    wait = r.wait
    if isinstance(wait, Approval):
        return (
            action_form(w, "respond", {**base, "approve": "true"}, "Approve",
                        inputs=comment, cls="approve")
            + action_form(w, "respond", {**base, "approve": "false"}, "Reject",
                          inputs=comment, cls="reject")
        )  # fmt: skip
    if isinstance(wait, Choice):  # and BranchChoice
        kind = "checkbox" if wait.multiple else "radio"
        options = "".join(
            f'<label><input type="{kind}" name="choose" value="{escape(o)}"> {escape(o)}</label>'
            for o in wait.options
        )
        return action_form(w, "respond", base, "Answer", inputs=options + comment, cls="choice")
    if isinstance(wait, Form):
        return action_form(
            w, "respond", base, "Submit", inputs=_fields(wait, kept) + comment, cls="form"
        )
    return ""


def _fields(form: Form, kept: dict[str, str]) -> str:
    bad = kept.get("error_field", "")
    out = []
    for f in form.fields():
        name = FORM_PREFIX + f["name"]
        value = kept.get(name, "" if f["default"] is None else str(f["default"]))
        required = " required" if f["required"] and f["type"] != "boolean" else ""
        attrs = f'name="{escape(name)}" id="f-{escape(f["name"])}"'
        if f["enum"]:
            opts = "".join(
                f'<option value="{escape(str(o))}"{" selected" if str(o) == value else ""}>'
                f"{escape(str(o))}</option>"
                for o in f["enum"]
            )
            control = f"<select {attrs}{required}>{opts}</select>"
        elif f["type"] == "boolean":
            checked = " checked" if value in ("True", "true", "on") else ""
            control = f'<input type="checkbox" {attrs}{checked}>'
        else:
            # Text, even for numbers: the schema checks the value, and its error is shown
            # by the field (a browser's own number check would hide the server's).
            control = f'<input type="text" {attrs} value="{escape(value)}"{required}>'
        error = ""
        if bad == name:
            error = f'<span class="field-error" role="alert">{escape(kept.get("error", ""))}</span>'
        hint = f"<small>{escape(f['description'])}</small>" if f["description"] else ""
        out.append(f'<label class="field">{escape(f["title"])} {control}{hint}{error}</label>')
    return "".join(out)


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
    try:
        map_index = int(a.field("map_index", "-1"))
    except ValueError:
        raise Refused("map_index must be a number") from None
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
