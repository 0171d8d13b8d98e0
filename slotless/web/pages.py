"""The HTML of each page, rendered on the server (escaped everywhere), and its live twin.

Each page reads one typed view: the run list a :class:`~slotless.views.StatusView`, the
DAGs a ``DagsPage``, a run a ``RunGraph``, a task a ``TaskDetail``
(:mod:`executor.store.inspecting`). The HTML renderer and the JSON its live poll answers
(``live_*``) take the same view, and whether the page goes on refreshing is the view's
``live``, so the two cannot disagree on it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from executor.rows import TaskRow
from executor.states import RUN_TERMINAL
from executor.store.inspecting import INSTANCES_SHOWN, RUNS_PER_DAG, DagsPage, RunGraph, TaskDetail
from executor.store.viewrows import EventRow, RunRow, RunSquare
from triggers.base import clip

from ..schedule_shown import schedule_shown
from ..status import failure_cause, human_seconds, shard_ranges
from ..views import (
    WAITING,
    RetryingTask,
    StatusView,
    TriggererShown,
    Waiting,
    task_name,
    turns,
)
from . import graph
from .assets import JS
from .auth import Writes

ALL_STATES = graph.STATE_ORDER
# A run's states, as the DAGs page's squares draw them. QUEUED (a run waiting for its turn)
# is drawn before any run is queued, so that the page is ready when runs start to queue.
RUN_STATES = ("QUEUED", "RUNNING", "PAUSED", "SUCCESS", "FAILED", "CANCELLED")
RUN_MARK = {"QUEUED": "\u2026", "RUNNING": "\u25b6", "SUCCESS": "\u2713", "FAILED": "\u2717",
            "CANCELLED": "\u2298", "PAUSED": "\u23f8"}  # fmt: skip


# -- small pieces ----------------------------------------------------------------------


def run_href(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}"


def task_href(run_id: str, task_id: str, map_index: int = -1) -> str:
    base = f"{run_href(run_id)}/tasks/{quote(task_id, safe='')}"
    return base if map_index < 0 else f"{base}/{map_index}"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def badge(state: str, key: str = "") -> str:
    """A state's badge; with ``key``, the live poll updates it (:func:`live_badge`)."""
    mark = graph.MARK.get(state, "")
    k = f' data-k="{escape(key)}"' if key else ""
    return f'<span class="badge st-{escape(state)}"{k}>{mark} {escape(state)}</span>'


def badge_text(state: str) -> str:
    return f"{graph.MARK.get(state, '')} {state}"


# -- live updates: what GET /api/live/<page> answers ---------------------------------------
#
# {"live": bool, "els": {key: change}, "lists": {key: [item, ...]}}: each element of the
# page marked data-k="key" takes its change (state: its st-* class and data-state; text:
# its textContent; cls, title, hidden, width); a list replaces the children of its element
# with one new element per item (an <a> if the item has an href). "stale": a message shown
# (with a reload link) when the element's text was not already the change's text.
# assets.JS applies it, with textContent and attributes only: never as markup.


def live_badge(state: str) -> dict[str, str]:
    return {"state": state, "text": badge_text(state)}


def action_form(
    w: Writes | None,
    name: str,
    fields: dict[str, str],
    label: str,
    *,
    inputs: str = "",
    cls: str = "",
    path: str = "",
) -> str:
    """A POST to ``/actions/<name>`` with its CSRF token and the page to come back to; ""
    unless an operator is signed in. ``inputs``: more fields, as HTML (escaped by the
    caller)."""
    if w is None or not w.can(name):
        return ""
    action = path or f"/actions/{name}"
    hidden = "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in fields.items()
    )
    return (
        f'<form class="act {escape(cls)}" method="post" action="{action}">'
        f'<input type="hidden" name="csrf" value="{w.csrf(action)}">'
        f'<input type="hidden" name="back" value="{escape(w.path)}">{hidden}{inputs}'
        f'<button type="submit" value="{escape(name)}">{escape(label)}</button></form>'
    )


def state_bar(counts: dict[str, int], key: str = "") -> str:
    total = sum(counts.values())
    if not total and not key:
        return '<span class="empty">no tasks</span>'
    segs = "".join(
        f'<span class="st-{s}" style="width:{100 * counts[s] / total:.2f}%" '
        f'title="{counts[s]} {s}"></span>'
        for s in ALL_STATES
        if counts.get(s)
    )
    k = escape(key)
    return (
        f'<div class="bar" data-k="bar:{k}">{segs}</div>'
        f'<div class="muted" data-k="bartext:{k}">{escape(bar_text(counts))}</div>'
    )


