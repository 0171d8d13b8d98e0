"""The HTML of each page, rendered on the server from store rows (escaped everywhere)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from executor.states import TERMINAL
from executor.store import Row
from executor.store.inspecting import INSTANCES_SHOWN, RUNS_PER_DAG, DagsPage, RunGraph, TaskDetail

from ..schedule_shown import schedule_shown
from ..status import failure_cause, human_seconds, shard_ranges
from . import graph
from .assets import JS

ALL_STATES = graph.STATE_ORDER
# A run's states, as the DAGs page's squares draw them. QUEUED (a run waiting for its turn)
# is drawn before any run is queued, so that the page is ready when runs start to queue.
RUN_STATES = ("QUEUED", "RUNNING", "SUCCESS", "FAILED")
RUN_MARK = {"QUEUED": "\u2026", "RUNNING": "\u25b6", "SUCCESS": "\u2713", "FAILED": "\u2717"}


# -- small pieces ----------------------------------------------------------------------


def run_href(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}"


def task_href(run_id: str, task_id: str, map_index: int = -1) -> str:
    base = f"{run_href(run_id)}/tasks/{quote(task_id, safe='')}"
    return base if map_index < 0 else f"{base}/{map_index}"


def task_name(task_id: str, map_index: int) -> str:
    return task_id if map_index < 0 else f"{task_id}[{map_index}]"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def badge(state: str) -> str:
    mark = graph.MARK.get(state, "")
    return f'<span class="badge st-{escape(state)}">{mark} {escape(state)}</span>'


def state_bar(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    if not total:
        return '<span class="empty">no tasks</span>'
    segs = "".join(
        f'<span class="st-{s}" style="width:{100 * counts[s] / total:.2f}%" '
        f'title="{counts[s]} {s}"></span>'
        for s in ALL_STATES
        if counts.get(s)
    )
    text = ", ".join(f"{counts[s]} {s.lower()}" for s in ALL_STATES if counts.get(s))
    return f'<div class="bar">{segs}</div><div class="muted">{escape(text)}</div>'


def legend() -> str:
    return '<div class="legend">' + "".join(badge(s) for s in ALL_STATES) + "</div>"


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(title: str, main: str, *, live: bool, db: str, refresh: float) -> str:
    from .assets import CSS

    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)} - slotless</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style></head>"
        f'<body data-live="{int(live)}" data-refresh="{refresh:g}">'
        '<header><a href="/">slotless</a><a href="/dags">DAGs</a><a href="/">runs</a>'
        f'<span class="db">{escape(db)}</span>'
        f'<span id="live" class="live{" on" if live else ""}">'
        f"{'live, refreshing' if live else 'not live'}</span></header>"
        f'<main id="main">{main}</main>'
        f"<script>{JS}</script></body></html>"
    )


def not_found(what: str) -> str:
    return (
        f'<h1>Not found</h1><p class="warn">{escape(what)}</p>'
        '<p><a href="/">back to the runs</a></p>'
    )


# -- the DAG list ----------------------------------------------------------------------


def dags_page(data: DagsPage) -> tuple[str, bool]:
    """One row per catalogued DAG (schedule, next run, paused, its newest runs as squares),
    under a box naming each file that failed to parse."""
    parts = ["<h1>DAGs</h1>"]
    if data.broken_files:
        n = len(data.broken_files)
        items = "".join(
            f'<li><span class="mono">{escape(b["path"])}</span>'
            f'<div class="mono err">{escape(b["parse_error"])}</div></li>'
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
    live = False
    for d in data.dags:
        runs = data.runs.get(d["dag_id"], [])
        live = live or any(r["state"] in ("QUEUED", "RUNNING") for r in runs)
        shown = schedule_shown(d)
        dag = (
            f'<span class="dag-id">{escape(d["dag_id"])}</span>'
            f'<div class="muted mono">{escape(d["file"])}</div>'
        )
        if d["parse_error"]:
            dag += f'<div class="mono err">file broken: {escape(d["parse_error"])}</div>'
        if d["schedule"] is None and d["waiting_for"] is None:
            sched = '<span class="muted">none: started by hand</span>'
        elif d["schedule"] is None:
            sched = ""
        else:
            sched = (
                f"{escape(shown['schedule_words'] or '')}"
                f'<div class="mono muted">{escape(d["schedule"])}</div>'
            )
        if d["waiting_for"] is not None:
            what = escape(d["waiting_for"])
            sched += f'<div class="when">when <span class="mono">{what}</span></div>'
        if d["start_error"]:
            sched += f'<div class="mono err">cannot start: {escape(d["start_error"])}</div>'
        paused = (
            '<span class="paused">paused</span>'
            if d["paused"]
            else '<span class="active">active</span>'
        )
        grid = (
            '<div class="grid">' + "".join(square(r["state"], r) for r in runs) + "</div>"
            if runs
            else '<span class="empty">no runs yet</span>'
        )
        broken = ' class="broken"' if d["parse_error"] else ""
        rows.append(
            f'<tr data-dag="{escape(d["dag_id"])}"{broken}>'
            f"<td>{dag}</td><td>{sched}</td><td>{escape(shown['next_run'] or '-')}</td>"
            f"<td>{paused}</td><td>{grid}</td></tr>"
        )
    head = "".join(
        f"<th>{escape(h)}</th>"
        for h in ("DAG", "schedule", "next run", "state", f"last {RUNS_PER_DAG} runs, oldest first")
    )
    parts.append(
        f'<table class="dags"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
    return "".join(parts), live


def square(state: str, run: Row | None = None) -> str:
    """A run as a square coloured by its state, linking to the run; without a run, the
    legend's square."""
    mark = RUN_MARK.get(state, "?")
    if run is None:
        return f'<span class="sq st-{escape(state)}">{mark}</span>'
    title = f"{run['logical_date']} \u00b7 {state}"
    return (
        f'<a class="sq st-{escape(state)}" href="{run_href(run["run_id"])}" '
        f'title="{escape(title)}" data-state="{escape(state)}">{mark}</a>'
    )


