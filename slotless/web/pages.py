"""What each page shows, as a :class:`~.render.View` over one read of the store.

Each page's handler (app.py) reads one typed view in one snapshot of the store (the run
list a :class:`~slotless.views.StatusView`, the DAGs a ``DagsPage``, a run a ``RunGraph``,
a task a ``TaskDetail``: :mod:`executor.store.inspecting`) and gives it to one function
here, which adds what the template needs beyond it (the buttons the state allows, a
waiting task's panel). The HTML is in templates/, escaped there; the page and its live
poll are the same template, so they cannot disagree.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from executor.rows import TaskRow
from executor.runnames import logical_shown
from executor.sensing import SENSED
from executor.states import RUN_TERMINAL
from executor.store.grid import TaskRunTime
from executor.store.inspecting import INSTANCES_SHOWN, RUNS_PER_DAG, DagsPage, RunGraph, TaskDetail
from executor.store.viewrows import HeldRow
from executor.taskgroups import run_tree
from triggers.base import clip

from ..schedule_shown import schedule_shown
from ..status import failure_cause, human_seconds, shard_ranges
from ..views import WAITING, StatusView, task_name, turns
from . import graph
from .charts import Chart, bar_chart
from .render import View, run_href, task_href, when, with_query
from .trigger_form import conf_text

ALL_STATES = graph.STATE_ORDER
# A run's states, as the DAGs page's squares draw them. QUEUED (a run waiting for its turn)
# is drawn before any run is queued, so that the page is ready when runs start to queue.
RUN_STATES = ("QUEUED", "RUNNING", "PAUSED", "SUCCESS", "FAILED", "CANCELLED")
# A succeeded task's output is shown up to this many characters.
OUTPUT_SHOWN = 4000
_WAITING_KINDS = (
    ("DEFERRED", "in the triggerer: healthy while within its timeout"),
    ("SENSING", "reschedule-mode sensors between checks"),
    ("RETRYING", "an attempt failed; sick if it lasts"),
)


def index_view(s: StatusView) -> View:
    """The run list: runs, waiting tasks, pools and queues, triggerers."""
    kinds = [
        (
            state,
            what,
            ["task", "retrying for", "next", "last failure"]
            if state == "RETRYING"
            else ["task", "waiting for", "waits for", "timeout used"],
        )
        for state, what in _WAITING_KINDS
        if s.waiting[state].count
    ]
    ctx = {
        "s": s,
        "order": ALL_STATES,
        "waiting_states": WAITING,
        "waiting_kinds": kinds,
        "failure_cause": failure_cause,
        "shard_ranges": shard_ranges,
    }
    return View("index.html", "runs", ctx, live=s.live)


def dags_view(data: DagsPage, signed_in: bool, kept: dict[str, str], chosen: str) -> View:
    """Each catalogued DAG with its newest runs, the broken files, and (signed in) the
    trigger form: ``kept`` is a refused trigger's form (its conf back in the box),
    ``chosen`` the DAG a row's "trigger" link picked."""
    again = kept.get("action") == "trigger"
    trigger = {
        "dag_id": kept.get("dag_id", "") if again else chosen,
        "conf": kept.get("conf", "") if again else "",
    }
    ctx = {
        "data": data,
        "rows": [(d, schedule_shown(d), data.runs.get(d.dag_id, [])) for d in data.dags],
        "run_states": RUN_STATES,
        "runs_per_dag": RUNS_PER_DAG,
        "signed_in": signed_in,
        "trigger": trigger,
    }
    return View("dags.html", "DAGs", ctx, live=data.live)