def bar_text(counts: dict[str, int]) -> str:
    text = ", ".join(f"{counts[s]} {s.lower()}" for s in ALL_STATES if counts.get(s))
    return text or "no tasks"


def live_bar(key: str, counts: dict[str, int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A state bar's changes: (its ``els``, its ``lists``)."""
    total = sum(counts.values()) or 1
    segs = [
        {"cls": f"st-{s}", "width": f"{100 * counts[s] / total:.2f}%", "title": f"{counts[s]} {s}"}
        for s in ALL_STATES
        if counts.get(s)
    ]
    return {f"bartext:{key}": {"text": bar_text(counts)}}, {f"bar:{key}": segs}


def legend() -> str:
    return '<div class="legend">' + "".join(badge(s) for s in ALL_STATES) + "</div>"


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(
    title: str,
    main: str,
    *,
    live: bool,
    db: str,
    refresh: float,
    poll: str = "",
    w: Writes | None = None,
    flash: tuple[str, str] | None = None,
    needs: int | None = None,
) -> str:
    """The whole page around ``main``: the header (who may write), the banner saying the
    page is read-only when writes are off, a flashed message, and the live poll's script
    (``poll``: the GET /api/live/... URL answering this page's changes)."""
    from .assets import CSS

    account, banner = "", ""
    if w is not None and not w.enabled:
        banner = (
            '<div class="banner" id="read-only">Read-only: nothing on this page can change '
            'anything (start <span class="mono">slotless ui</span> with '
            '<span class="mono">--token</span> or <span class="mono">$SLOTLESS_UI_TOKEN</span> '
            "to allow pausing and triggering).</div>"
        )
    elif w is not None and w.session is None:
        account = f'<a class="account" href="/login?back={quote(w.path)}">sign in</a>'
    elif w is not None:
        account = action_form(w, "logout", {}, "sign out", cls="account", path="/logout")
    shown = ""
    if flash is not None:
        kind, text = flash
        shown = f'<div class="flash {escape(kind)}" role="status" id="flash">{escape(text)}</div>'
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)} - slotless</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style></head>"
        f'<body data-live="{int(live)}" data-refresh="{refresh:g}" data-poll="{escape(poll)}">'
        '<header><a href="/">slotless</a><a href="/dags">DAGs</a><a href="/">runs</a>'
        f"{_needs_link(needs)}"
        f'<span class="db">{escape(db)}</span>'
        f'<span id="live" class="live{" on" if live else ""}">'
        f"{'live, refreshing' if live else 'not live'}</span>{account}</header>{banner}"
        f'<main id="main">{shown}'
        '<p class="stale" hidden><span id="stale"></span> <a href="">reload</a></p>'
        f"{main}</main>"
        f"<script>{JS}</script></body></html>"
    )


def _needs_link(needs: int | None) -> str:
    """The header's link to the requests waiting for a person, with their count."""
    if needs is None:
        return ""
    cls = "needs on" if needs else "needs"
    return f'<a class="{cls}" id="needs-you" href="/needs-you">Needs you <b>{needs}</b></a>'


def login_page(enabled: bool, back: str, *, wrong: bool = False) -> str:
    """The sign-in form: the operator's token, once per session."""
    if not enabled:
        return (
            "<h1>Sign in</h1><p>This page is read-only: it was started without a token, so "
            "there is nothing to sign in to.</p>"
        )
    said = '<p class="warn">Wrong token: not signed in.</p>' if wrong else ""
    return (
        f"<h1>Sign in</h1>{said}"
        '<form class="login" method="post" action="/login">'
        f'<input type="hidden" name="back" value="{escape(back)}">'
        '<label>operator token <input type="password" name="token" autocomplete="current-password" '
        'autofocus></label> <button type="submit">sign in</button></form>'
        '<p class="muted">The token the page was started with (<span class="mono">--token</span> '
        'or <span class="mono">$SLOTLESS_UI_TOKEN</span>).</p>'
    )


def not_found(what: str) -> str:
    return (
        f'<h1>Not found</h1><p class="warn">{escape(what)}</p>'
        '<p><a href="/">back to the runs</a></p>'
    )


# -- the DAG list ----------------------------------------------------------------------