# -- the run list ----------------------------------------------------------------------


def index(data: dict[str, Any]) -> tuple[str, bool]:
    now = data["now"]
    runs = data["runs"]
    waiting = data["waiting"]
    live = any(r["state"] in ("RUNNING", "QUEUED") for r in runs)
    parts = ["<h1>Runs</h1>", '<div class="meta">']
    by_state = data["runs_by_state"]
    parts.append(
        "<span><b>runs</b>"
        + (" ".join(f"{badge(s)} {n}" for s, n in sorted(by_state.items())) or "none")
        + "</span>"
    )
    parts.append(
        "<span><b>waiting</b>"
        + " ".join(f"{badge(s)} {waiting[s]['count']}" for s in ("DEFERRED", "SENSING", "RETRYING"))
        + "</span>"
    )
    live_trig = [t for t in data["triggerers"] if not t["stale"]]
    parts.append(f"<span><b>triggerers</b>{len(live_trig)} live</span></div>")
    if data["shards"]["unowned"] and waiting["DEFERRED"]["count"]:
        parts.append(
            f'<p class="warn">{data["shards"]["unowned"]} of {data["shards"]["total"]} shards '
            "have no live triggerer: DEFERRED waits in them are not being checked.</p>"
        )
    if not runs:
        parts.append('<p class="empty">No runs yet.</p>')
    else:
        rows = []
        for r in runs:
            end = r["ended_at"] or now
            rows.append(
                [
                    f'<a class="run" href="{run_href(r["run_id"])}">{escape(r["run_id"])}</a>',
                    escape(r["dag_id"]),
                    escape(r["logical_date"]),
                    badge(r["state"]),
                    when(r["created_at"]),
                    human_seconds(end - r["created_at"]),
                    state_bar(r["tasks"]),
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
    parts.append(_triggerers_section(data["triggerers"]))
    return "".join(parts), live or any(waiting[s]["count"] for s in waiting)


def _waiting_section(waiting: dict[str, Any], now: float) -> str:
    parts = ["<h2>Waiting tasks</h2>"]
    if not any(waiting[s]["count"] for s in waiting):
        return parts[0] + '<p class="empty">Nothing waits.</p>'
    for state, what in (
        ("DEFERRED", "in the triggerer: healthy while within its timeout"),
        ("SENSING", "reschedule-mode sensors between checks"),
        ("RETRYING", "an attempt failed; sick if it lasts"),
    ):
        w = waiting[state]
        if not w["count"]:
            continue
        parts.append(f"<p>{badge(state)} {w['count']} &mdash; {escape(what)}</p>")
        rows = []
        for t in w["tasks"]:
            link = (
                f'<a href="{task_href(t["run_id"], t["task_id"], t["map_index"])}">'
                f"{escape(task_name(t['task_id'], t['map_index']))}</a>"
                f'<div class="muted">{escape(t["run_id"])}</div>'
            )
            if state == "RETRYING":
                due = t["next_attempt_at"] or now
                rows.append(
                    [
                        link,
                        human_seconds(t["for_seconds"]),
                        f"{escape(t['waits_for'])} in {human_seconds(due - now)}",
                        f'<span class="mono">{escape(failure_cause(t["last_error"]))}</span>',
                    ]
                )
            else:
                used = t["timeout_used"]
                used_html = "-" if used is None else f"{used:.0%}"
                if used is not None and used >= 0.8:
                    used_html = f'<span class="warn">{used_html}</span>'
                rows.append(
                    [
                        link,
                        human_seconds(t["for_seconds"]),
                        f'<span class="mono">{escape(t["waits_for"])}</span>',
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


def _triggerers_section(triggerers: list[dict[str, Any]]) -> str:
    if not triggerers:
        return '<h2>Triggerers</h2><p class="empty">No triggerer has registered.</p>'
    rows = []
    for t in triggerers:
        age = human_seconds(t["heartbeat_age_seconds"])
        if t["stale"]:
            age = f'<span class="warn">{age} (stale)</span>'
        lag = t["loop_lag_ms"]
        rows.append(
            [
                f'<span class="mono">{escape(t["id"])}</span>',
                f"{t['shard_count']} <span class='muted'>({shard_ranges(t['shards'])})</span>",
                age,
                str(t["triggers"]),
                "-" if lag is None else f"{lag:.1f} ms",
            ]
        )
    return "<h2>Triggerers</h2>" + table(
        ["triggerer", "shards", "heartbeat age", "triggers held", "loop lag p99"], rows
    )


# -- a run -----------------------------------------------------------------------------


def run_page(g: RunGraph, now: float) -> tuple[str, bool]:
    run = g.run
    run_id = run["run_id"]
    end = run["ended_at"] or now
    parts = [
        '<div class="crumbs"><a href="/">runs</a> &rsaquo;</div>',
        f"<h1>{escape(run_id)} {badge(run['state'])}</h1>",
        '<div class="meta">',
        f"<span><b>DAG</b>{escape(run['dag_id'])}</span>",
        f"<span><b>logical date</b>{escape(run['logical_date'])}</span>",
        f"<span><b>started</b>{when(run['created_at'])}</span>",
        f"<span><b>{'ran' if run['ended_at'] else 'running for'}</b>"
        f"{human_seconds(end - run['created_at'])}</span>",
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
        tid = t["task_id"]
        counts = g.mapped.get(tid)
        detail = ""
        if counts is not None or t["map_total"] is not None:
            detail = state_bar(counts or {})
        elif tid in g.waits:
            detail = f'waits for <span class="mono">{escape(g.waits[tid])}</span>'
        waiting_since = t["wait_started_at"] if t["state"] in ("DEFERRED", "SENSING") else None
        started, ended = t["started_at"], t["ended_at"]
        if waiting_since:
            took = f"waiting {human_seconds(now - waiting_since)}"
        elif started:
            took = human_seconds((ended or now) - started)
        else:
            took = "-"
        rows.append(
            [
                f'<a href="{task_href(run_id, tid)}">{escape(tid)}</a>',
                badge(t["state"]),
                f"{t['attempt']} / {t['max_attempts']}",
                when(started),
                took,
                detail,
            ]
        )
    parts.append(
        table(["task", "state", "attempt", "started", "duration", "detail"], rows, "tasks")
    )
    return "".join(parts), run["state"] in ("RUNNING", "QUEUED")


# -- a task ----------------------------------------------------------------------------


def turns(events: Iterable[Row]) -> list[dict[str, Any]]:
    """Stays in a slot (RUNNING) and in the triggerer (DEFERRED), from the transitions."""
    out: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["kind"] != "transition":
            continue
        if e["from_state"] in open_:
            stay = open_.pop(e["from_state"])
            stay.update(ended=e["ts"], outcome=e["to_state"], message=e["message"])
        if e["to_state"] in ("RUNNING", "DEFERRED"):
            stay = {
                "what": "in a slot" if e["to_state"] == "RUNNING" else "waiting (deferred)",
                "state": e["to_state"],
                "attempt": e["attempt"],
                "started": e["ts"],
                "ended": None,
                "outcome": None,
                "message": e["message"] if e["to_state"] == "DEFERRED" else "",
            }
            open_[e["to_state"]] = stay
            out.append(stay)
    return out


def task_page(d: TaskDetail, now: float) -> tuple[str, bool]:
    row = d.row
    run_id, task_id, idx = row["run_id"], row["task_id"], row["map_index"]
    state = row["state"]
    parts = [
        f'<div class="crumbs"><a href="/">runs</a> &rsaquo; '
        f'<a href="{run_href(run_id)}">{escape(run_id)}</a> &rsaquo;'
        + (
            f' <a href="{task_href(run_id, task_id)}">{escape(task_id)}</a> &rsaquo;'
            if idx >= 0
            else ""
        )
        + "</div>",
        f"<h1>{escape(task_name(task_id, idx))} {badge(state)}</h1>",
        '<div class="meta">',
        f"<span><b>attempt</b>{row['attempt']} of {row['max_attempts']}</span>",
        f"<span><b>trigger rule</b>{escape(row['trigger_rule'])}</span>",
        f"<span><b>started</b>{when(row['started_at'])}</span>",
        f"<span><b>ended</b>{when(row['ended_at'])}</span>",
        f"<span><b>last change</b>{when(row['updated_at'])}</span>",
        "</div>",
    ]
    parts.append(_waiting_panel(d, now))
    if d.instance_counts or row["map_total"] is not None:
        parts.append(_instances(d))
    stays = turns(d.events)
    parts.append("<h2>Attempts</h2>")
    if stays:
        rows = [
            [
                str(s["attempt"]),
                escape(s["what"]),
                when(s["started"]),
                human_seconds((s["ended"] or now) - s["started"])
                + ("" if s["ended"] else " so far"),
                badge(s["outcome"]) if s["outcome"] else '<span class="muted">now</span>',
                f'<span class="mono">{escape(s["message"])}</span>',
            ]
            for s in stays
        ]
        parts.append(
            table(["attempt", "where", "from", "for", "then", "message"], rows, "attempts")
        )
    else:
        parts.append('<p class="empty">Not started yet.</p>')
    if row["output"] is not None and state == "SUCCESS":
        text = row["output"]
        text = text if len(text) <= 4000 else text[:4000] + " \u2026"
        parts.append(f'<h2>Output</h2><pre class="mono">{escape(text)}</pre>')
    parts.append(_log(d.events))
    return "".join(parts), state not in TERMINAL


def _waiting_panel(d: TaskDetail, now: float) -> str:
    row = d.row
    state = row["state"]
    if state not in ("DEFERRED", "SENSING", "RETRYING"):
        return ""
    items: list[tuple[str, str]] = []
    if state == "RETRYING":
        last = next(
            (e for e in reversed(d.events) if e["to_state"] == "RETRYING"),
            None,
        )
        first = next((e for e in d.events if e["to_state"] == "RETRYING"), None)
        title = "Retrying"
        items.append(("next attempt", f"{row['attempt']} of {row['max_attempts']}"))
        items.append(("due in", human_seconds((row["ready_at"] or now) - now)))
        if first is not None:
            items.append(("retrying for", human_seconds(now - first["ts"])))
        if last is not None:
            items.append(("last failure", f'<span class="mono">{escape(last["message"])}</span>'))
    else:
        since = row["wait_started_at"] or row["updated_at"]
        title = "Waiting in the triggerer" if state == "DEFERRED" else "Sensing (reschedule mode)"
        items.append(("waiting for", human_seconds(now - since)))
        if row["wait_timeout_at"]:
            span = row["wait_timeout_at"] - since
            used = (now - since) / span if span > 0 else 1.0
            used_html = f"{used:.0%}"
            if used >= 0.8:
                used_html = f'<span class="warn">{used_html}</span>'
            items.append(
                ("gives up at", f"{when(row['wait_timeout_at'])} ({used_html} of its timeout used)")
            )
        if state == "DEFERRED":
            g = d.trigger
            if g is None:
                items.append(("trigger", '<span class="warn">trigger row missing</span>'))
            else:
                items.append(
                    ("waits for", f'<span class="mono">{escape(g["description"] or "")}</span>')
                )
                items.append(("trigger", f'<span class="mono">{escape(g["classpath"])}</span>'))
                kwargs = g["kwargs"]
                with contextlib.suppress(ValueError):
                    kwargs = json.dumps(json.loads(kwargs), indent=1, sort_keys=True)
                items.append(("kwargs", f'<pre class="mono">{escape(kwargs)}</pre>'))
                items.append(("poke hash", f'<span class="mono">{escape(g["poke_hash"])}</span>'))
                others = max(0, d.waiters - 1)
                items.append(
                    (
                        "shared check",
                        f"{others} other task{'s' if others != 1 else ''} wait"
                        f"{'' if others != 1 else 's'} on the same check",
                    )
                )
                live = g["lease_owner"] is not None and (g["lease_expires_at"] or 0) >= now
                owner = (
                    f'<span class="mono">{escape(g["lease_owner"])}</span>'
                    if live
                    else '<span class="warn">no live triggerer holds this shard</span>'
                )
                items.append(("shard", f"{g['shard']}, checked by {owner}"))
            items.append(
                (
                    "when it fires",
                    f"resumes at <span class='mono'>{escape(row['next_method'])}</span>"
                    if row["next_method"]
                    else "the sensor succeeds (no worker needed)",
                )
            )
        else:
            last = next(
                (e for e in reversed(d.events) if e["to_state"] == "SENSING"),
                None,
            )
            if last is not None:
                items.append(("last check", f'<span class="mono">{escape(last["message"])}</span>'))
            items.append(("next check in", human_seconds((row["ready_at"] or now) - now)))
    body = "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<div class="panel st-{state}"><h2>{badge(state)} {title}</h2><dl>{body}</dl></div>'


def _instances(d: TaskDetail) -> str:
    row = d.row
    total = sum(d.instance_counts.values())
    parts = [f"<h2>Mapped instances ({total})</h2>", state_bar(d.instance_counts)]
    rows = [
        [
            f'<a href="{task_href(row["run_id"], row["task_id"], i["map_index"])}">'
            f"{escape(task_name(row['task_id'], i['map_index']))}</a>",
            badge(i["state"]),
            str(i["attempt"]),
            when(i["updated_at"]),
        ]
        for i in d.instances
    ]
    if rows:
        parts.append(table(["instance", "state", "attempt", "last change"], rows, "instances"))
    if total > len(d.instances) and len(d.instances) >= INSTANCES_SHOWN:
        parts.append(f'<p class="muted">the first {len(d.instances)} of {total} shown</p>')
    return "".join(parts)


def _log(events: list[Row]) -> str:
    if not events:
        return '<h2>Log</h2><p class="empty">No entries.</p>'
    rows = []
    for e in events:
        kind = e["kind"]
        if kind == "transition":
            msg = (
                f"{badge(e['from_state'] or '?')} &rarr; {badge(e['to_state'] or '?')} "
                f"{escape(e['message'])}"
            )
        elif kind == "error":
            msg = f'<pre class="tb">{escape(e["message"])}</pre>'
        else:
            msg = escape(e["message"])
        rows.append(
            f'<tr class="k-{escape(kind)}"><td class="mono">{when(e["ts"])}'
            f'.{int((e["ts"] % 1) * 1000):03d}</td><td class="num">'
            f"{'' if e['attempt'] is None else e['attempt']}</td>"
            f'<td>{escape(kind)}</td><td class="msg">{msg}</td></tr>'
        )
    return (
        f"<h2>Log ({len(events)} entries)</h2>"
        '<table class="log"><thead><tr><th>time</th><th>attempt</th><th>kind</th>'
        f"<th>entry</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
