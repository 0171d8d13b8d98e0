"""`slotless status`: what runs, what waits (and for what), what is sick, who checks.

Waiting is healthy and failing is not, so the three waiting states are shown apart:
DEFERRED (the triggerer checks), SENSING (a reschedule-mode sensor between checks) and
RETRYING (an attempt failed; the next one is due later). Each waiting task comes with how
long it has been waiting and what it waits for. :func:`collect` reads it all into one
typed :class:`~slotless.views.StatusView`: ``--json`` prints its JSON, :func:`render` the
same view for people, and the web page's run list and ``/api/status`` use it too.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from executor.runnames import logical_shown
from executor.store import Store, open_store
from executor.store.catalogue import UnknownDag
from executor.store.viewrows import AttentionRow, DeferredRow, HeldRow, RetryingRow, WaitingRow
from executor.taskgroups import GroupNode, group_tree, tree_from_ids
from triggers.base import SHARDS, clip

from . import airflow_status
from .options import db_opt
from .views import (
    WAITING,
    AnyWaiting,
    Attention,
    DeferredTask,
    HeldBack,
    PoolShown,
    QueueShown,
    RetryingTask,
    RunShown,
    SensingTask,
    Shards,
    StatusView,
    TriggererShown,
    TriggerShown,
    Waiting,
)

# A triggerer whose heartbeat is older than this is shown as stale (two default lease TTLs).
STALE_AFTER = 30.0

STATE_STYLE = {
    "QUEUED": "dim cyan",
    "PAUSED": "bold black on yellow",  # a person must resume or clear it
    "CANCELLED": "dim red",
    "PENDING": "white",
    "RUNNING": "bold green",
    "SUCCESS": "green",
    "FAILED": "bold red",
    "UPSTREAM_FAILED": "red",
    "SKIPPED": "dim",
    "RETRYING": "bold yellow",
    "SENSING": "cyan",
    "DEFERRED": "magenta",
}

_CHECKED = re.compile(r"^checked (.*): not yet; next in .*$", re.DOTALL)


def add_commands(sub: Any) -> None:
    status = sub.add_parser(
        "status", help="runs by state; waiting tasks (what for, how long); triggerers"
    )
    db_opt(status)
    status.add_argument("--limit", type=int, default=20, help="runs, and tasks per waiting state")
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--run", metavar="RUN_ID", help="that run's tasks and their states, in their task groups"
    )
    airflow_status.add_options(status)
    status.set_defaults(func=status_command)


async def status_command(args: argparse.Namespace) -> int:
    if args.airflow:
        return await airflow_status.airflow_command(args)
    store = await open_store(args.db, create=False)
    try:
        if args.run:
            return await _run_command(store, args.run, args.json)
        data = await collect(store, args.limit)
    finally:
        await store.close()
    if args.json:
        print(json.dumps(data.to_json()))
    else:
        render(data, Console())
    return 0


async def collect(store: Store, limit: int = 20, now: float | None = None) -> StatusView:
    """Everything ``slotless status`` shows, read at ``now`` (default: the store's clock), in
    one snapshot of the store (``store.views.status``): its counts, lists and bars agree."""
    now = store.clock() if now is None else now
    rows = await store.views.status(limit, now)
    waiting: dict[str, Waiting] = {}
    for state in WAITING:
        s = rows.waiting_counts.get(state)
        tasks = [waiting_task(r, now) for r in rows.waiting[state]]
        oldest = max((t.for_seconds for t in tasks), default=None)
        waiting[state] = Waiting(s.n if s else 0, oldest, tasks)
    held: dict[str, list[int]] = {}
    for lease in rows.leases:
        if lease.owner is not None and (lease.expires_at or 0) >= now:
            held.setdefault(lease.owner, []).append(lease.shard)
    triggerers = []
    for t in rows.triggerers:
        shards = sorted(held.get(t.id, []))
        age = max(0.0, now - t.seen_at)
        triggerers.append(
            TriggererShown(
                id=t.id,
                started_at=t.started_at,
                heartbeat_at=t.seen_at,
                heartbeat_age_seconds=round(age, 3),
                stale=age > STALE_AFTER,
                shards=shards,
                shard_count=len(shards),
                triggers=t.triggers,
                loop_lag_ms=t.loop_lag_ms,
            )
        )
    total = len(rows.leases) or SHARDS
    return StatusView(
        now=now,
        runs_by_state=rows.runs_by_state,
        runs=[
            RunShown(
                r.run_id,
                r.dag_id,
                r.logical_date,
                r.state,
                r.created_at,
                r.ended_at,
                counts,
                r.state_reason,
                r.logical_time,
                logical_shown(r),
                r.run_type,
            )
            for r, counts in rows.runs
        ],
        attention=[attention(r) for r in rows.attention],
        tasks_by_state=rows.tasks_by_state,
        waiting=waiting,
        triggerers=triggerers,
        shards=Shards(total, total - sum(len(v) for v in held.values())),
        pools=[PoolShown(p.name, p.slots, p.used, p.ready) for p in rows.pools],
        queues=[
            QueueShown(q.name, q.declared, q.workers, q.slots, q.ready, q.workers > 0)
            for q in rows.queues
        ],
        held_back=[_held(HeldRow.of(r), why, now) for r, why in rows.held_back],
    )


def _held(r: HeldRow, why: str, now: float) -> HeldBack:
    # Store.held_back_tasks (executor/store/pools.py) returns driver rows: typed here.
    return HeldBack(
        run_id=r.run_id,
        task_id=r.task_id,
        map_index=r.map_index,
        state=r.state,
        pool=r.pool,
        queue=r.queue,
        waits_for=why,
        for_seconds=round(max(0.0, now - (r.ready_at or now)), 3),
    )


def attention(r: AttentionRow) -> Attention:
    """A run a person must look at, and what to do about it."""
    if r.state == "PAUSED":
        why = r.state_reason or "paused"
        todo = f"slotless resume {r.run_id}  (or clear its failed tasks, or cancel it)"
    else:
        assert r.deadline_at is not None  # not paused: past its deadline
        due = datetime.fromtimestamp(r.deadline_at).strftime("%Y-%m-%d %H:%M:%S")
        why = f"missed its deadline {due}; still {r.state}"
        todo = "it goes on running; see what holds it up"
    return Attention(r.run_id, r.dag_id, r.state, why, todo)


def retrying_task(r: RetryingRow, now: float) -> RetryingTask:
    since = r.retrying_since or r.updated_at
    return RetryingTask(
        r.run_id, r.task_id, r.map_index, r.state, r.attempt, r.max_attempts,
        since=since,
        waits_for=f"attempt {r.attempt} of {r.max_attempts}",
        next_attempt_at=r.ready_at,
        last_error=r.last_error,
        for_seconds=_for(since, now),
    )  # fmt: skip


def waiting_task(r: WaitingRow, now: float) -> AnyWaiting:
    if isinstance(r, RetryingRow):
        return retrying_task(r, now)
    head = (r.run_id, r.task_id, r.map_index, r.state, r.attempt, r.max_attempts)
    since = r.wait_started_at or r.updated_at
    timeout_at = r.wait_timeout_at
    span = None if timeout_at is None else timeout_at - since
    used = round((now - since) / span, 4) if span and span > 0 else None
    if isinstance(r, DeferredRow):
        lease_live = r.lease_owner is not None and (r.lease_expires_at or 0) >= now
        return DeferredTask(
            *head,
            since=since,
            timeout_at=timeout_at,
            timeout_used=used,
            waits_for=clip(r.description or r.classpath or "(trigger row missing)"),
            trigger=TriggerShown(
                r.trigger_id,
                r.classpath,
                r.poke_hash,
                r.shard,
                r.description and clip(r.description),
            ),
            checked_by=r.lease_owner if lease_live else None,
            resumes_at=r.next_method,
            for_seconds=_for(since, now),
        )
    last = r.last_message or ""
    m = _CHECKED.match(last)
    return SensingTask(
        *head,
        since=since,
        timeout_at=timeout_at,
        timeout_used=used,
        waits_for=m.group(1) if m else last,
        last_check=last,
        next_check_at=r.ready_at,
        for_seconds=_for(since, now),
    )


def _for(since: float, now: float) -> float:
    return round(max(0.0, now - since), 3)


# -- for people ------------------------------------------------------------------------


def human_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{int(minutes)} min {int(seconds % 60)} s"
    hours = minutes / 60
    if hours < 48:
        return f"{int(hours)} h {int(minutes % 60)} min"
    return f"{int(hours // 24)} d {int(hours % 24)} h"


def shard_ranges(shards: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    parts: list[str] = []
    start = prev = None
    for s in sorted(shards):
        if start is None:
            start = prev = s
        elif s == prev + 1:  # type: ignore[operator]
            prev = s
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = s
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts) or "none"


def states_text(counts: dict[str, int]) -> Text:
    text = Text()
    for i, (state, n) in enumerate(sorted(counts.items())):
        if i:
            text.append("  ")
        text.append(f"{state.lower()}={n}", style=STATE_STYLE.get(state, ""))
    return text


def render(data: StatusView, console: Console) -> None:
    now = data.now
    runs_line = states_text(data.runs_by_state) if data.runs_by_state else Text("none")
    console.print(Text("runs: ").append(runs_line))
    if data.tasks_by_state:
        console.print(Text("tasks of unfinished runs: ").append(states_text(data.tasks_by_state)))

    runs = Table(title="recent runs", title_justify="left")
    # The run id folds rather than ends in "…" on a narrow terminal: it is what a person
    # copies into `slotless logs` or `clear`; the logical time stays on one line.
    runs.add_column("run", overflow="fold")
    runs.add_column("logical time", no_wrap=True)
    for col in ("type", "state", "started", "tasks by state"):
        runs.add_column(col)
    for r in data.runs:
        started = datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M:%S")
        runs.add_row(
            r.run_id,
            r.logical_shown or r.logical_date,
            r.run_type or "-",
            Text(r.state, style=STATE_STYLE.get(r.state, "")),
            started,
            states_text(r.tasks),
        )
    console.print(runs)
    if data.attention:
        need = Table(title="needs attention", title_justify="left", title_style="bold yellow")
        for col in ("run", "state", "why", "what to do"):
            need.add_column(col)
        for a in data.attention:
            need.add_row(a.run_id, Text(a.state, style=STATE_STYLE.get(a.state, "")), a.why, a.todo)
        console.print(need)

    titles = {
        "DEFERRED": "DEFERRED: waiting in the triggerer (healthy while within its timeout)",
        "SENSING": "SENSING: reschedule-mode sensors between checks",
        "RETRYING": "RETRYING: an attempt failed, the next is due (sick if it lasts)",
    }
    for state in WAITING:
        w = data.waiting[state]
        if not w.count:
            continue
        style = STATE_STYLE[state]
        table = Table(title=f"{titles[state]} - {w.count}", title_justify="left")
        table.add_column("task / run", overflow="fold", ratio=3)
        table.add_column("for", justify="right", no_wrap=True)
        if state == "RETRYING":
            table.add_column("next", ratio=2)
            table.add_column("last failure", overflow="fold", ratio=4)
        else:
            table.add_column("waits for", overflow="fold", ratio=4)
            table.add_column("timeout used", justify="right")
            table.add_column("checked by" if state == "DEFERRED" else "next check", ratio=2)
        for t in w.tasks:
            name = Text(t.name, style=style).append(f"\n{t.run_id}", style="dim")
            cells: list[Any] = [name, human_seconds(t.for_seconds)]
            if isinstance(t, RetryingTask):
                due = t.next_attempt_at
                cells.append(f"{t.waits_for} in {human_seconds((due or now) - now)}")
                cells.append(failure_cause(t.last_error))
            else:
                cells.append(t.waits_for)
                used = t.timeout_used
                cells.append(
                    Text(
                        "-" if used is None else f"{used:.0%}",
                        style="bold red" if used is not None and used >= 0.8 else "",
                    )
                )
                if isinstance(t, DeferredTask):
                    cells.append(t.checked_by or Text("nobody (shard not leased)", style="red"))
                else:
                    cells.append(f"in {human_seconds((t.next_check_at or now) - now)}")
            table.add_row(*cells)
        if w.count > len(w.tasks):
            table.caption = f"the {len(w.tasks)} longest of {w.count} shown (--limit)"
        console.print(table)

    _render_pools(data, console)

    trig = Table(title="triggerers", title_justify="left")
    for col in ("triggerer", "shards", "heartbeat age", "triggers held", "loop lag p99"):
        trig.add_column(col)
    for tr in data.triggerers:
        age = Text(human_seconds(tr.heartbeat_age_seconds))
        if tr.stale:
            age.append(" (stale)", style="bold red")
        lag = tr.loop_lag_ms
        trig.add_row(
            tr.id,
            f"{tr.shard_count} ({shard_ranges(tr.shards)})",
            age,
            str(tr.triggers),
            "-" if lag is None else f"{lag:.1f} ms",
        )
    if data.triggerers:
        console.print(trig)
    else:
        console.print(Text("no triggerer is running", style="bold red" if data.deferred else ""))
    unowned = data.shards.unowned
    if unowned and data.deferred:
        console.print(
            Text(
                f"{unowned} of {data.shards.total} shards have no live triggerer: "
                "DEFERRED waits in them are not being checked",
                style="bold red",
            )
        )


# ------------------------------------------------------------ one run's tasks, grouped


async def run_tasks_tree(store: Store, run_id: str) -> dict[str, Any] | None:
    """A run's tasks with their states, in the task groups of its DAG's catalogued shape
    (a task the shape does not hold at the top; a DAG not catalogued, as a run of
    ``slotless run``'s, grouped by the dots in its task ids); None if there is no such
    run. A mapped task shows its instances by state."""
    info = await store.views.run_info(run_id)
    if info is None:
        return None
    rows = await store.views.run_tasks(run_id)
    mapped = await store.views.mapped_counts(run_id)
    try:
        shape = (await store.catalogue.start_spec(info["dag_id"])).shape
    except UnknownDag:
        shape = None
    tree = group_tree(shape) if shape is not None else tree_from_ids([r["task_id"] for r in rows])
    known = set(tree.task_ids())
    states = {
        r["task_id"]: {"state": r["state"], "instances": mapped.get(r["task_id"])} for r in rows
    }

    def node(g: GroupNode, extra: list[str]) -> dict[str, Any]:
        tasks = [t for t in [*g.tasks, *extra] if t in states]
        return {
            "group_id": g.group_id,
            "over": g.over,
            "tasks": [{"task_id": t, **states[t]} for t in tasks],
            "groups": [node(sub, []) for sub in g.groups],
        }

    top = node(tree, [r["task_id"] for r in rows if r["task_id"] not in known])
    return {"run_id": run_id, "dag_id": info["dag_id"], "state": info["state"], **top}


async def _run_command(store: Store, run_id: str, as_json: bool) -> int:
    found = await run_tasks_tree(store, run_id)
    if found is None:
        print(f"slotless status: no run {run_id!r}")
        return 1
    if as_json:
        print(json.dumps(found))
    else:
        render_run_tasks(found, Console())
    return 0


def render_run_tasks(found: dict[str, Any], console: Console) -> None:
    """The tree :func:`run_tasks_tree` read: groups as branches, tasks with their state."""
    state = found["state"]
    root = Tree(Text(f"{found['run_id']} ").append(state, style=STATE_STYLE.get(state, "")))

    def add(branch: Tree, group: dict[str, Any]) -> None:
        for t in group["tasks"]:
            name = t["task_id"].rpartition(".")[2] if group["group_id"] else t["task_id"]
            line = Text(f"{name}  ").append(t["state"], style=STATE_STYLE.get(t["state"], ""))
            if t["instances"]:
                total = sum(t["instances"].values())
                line.append(f"  {total} instances: ", style="dim").append(
                    states_text(t["instances"])
                )
            branch.add(line)
        for sub in group["groups"]:
            label = Text(sub["group_id"].rpartition(".")[2] + "/", style="bold")
            if sub["over"]:
                label.append(f"  mapped over {sub['over']}", style="dim")
            add(branch.add(label), sub)

    add(root, found)
    console.print(root)


def _render_pools(data: StatusView, console: Console) -> None:
    """Pools in use, queues nobody serves, and the ready tasks they hold back."""
    if any(p.slots is not None for p in data.pools):
        table = Table(title="pools", title_justify="left")
        for col in ("pool", "used", "ready"):
            table.add_column(col)
        for p in data.pools:
            used = Text(p.used_text, style="bold yellow" if p.full else "")
            table.add_row(p.name, used, str(p.ready))
        console.print(table)
    for q in data.queues:
        if q.stranded:
            console.print(
                Text(
                    f"queue {q.name}: {q.ready} task(s) ready, no live worker serves it "
                    f"(slotless worker --queues {q.name})",
                    style="bold red",
                )
            )
    held = data.held_back
    if held:
        table = Table(
            title=f"HELD BACK: ready, waiting for a pool or a queue - {len(held)}",
            title_justify="left",
        )
        table.add_column("task / run", overflow="fold", ratio=3)
        table.add_column("for", justify="right", no_wrap=True)
        table.add_column("waits for", overflow="fold", ratio=4)
        for h in held:
            name = Text(h.name).append(f"\n{h.run_id}", style="dim")
            table.add_row(name, human_seconds(h.for_seconds), h.waits_for)
        console.print(table)


_FAILED = re.compile(r"^attempt \d+ of \d+ failed: (.*?)(; retrying in [\d.]+ s)?$", re.DOTALL)


def failure_cause(message: str | None, width: int = 300) -> str:
    """The cause out of a retry transition's message, on one line."""
    if not message:
        return ""
    m = _FAILED.match(message)
    text = m.group(1) if m else message
    return " ".join(text.split())[:width]