def dags_page(data: DagsPage, w: Writes | None = None) -> tuple[str, bool]:
    """One row per catalogued DAG (schedule, next run, paused, its newest runs as squares),
    under a box naming each file that failed to parse."""
    parts = ["<h1>DAGs</h1>"]
    if data.broken_files:
        n = len(data.broken_files)
        items = "".join(
            f'<li><span class="mono">{escape(b.path)}</span>'
            f'<div class="mono err">{escape(b.parse_error)}</div></li>'
            for b in data.broken_files
        )
        parts.append(
            f'<div class="panel errors"><h2>{n} broken DAG file{"s" if n != 1 else ""}</h2>'
            f"<ul>{items}</ul></div>"
        )
    if not data.dags:
        parts.append(
            '<p class="empty">No DAGs in the catalogue: <span class="mono">slotless dags list '
            "--dags DIR</span> parses a folder into it.</p>"
        )
        return "".join(parts), False
    parts.append(
        '<div class="legend">'
        + "".join(f"<span>{square(s)} {escape(s.lower())}</span>" for s in RUN_STATES)
        + "</div>"
    )
    rows = []
    for d in data.dags:
        runs = data.runs.get(d.dag_id, [])
        shown = schedule_shown(d)
        dag = (
            f'<span class="dag-id">{escape(d.dag_id)}</span>'
            f'<div class="muted mono">{escape(d.file)}</div>'
        )
        if d.parse_error:
            dag += f'<div class="mono err">file broken: {escape(d.parse_error)}</div>'
        if d.schedule is None and d.waiting_for is None:
            sched = '<span class="muted">none: started by hand</span>'
        elif d.schedule is None:
            sched = ""
        else:
            sched = (
                f"{escape(shown.schedule_words or '')}"
                f'<div class="mono muted">{escape(shown.schedule or "")}</div>'
            )
        if d.waiting_for is not None:
            what = escape(d.waiting_for)
            sched += f'<div class="when">when <span class="mono">{what}</span></div>'
        if d.start_error:
            sched += f'<div class="mono err">cannot start: {escape(d.start_error)}</div>'
        dag_id = d.dag_id
        k = escape(dag_id)
        paused = (
            f'<span class="paused" data-k="paused:{k}">paused</span>'
            if d.paused
            else f'<span class="active" data-k="paused:{k}">active</span>'
        )
        paused += action_form(
            w, "unpause" if d.paused else "pause", {"dag_id": dag_id},
            "unpause" if d.paused else "pause",
        )  # fmt: skip
        grid = (
            f'<div class="grid" data-k="runs:{k}">'
            + (
                "".join(square(r.state, r) for r in runs)
                or '<span class="empty">no runs yet</span>'
            )
            + "</div>"
        )
        broken = ' class="broken"' if d.parse_error else ""
        rows.append(
            f'<tr data-dag="{k}"{broken}>'
            f"<td>{dag}</td><td>{sched}</td><td>{escape(shown.next_run or '-')}</td>"
            f"<td>{paused}</td><td>{grid}</td>{_trigger_cell(w, dag_id)}</tr>"
        )
    titles = ["DAG", "schedule", "next run", "state", f"last {RUNS_PER_DAG} runs, oldest first"]
    if w is not None and w.session is not None:
        titles.append("run it now")
    head = "".join(f"<th>{escape(h)}</th>" for h in titles)
    parts.append(
        f'<table class="dags"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
    return "".join(parts), data.live


def _trigger_cell(w: Writes | None, dag_id: str) -> str:
    """A "trigger" form: a JSON conf, checked against the DAG's params as ``slotless
    trigger`` checks it. A refused conf comes back in the box, the box open."""
    if w is None or w.session is None:
        return ""
    kept = w.session.form
    again = kept.get("dag_id") == dag_id and kept.get("action") == "trigger"
    conf = kept.get("conf", "") if again else ""
    box = (
        f'<textarea name="conf" rows="3" cols="28" class="mono" '
        f'placeholder="conf: a JSON object, or empty">{escape(conf)}</textarea>'
    )
    form = action_form(w, "trigger", {"dag_id": dag_id}, "trigger run", inputs=box)
    return (
        f'<td><details class="trigger"{" open" if again else ""}><summary>trigger</summary>'
        f"{form}</details></td>"
    )


def live_dags(data: DagsPage) -> dict[str, Any]:
    """The DAGs page's changes: each DAG's paused state and its squares."""
    els: dict[str, Any] = {}
    lists: dict[str, Any] = {}
    for d in data.dags:
        runs = data.runs.get(d.dag_id, [])
        word = "paused" if d.paused else "active"
        els[f"paused:{d.dag_id}"] = {"cls": word, "text": word}
        lists[f"runs:{d.dag_id}"] = [
            {
                "cls": f"sq st-{r.state}",
                "state": r.state,
                "text": RUN_MARK.get(r.state, "?"),
                "title": f"{r.logical_date} \u00b7 {r.state}",
                "href": run_href(r.run_id),
            }
            for r in runs
        ]
    return {"live": data.live, "els": els, "lists": lists}


def square(state: str, run: RunSquare | None = None) -> str:
    """A run as a square coloured by its state, linking to the run; without a run, the
    legend's square."""
    mark = RUN_MARK.get(state, "?")
    if run is None:
        return f'<span class="sq st-{escape(state)}">{mark}</span>'
    title = f"{run.logical_date} \u00b7 {state}"
    return (
        f'<a class="sq st-{escape(state)}" href="{run_href(run.run_id)}" '
        f'title="{escape(title)}" data-state="{escape(state)}">{mark}</a>'
    )


# -- the run list ----------------------------------------------------------------------


def index(data: StatusView) -> tuple[str, bool]:
    now = data.now
    runs = data.runs
    waiting = data.waiting
    newest = runs[0].run_id if runs else ""
    parts = [
        f'<h1>Runs <span data-k="newest" hidden>{escape(newest)}</span></h1>',
        '<div class="meta">',
    ]
    parts.append(
        "<span><b>runs</b>"
        + (" ".join(f"{badge(s)} {n}" for s, n in sorted(data.runs_by_state.items())) or "none")
        + "</span>"
    )
    parts.append(
        "<span><b>waiting</b>" + " ".join(f"{badge(s)} {waiting[s].count}" for s in WAITING)
        + "</span>"
    )  # fmt: skip
    live_trig = [t for t in data.triggerers if not t.stale]
    parts.append(f"<span><b>triggerers</b>{len(live_trig)} live</span></div>")
    if data.shards.unowned and data.deferred:
        parts.append(
            f'<p class="warn">{data.shards.unowned} of {data.shards.total} shards '
            "have no live triggerer: DEFERRED waits in them are not being checked.</p>"
        )
    if data.attention:
        rows = [
            [f'<a class="run" href="{run_href(a.run_id)}">{escape(a.run_id)}</a>',
             badge(a.state), escape(a.why), escape(a.todo)]
            for a in data.attention
        ]  # fmt: skip
        parts.append('<h2 class="attention">Needs attention</h2>')
        parts.append(table(["run", "state", "why", "what to do"], rows, "attention-runs"))
    if not runs:
        parts.append('<p class="empty">No runs yet.</p>')
    else:
        rows = []
        for r in runs:
            rid = r.run_id
            rows.append(
                [
                    f'<a class="run" href="{run_href(rid)}">{escape(rid)}</a>',
                    escape(r.dag_id),
                    escape(r.logical_date),
                    badge(r.state, f"run:{rid}"),
                    when(r.created_at),
                    f'<span data-k="dur:{escape(rid)}">{human_seconds(r.took(now))}</span>',
                    state_bar(r.tasks, rid),
                ]
            )
        parts.append(
            table(
                ["run", "DAG", "logical date", "state", "started", "duration", "tasks"],
                rows,
                "runs",
            )
        )
    parts.append(_waiting_section(waiting, now))
    parts.append(_pools_section(data))
    parts.append(_triggerers_section(data.triggerers))
    return "".join(parts), data.live


def live_index(data: StatusView) -> dict[str, Any]:
    """The run list's changes: each run's state, duration and tasks; a newer run than the
    page shows asks for a reload."""
    els: dict[str, Any] = {}
    lists: dict[str, Any] = {}
    if data.runs:
        els["newest"] = {"text": data.runs[0].run_id, "stale": "newer runs started:"}
    for r in data.runs:
        rid = r.run_id
        els[f"run:{rid}"] = live_badge(r.state)
        els[f"dur:{rid}"] = {"text": human_seconds(r.took(data.now))}
        bar_els, bar_lists = live_bar(rid, r.tasks)
        els |= bar_els
        lists |= bar_lists
    for pool in data.pools:
        els[f"pool:{pool.name}"] = {"text": pool.used_text}
        els[f"pool-ready:{pool.name}"] = {"text": str(pool.ready)}
    return {"live": data.live, "els": els, "lists": lists}


def _pools_section(data: StatusView) -> str:
    """Pools in use, queues nobody serves, and the ready tasks they hold back."""
    parts = ["<h2>Pools and queues</h2>"]
    rows = []
    for pool in data.pools:
        name = escape(pool.name)
        rows.append(
            [
                f'<span class="mono">{name}</span>',
                f'<span data-k="pool:{name}">{escape(pool.used_text)}</span>',
                f'<span data-k="pool-ready:{name}">{pool.ready}</span>',
            ]
        )
    parts.append(table(["pool", "slots used", "tasks ready"], rows, "pools"))
    for q in data.queues:
        if q.stranded:
            parts.append(
                f'<p class="warn">queue {escape(q.name)}: {q.ready} task(s) ready, '
                "no live worker serves it.</p>"
            )
    held = data.held_back
    if held:
        parts.append(f"<p>{len(held)} ready task(s) held back by a pool or a queue</p>")
        held_rows = [
            [
                _task_link(h.run_id, h.task_id, h.map_index),
                human_seconds(h.for_seconds),
                f'<span class="mono">{escape(h.waits_for)}</span>',
            ]
            for h in held
        ]
        parts.append(table(["task", "ready for", "waits for"], held_rows, "waiting held-back"))
    return "".join(parts)


def _task_link(run_id: str, task_id: str, map_index: int) -> str:
    """A task's name linking to its page, over its run's id."""
    return (
        f'<a href="{task_href(run_id, task_id, map_index)}">'
        f"{escape(task_name(task_id, map_index))}</a>"
        f'<div class="muted">{escape(run_id)}</div>'
    )


def _waiting_section(waiting: dict[str, Waiting], now: float) -> str:
    parts = ["<h2>Waiting tasks</h2>"]
    if not any(w.count for w in waiting.values()):
        return parts[0] + '<p class="empty">Nothing waits.</p>'
    for state, what in (
        ("DEFERRED", "in the triggerer: healthy while within its timeout"),
        ("SENSING", "reschedule-mode sensors between checks"),
        ("RETRYING", "an attempt failed; sick if it lasts"),
    ):
        w = waiting[state]
        if not w.count:
            continue
        parts.append(f"<p>{badge(state)} {w.count} &mdash; {escape(what)}</p>")
        rows = []
        for t in w.tasks:
            link = _task_link(t.run_id, t.task_id, t.map_index)
            if isinstance(t, RetryingTask):
                due = t.next_attempt_at or now
                rows.append(
                    [
                        link,
                        human_seconds(t.for_seconds),
                        f"{escape(t.waits_for)} in {human_seconds(due - now)}",
                        f'<span class="mono">{escape(failure_cause(t.last_error))}</span>',
                    ]
                )
            else:
                used = t.timeout_used
                used_html = "-" if used is None else f"{used:.0%}"
                if used is not None and used >= 0.8:
                    used_html = f'<span class="warn">{used_html}</span>'
                rows.append(
                    [
                        link,
                        human_seconds(t.for_seconds),
                        f'<span class="mono">{escape(t.waits_for)}</span>',
                        used_html,
                    ]
                )
        headers = (
            ["task", "retrying for", "next", "last failure"]
            if state == "RETRYING"
            else ["task", "waiting for", "waits for", "timeout used"]
        )
        parts.append(table(headers, rows, f"waiting waiting-{state}"))
    return "".join(parts)


def _triggerers_section(triggerers: list[TriggererShown]) -> str:
    if not triggerers:
        return '<h2>Triggerers</h2><p class="empty">No triggerer has registered.</p>'
    rows = []
    for t in triggerers:
        age = human_seconds(t.heartbeat_age_seconds)
        if t.stale:
            age = f'<span class="warn">{age} (stale)</span>'
        lag = t.loop_lag_ms
        rows.append(
            [
                f'<span class="mono">{escape(t.id)}</span>',
                f"{t.shard_count} <span class='muted'>({shard_ranges(t.shards)})</span>",
                age,
                str(t.triggers),
                "-" if lag is None else f"{lag:.1f} ms",
            ]
        )
    return "<h2>Triggerers</h2>" + table(
        ["triggerer", "shards", "heartbeat age", "triggers held", "loop lag p99"], rows
    )


# -- a run -----------------------------------------------------------------------------


def attention_note(run: RunRow) -> str:
    """What a person must know about a run: paused (and why), or past its deadline."""
    notes = []
    if run.state == "PAUSED":
        why = run.state_reason or "paused"
        notes.append(f"needs attention: {escape(why)}")
    if run.deadline_missed_at and run.state not in RUN_TERMINAL:
        notes.append(f"missed its deadline ({when(run.deadline_at)})")
    elif run.state_reason and run.state in ("FAILED", "CANCELLED"):
        notes.append(escape(run.state_reason))
    if not notes:
        return ""
    return f'<div class="attention" role="alert">{"; ".join(notes)}</div>'


def run_page(g: RunGraph, now: float, w: Writes | None = None) -> tuple[str, bool]:
    run = g.run
    run_id = run.run_id
    end = run.ended_at or now
    actions = ""
    if run.state not in RUN_TERMINAL:
        actions += action_form(w, "cancel", {"run_id": run_id}, "cancel run")
    if run.state == "FAILED":
        actions += action_form(w, "retry", {"run_id": run_id}, "retry failed tasks")
    if run.state == "PAUSED":
        actions += action_form(w, "resume", {"run_id": run_id}, "resume (rerun failed tasks)")
    parts = [
        '<div class="crumbs"><a href="/">runs</a> &rsaquo;</div>',
        f"<h1>{escape(run_id)} {badge(run.state, 'runstate')}</h1>",
        attention_note(run),
        f'<div class="actions">{actions}</div>' if actions else "",
        '<div class="meta">',
        f"<span><b>DAG</b>{escape(run.dag_id)}</span>",
        f"<span><b>logical date</b>{escape(run.logical_date)}</span>",
        f"<span><b>started</b>{when(run.created_at)}</span>",
        f"<span><b>{'ran' if run.ended_at else 'running for'}</b>"
        f"{human_seconds(end - run.created_at)}</span>",
        "</div>",
        legend(),
        '<div class="graph">',
        graph.svg(
            g.tasks,
            g.edges,
            g.mapped,
            lambda task_id: task_href(run_id, task_id),
            notes=g.waits,
        ),
        "</div>",
        "<h2>Tasks</h2>",
    ]
    rows = []
    for t in g.tasks:
        tid = t.task_id
        counts = g.mapped.get(tid)
        detail = ""
        if counts is not None or t.map_total is not None:
            detail = state_bar(counts or {}, f"task:{tid}")
        elif tid in g.waits:
            detail = f'waits for <span class="mono">{escape(g.waits[tid])}</span>'
        started, took = t.started_at, _took(t, now)
        k = escape(tid)
        rows.append(
            [
                f'<a href="{task_href(run_id, tid)}">{k}</a>',
                badge(t.state, f"tstate:{tid}"),
                f'<span data-k="tatt:{k}">{t.attempt} / {t.max_attempts}</span>',
                f'<span data-k="tstart:{k}">{when(started)}</span>',
                f'<span data-k="ttook:{k}">{took}</span>',
                detail,
            ]
        )
    parts.append(
        table(["task", "state", "attempt", "started", "duration", "detail"], rows, "tasks")
    )
    return "".join(parts), g.live


def _took(t: TaskRow, now: float) -> str:
    waiting_since = t.wait_started_at if t.state in ("DEFERRED", "SENSING") else None
    started, ended = t.started_at, t.ended_at
    if waiting_since:
        return f"waiting {human_seconds(now - waiting_since)}"
    return human_seconds((ended or now) - started) if started else "-"


def live_run(g: RunGraph, now: float) -> dict[str, Any]:
    """A run's changes: its state, and each task's box, state, attempt and duration."""
    els: dict[str, Any] = {"runstate": live_badge(g.run.state)}
    lists: dict[str, Any] = {}
    for t in g.tasks:
        tid, state = t.task_id, t.state
        els[f"box:{tid}"] = {"state": state}
        els[f"tstate:{tid}"] = live_badge(state)
        els[f"tatt:{tid}"] = {"text": f"{t.attempt} / {t.max_attempts}"}
        els[f"tstart:{tid}"] = {"text": when(t.started_at)}
        els[f"ttook:{tid}"] = {"text": _took(t, now)}
        counts = g.mapped.get(tid)
        if counts is not None or t.map_total is not None:
            bar_els, bar_lists = live_bar(f"task:{tid}", counts or {})
            els |= bar_els
            lists |= bar_lists
        else:
            els[f"sub:{tid}"] = {"text": graph.box_sub(t)}
    return {"live": g.live, "els": els, "lists": lists}


# -- a task ----------------------------------------------------------------------------


def task_page(d: TaskDetail, now: float, w: Writes | None = None) -> tuple[str, bool]:
    row = d.row
    run_id, task_id, idx = row.run_id, row.task_id, row.map_index
    state = row.state
    actions = ""
    if idx < 0:  # a mapped task's instances are cleared with their task
        ids = {"run_id": run_id, "task_id": task_id}
        if state != "RUNNING":
            actions += action_form(w, "clear", ids, "clear")
            actions += action_form(w, "clear", {**ids, "downstream": "1"}, "clear with downstream")
            for outcome in ("success", "failed"):
                if state != outcome.upper():
                    actions += action_form(
                        w, "mark", {**ids, "outcome": outcome}, f"mark {outcome}"
                    )
    parts = [
        f'<div class="crumbs"><a href="/">runs</a> &rsaquo; '
        f'<a href="{run_href(run_id)}">{escape(run_id)}</a> &rsaquo;'
        + (
            f' <a href="{task_href(run_id, task_id)}">{escape(task_id)}</a> &rsaquo;'
            if idx >= 0
            else ""
        )
        + "</div>",
        f"<h1>{escape(task_name(task_id, idx))} {badge(state, 'state')}</h1>",
        f'<div class="actions">{actions}</div>' if actions else "",
        '<div class="meta">',
        f'<span><b>attempt</b><span data-k="attempt">{row.attempt} of {row.max_attempts}'
        "</span></span>",
        f"<span><b>trigger rule</b>{escape(row.trigger_rule)}</span>",
        f"<span><b>started</b>{when(row.started_at)}</span>",
        f'<span><b>ended</b><span data-k="ended">{when(row.ended_at)}</span></span>',
        f"<span><b>last change</b>{when(row.updated_at)}</span>",
        "</div>",
    ]
    parts.append(_waiting_panel(d, now))
    if d.instance_counts or row.map_total is not None:
        parts.append(_instances(d))
    stays = turns(d.events)
    parts.append("<h2>Attempts</h2>")
    if stays:
        rows = [
            [
                str(s.attempt),
                escape(s.what),
                when(s.started),
                human_seconds(s.took(now)) + ("" if s.ended else " so far"),
                badge(s.outcome) if s.outcome else '<span class="muted">now</span>',
                f'<span class="mono">{escape(s.message)}</span>',
            ]
            for s in stays
        ]
        parts.append(
            table(["attempt", "where", "from", "for", "then", "message"], rows, "attempts")
        )
    else:
        parts.append('<p class="empty">Not started yet.</p>')
    text = _output(d)
    hidden = "" if text is not None else " hidden"
    parts.append(
        f'<h2 data-k="output-h"{hidden}>Output</h2>'
        f'<pre class="mono output" data-k="output"{hidden}>{escape(text or "")}</pre>'
    )
    parts.append(_log(d.events))
    return "".join(parts), d.live


def _output(d: TaskDetail) -> str | None:
    """What a succeeded task returned, as stored (JSON text), cut at 4,000 characters."""
    text = d.row.output
    if text is None or d.row.state != "SUCCESS":
        return None
    return text if len(text) <= 4000 else text[:4000] + " \u2026"


def live_task(d: TaskDetail) -> dict[str, Any]:
    """A task's changes: its state, attempt, end, output; new log entries ask for a reload."""
    row = d.row
    els: dict[str, Any] = {
        "state": live_badge(row.state),
        "attempt": {"text": f"{row.attempt} of {row.max_attempts}"},
        "ended": {"text": when(row.ended_at)},
        "logn": {"text": _log_title(d.events), "stale": "new log entries:"},
    }
    text = _output(d)
    if text is not None:
        els["output"] = {"text": text, "hidden": False}
        els["output-h"] = {"hidden": False}
    return {"live": d.live, "els": els}


def _waiting_panel(d: TaskDetail, now: float) -> str:
    row = d.row
    state = row.state
    if state not in ("DEFERRED", "SENSING", "RETRYING"):
        return ""
    items: list[tuple[str, str]] = []
    if state == "RETRYING":
        last = next(
            (e for e in reversed(d.events) if e.to_state == "RETRYING"),
            None,
        )
        first = next((e for e in d.events if e.to_state == "RETRYING"), None)
        title = "Retrying"
        items.append(("next attempt", f"{row.attempt} of {row.max_attempts}"))
        items.append(("due in", human_seconds((row.ready_at or now) - now)))
        if first is not None:
            items.append(("retrying for", human_seconds(now - first.ts)))
        if last is not None:
            items.append(("last failure", f'<span class="mono">{escape(last.message)}</span>'))
    else:
        since = row.wait_started_at or row.updated_at
        title = "Waiting in the triggerer" if state == "DEFERRED" else "Sensing (reschedule mode)"
        items.append(("waiting for", human_seconds(now - since)))
        if row.wait_timeout_at:
            span = row.wait_timeout_at - since
            used = (now - since) / span if span > 0 else 1.0
            used_html = f"{used:.0%}"
            if used >= 0.8:
                used_html = f'<span class="warn">{used_html}</span>'
            items.append(
                ("gives up at", f"{when(row.wait_timeout_at)} ({used_html} of its timeout used)")
            )
        if state == "DEFERRED":
            g = d.trigger
            if g is None:
                items.append(("trigger", '<span class="warn">trigger row missing</span>'))
            else:
                items.append(
                    (
                        "waits for",
                        f'<span class="mono">{escape(clip(g.description or ""))}</span>',
                    )
                )
                items.append(("trigger", f'<span class="mono">{escape(g.classpath)}</span>'))
                kwargs = g.kwargs
                with contextlib.suppress(ValueError):
                    kwargs = json.dumps(json.loads(kwargs), indent=1, sort_keys=True)
                items.append(("kwargs", f'<pre class="mono">{escape(kwargs)}</pre>'))
                items.append(("poke hash", f'<span class="mono">{escape(g.poke_hash)}</span>'))
                others = max(0, d.waiters - 1)
                items.append(
                    (
                        "shared check",
                        f"{others} other task{'s' if others != 1 else ''} wait"
                        f"{'' if others != 1 else 's'} on the same check",
                    )
                )
                owner = (
                    f'<span class="mono">{escape(g.lease_owner or "")}</span>'
                    if g.checked(now)
                    else '<span class="warn">no live triggerer holds this shard</span>'
                )
                items.append(("shard", f"{g.shard}, checked by {owner}"))
            items.append(
                (
                    "when it fires",
                    f"resumes at <span class='mono'>{escape(row.next_method)}</span>"
                    if row.next_method
                    else "the sensor succeeds (no worker needed)",
                )
            )
        else:
            last = next(
                (e for e in reversed(d.events) if e.to_state == "SENSING"),
                None,
            )
            if last is not None:
                items.append(("last check", f'<span class="mono">{escape(last.message)}</span>'))
            items.append(("next check in", human_seconds((row.ready_at or now) - now)))
    body = "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<div class="panel st-{state}"><h2>{badge(state)} {title}</h2><dl>{body}</dl></div>'


def _instances(d: TaskDetail) -> str:
    row = d.row
    total = sum(d.instance_counts.values())
    parts = [f"<h2>Mapped instances ({total})</h2>", state_bar(d.instance_counts)]
    rows = [
        [
            f'<a href="{task_href(row.run_id, row.task_id, i.map_index)}">'
            f"{escape(task_name(row.task_id, i.map_index))}</a>",
            badge(i.state),
            str(i.attempt),
            when(i.updated_at),
        ]
        for i in d.instances
    ]
    if rows:
        parts.append(table(["instance", "state", "attempt", "last change"], rows, "instances"))
    if total > len(d.instances) and len(d.instances) >= INSTANCES_SHOWN:
        parts.append(f'<p class="muted">the first {len(d.instances)} of {total} shown</p>')
    return "".join(parts)


def _log_title(events: list[EventRow]) -> str:
    return f"Log ({len(events)} entries)" if events else "Log"


def _log(events: list[EventRow]) -> str:
    if not events:
        return '<h2 data-k="logn">Log</h2><p class="empty">No entries.</p>'
    rows = []
    for e in events:
        kind = e.kind
        if kind == "transition":
            msg = (
                f"{badge(e.from_state or '?')} &rarr; {badge(e.to_state or '?')} "
                f"{escape(e.message)}"
            )
        elif kind == "error":
            msg = f'<pre class="tb">{escape(e.message)}</pre>'
        else:
            msg = escape(e.message)
        rows.append(
            f'<tr class="k-{escape(kind)}"><td class="mono">{when(e.ts)}'
            f'.{int((e.ts % 1) * 1000):03d}</td><td class="num">'
            f"{'' if e.attempt is None else e.attempt}</td>"
            f'<td>{escape(kind)}</td><td class="msg">{msg}</td></tr>'
        )
    return (
        f'<h2 data-k="logn">{_log_title(events)}</h2>'
        '<table class="log"><thead><tr><th>time</th><th>attempt</th><th>kind</th>'
        f"<th>entry</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