def run_view(g: RunGraph, fold: Sequence[str] = ()) -> View:
    """A run: its state and the buttons that state allows, its graph (the task groups in
    ``fold`` folded), its tasks."""
    run, now = g.run, g.now
    # Ready tasks a pool or a queue holds back say so in their box.
    waits = dict(g.waits)
    for r, why in g.held:
        held = HeldRow.of(r)
        waits.setdefault(task_name(held.task_id, held.map_index), why.removeprefix("waiting for "))
    actions = []
    if run.state not in RUN_TERMINAL:
        actions.append(("cancel", "cancel run"))
    if run.state == "FAILED":
        actions.append(("retry", "retry failed tasks"))
    if run.state == "PAUSED":
        actions.append(("resume", "resume (rerun failed tasks)"))
    notes = []
    if run.state == "PAUSED":
        notes.append(f"needs attention: {run.state_reason or 'paused'}")
    if run.deadline_missed_at and run.state not in RUN_TERMINAL:
        notes.append(f"missed its deadline ({when(run.deadline_at)})")
    elif run.state_reason and run.state in ("FAILED", "CANCELLED"):
        notes.append(run.state_reason)
    tasks = []
    for t in g.tasks:
        counts = g.mapped.get(t.task_id)
        if counts is None and t.map_total is not None:
            counts = {}
        tasks.append((t, _took(t, now), counts, waits.get(t.task_id, "")))
    ctx = {
        "run": run,
        "now": now,
        "actions": actions,
        "notes": notes,
        "order": ALL_STATES,
        "drawing": graph.drawing(
            g.tasks,
            g.edges,
            g.mapped,
            lambda tid: task_href(run.run_id, tid),
            notes=waits,
            tree=run_tree(g.shape, [t.task_id for t in g.tasks]),
            folded=fold,
            fold_href=lambda f: with_query(run_href(run.run_id), {"fold": list(f)}),
        ),
        "tasks": tasks,
        "conf_text": conf_text(run.conf),
    }
    return View("run.html", run.run_id, ctx, live=g.live)


def task_view(d: TaskDetail) -> View:
    """A task: its state and the buttons it allows, its wait, instances, attempts, log."""
    row = d.row
    name = task_name(row.task_id, row.map_index)
    actions: list[tuple[str, dict[str, str], str]] = []
    if row.map_index < 0 and row.state != "RUNNING":  # instances are cleared with their task
        ids = {"run_id": row.run_id, "task_id": row.task_id}
        actions.append(("clear", ids, "clear"))
        actions.append(("clear", {**ids, "downstream": "1"}, "clear with downstream"))
        for outcome in ("success", "failed"):
            if row.state != outcome.upper():
                actions.append(("mark", {**ids, "outcome": outcome}, f"mark {outcome}"))
    ctx = {
        "d": d,
        "row": row,
        "now": d.now,
        "name": name,
        "actions": actions,
        "panel": _waiting_panel(d),
        "mapped": bool(d.instance_counts) or row.map_total is not None,
        "order": ALL_STATES,
        "instances_shown": INSTANCES_SHOWN,
        "stays": turns(d.events),
        "output": _output(row),
        "task_name": task_name,
    }
    return View("task.html", f"{name} - {row.run_id}", ctx, live=d.live)


def login_view(enabled: bool, back: str, *, wrong: bool = False) -> View:
    return View("login.html", "sign in", {"enabled": enabled, "back": back, "wrong": wrong})


def forbidden_view(why: str) -> View:
    return View("forbidden.html", "forbidden", {"why": why})


def error_view(exc: BaseException) -> View:
    return View("error.html", "error", {"error": f"{type(exc).__name__}: {exc}"})


# -- pieces ---------------------------------------------------------------------------------


def _took(t: TaskRow, now: float) -> str:
    if t.state in ("DEFERRED", "SENSING") and t.wait_started_at:
        return f"waiting {human_seconds(now - t.wait_started_at)}"
    return human_seconds((t.ended_at or now) - t.started_at) if t.started_at else "-"


def _output(row: TaskRow) -> str | None:
    """What a succeeded task returned, as stored (JSON text), cut at OUTPUT_SHOWN."""
    text = row.output
    if text is None or row.state != "SUCCESS":
        return None
    return text if len(text) <= OUTPUT_SHOWN else text[:OUTPUT_SHOWN] + " \u2026"


Item = tuple[str, str, str]  # (label, text, style: "" | "mono" | "warn" | "pre")


def _waiting_panel(d: TaskDetail) -> dict[str, Any] | None:
    """What a waiting task waits for, how long, and what happens next (None: not waiting)."""
    row, now = d.row, d.now
    if row.state == "RETRYING":
        return {"title": "Retrying", "items": _retrying(d)}
    if row.state not in ("DEFERRED", "SENSING"):
        return None
    since = row.wait_started_at or row.updated_at
    items: list[Item] = [("waiting for", human_seconds(now - since), "")]
    if row.wait_timeout_at:
        span = row.wait_timeout_at - since
        used = (now - since) / span if span > 0 else 1.0
        items.append(
            (
                "gives up at",
                f"{when(row.wait_timeout_at)} ({used:.0%} of its timeout used)",
                "warn" if used >= 0.8 else "",
            )
        )
    if row.state == "DEFERRED":
        items += _deferred(d)
        return {"title": "Waiting in the triggerer", "items": items}
    last = next((e for e in reversed(d.events) if e.to_state == "SENSING"), None)
    if last is not None:
        items.append(("last check", last.message, "mono"))
    items.append(("next check in", human_seconds((row.ready_at or now) - now), ""))
    return {"title": "Sensing (reschedule mode)", "items": items}


def _retrying(d: TaskDetail) -> list[Item]:
    row, now = d.row, d.now
    items: list[Item] = [
        ("next attempt", f"{row.attempt} of {row.max_attempts}", ""),
        ("due in", human_seconds((row.ready_at or now) - now), ""),
    ]
    first = next((e for e in d.events if e.to_state == "RETRYING"), None)
    last = next((e for e in reversed(d.events) if e.to_state == "RETRYING"), None)
    if first is not None:
        items.append(("retrying for", human_seconds(now - first.ts), ""))
    if last is not None:
        items.append(("last failure", last.message, "mono"))
    return items


def _deferred(d: TaskDetail) -> list[Item]:
    row, g = d.row, d.trigger
    items: list[Item] = []
    if g is None:
        items.append(("trigger", "trigger row missing", "warn"))
    else:
        kwargs = g.kwargs
        with contextlib.suppress(ValueError):
            kwargs = json.dumps(json.loads(kwargs), indent=1, sort_keys=True)
        others = max(0, d.waiters - 1)
        items += [
            ("waits for", clip(g.description or ""), "mono"),
            ("trigger", g.classpath, "mono"),
            ("kwargs", kwargs, "pre"),
            ("poke hash", g.poke_hash, "mono"),
            (
                "shared check",
                f"{others} other task{'s' if others != 1 else ''} wait"
                f"{'' if others != 1 else 's'} on the same check",
                "",
            ),
        ]
        if g.checked(d.now):
            items.append(("shard", f"{g.shard}, checked by {g.lease_owner or ''}", ""))
        else:
            items.append(("shard", f"{g.shard}: no live triggerer holds this shard", "warn"))
    if row.next_method == SENSED:
        fires = "the sensor succeeds on a worker, which records its outlets' asset events"
    elif row.next_method:
        fires = f"resumes at {row.next_method}"
    else:
        fires = "the sensor succeeds (no worker needed)"
    items.append(("when it fires", fires, ""))
    return items


def durations(times: Sequence[TaskRunTime], task_id: str, map_index: int, now: float) -> Chart:
    """The task's durations over its DAG's newest runs, oldest first, as a chart."""
    return bar_chart(
        [
            (
                f"{logical_shown(t)} \u00b7 {t.run_id}",
                t.seconds(now),
                t.state,
                task_href(t.run_id, task_id, map_index),
            )
            for t in times
        ]
    )
