"""`slotless status`: what runs, what waits (and for what), what is sick, who checks.

Waiting is healthy and failing is not, so the three waiting states are shown apart:
DEFERRED (the triggerer checks), SENSING (a reschedule-mode sensor between checks) and
RETRYING (an attempt failed; the next one is due later). Each waiting task comes with how
long it has been waiting and what it waits for. :func:`collect` builds the JSON
(``--json``); :func:`render` prints the same data for people.
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

from executor.store import Row, Store, open_store
from triggers.base import SHARDS, clip

from .options import db_opt

WAITING = ("DEFERRED", "SENSING", "RETRYING")
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
    status.set_defaults(func=status_command)


async def status_command(args: argparse.Namespace) -> int:
    store = await open_store(args.db, create=False)
    try:
        data = await collect(store, args.limit)
    finally:
        await store.close()
    if args.json:
        print(json.dumps(data))
    else:
        render(data, Console())
    return 0


async def collect(store: Store, limit: int = 20, now: float | None = None) -> dict[str, Any]:
    """Everything ``slotless status`` shows, as plain JSON-able data."""
    now = store.clock() if now is None else now
    runs = await store.recent_runs(limit)
    summary = await store.waiting_summary(now)
    waiting: dict[str, Any] = {}
    for state in WAITING:
        s = summary.get(state)
        count = s["n"] if s else 0
        rows = await store.waiting_tasks(state, limit) if count else []
        tasks = [waiting_task(r, now) for r in rows]
        oldest = max((t["for_seconds"] for t in tasks), default=None)
        waiting[state] = {"count": count, "oldest_seconds": oldest, "tasks": tasks}
    leases = await store.shard_leases()
    held: dict[str, list[int]] = {}
    for lease in leases:
        if lease["owner"] is not None and (lease["expires_at"] or 0) >= now:
            held.setdefault(lease["owner"], []).append(lease["shard"])
    triggerers = []
    for r in await store.list_triggerers():
        shards = sorted(held.get(r["id"], []))
        age = max(0.0, now - r["seen_at"])
        triggerers.append(
            {
                "id": r["id"],
                "started_at": r["started_at"],
                "heartbeat_at": r["seen_at"],
                "heartbeat_age_seconds": round(age, 3),
                "stale": age > STALE_AFTER,
                "shards": shards,
                "shard_count": len(shards),
                "triggers": r["triggers"],
                "loop_lag_ms": r["loop_lag_ms"],
            }
        )
    owned = sum(len(v) for v in held.values())
    pools = await store.pools()
    queues = await store.queues()
    held_back = await store.held_back_tasks(limit)
    return {
        "now": now,
        "runs_by_state": await store.run_states(),
        "runs": [
            {
                "run_id": r["run_id"],
                "dag_id": r["dag_id"],
                "logical_date": r["logical_date"],
                "state": r["state"],
                "created_at": r["created_at"],
                "ended_at": r["ended_at"],
                "tasks": counts,
                "reason": r["state_reason"],
            }
            for r, counts in runs
        ],
        "attention": [attention(r) for r in await store.runs_needing_attention(limit)],
        "tasks_by_state": await store.live_task_states(),
        "waiting": waiting,
        "triggerers": triggerers,
        "shards": {"total": len(leases) or SHARDS, "unowned": (len(leases) or SHARDS) - owned},
        # Issue 14: pools in use, queues and who serves them, and ready tasks they hold back.
        "pools": [
            {"name": p.name, "slots": p.slots, "used": p.used, "ready": p.ready} for p in pools
        ],
        "queues": [
            {
                "name": q.name,
                "declared": q.declared,
                "workers": q.workers,
                "slots": q.slots,
                "ready": q.ready,
                "served": q.workers > 0,
            }
            for q in queues
        ],
        "held_back": [
            {
                "run_id": r["run_id"],
                "task_id": r["task_id"],
                "map_index": r["map_index"],
                "state": r["state"],
                "pool": r["pool"],
                "queue": r["queue"],
                "waits_for": why,
                "for_seconds": round(max(0.0, now - (r["ready_at"] or now)), 3),
            }
            for r, why in held_back
        ],
    }


def attention(r: Row) -> dict[str, Any]:
    """A run a person must look at, and what to do about it."""
    if r["state"] == "PAUSED":
        why = r["state_reason"] or "paused"
        todo = f"slotless resume {r['run_id']}  (or clear its failed tasks, or cancel it)"
    else:
        due = datetime.fromtimestamp(r["deadline_at"]).strftime("%Y-%m-%d %H:%M:%S")
        why = f"missed its deadline {due}; still {r['state']}"
        todo = "it goes on running; see what holds it up"
    return {"run_id": r["run_id"], "dag_id": r["dag_id"], "state": r["state"], "why": why,
            "todo": todo}  # fmt: skip


def waiting_task(r: Row, now: float) -> dict[str, Any]:
    state = r["state"]
    out: dict[str, Any] = {
        "run_id": r["run_id"],
        "task_id": r["task_id"],
        "map_index": r["map_index"],
        "state": state,
        "attempt": r["attempt"],
        "max_attempts": r["max_attempts"],
    }
    if state == "RETRYING":
        since = r["retrying_since"] or r["updated_at"]
        due = r["ready_at"]
        out.update(
            since=since,
            waits_for=f"attempt {r['attempt']} of {r['max_attempts']}",
            next_attempt_at=due,
            last_error=r["last_error"],
        )
    else:
        since = r["wait_started_at"] or r["updated_at"]
        timeout_at = r["wait_timeout_at"]
        span = None if timeout_at is None else timeout_at - since
        out.update(
            since=since,
            timeout_at=timeout_at,
            timeout_used=round((now - since) / span, 4) if span and span > 0 else None,
        )
        if state == "DEFERRED":
            lease_live = r["lease_owner"] is not None and (r["lease_expires_at"] or 0) >= now
            out.update(
                waits_for=clip(r["description"] or r["classpath"] or "(trigger row missing)"),
                trigger={
                    "id": r["trigger_id"],
                    "classpath": r["classpath"],
                    "poke_hash": r["poke_hash"],
                    "shard": r["shard"],
                    "description": r["description"] and clip(r["description"]),
                },
                checked_by=r["lease_owner"] if lease_live else None,
                resumes_at=r["next_method"],
            )
        else:
            last = r["last_message"] or ""
            m = _CHECKED.match(last)
            out.update(
                waits_for=m.group(1) if m else last,
                last_check=last,
                next_check_at=r["ready_at"],
            )
    out["for_seconds"] = round(max(0.0, now - since), 3)
    return out


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


def task_name(t: dict[str, Any]) -> str:
    return t["task_id"] if t["map_index"] < 0 else f"{t['task_id']}[{t['map_index']}]"


def render(data: dict[str, Any], console: Console) -> None:
    now = data["now"]
    runs_line = states_text(data["runs_by_state"]) if data["runs_by_state"] else Text("none")
    console.print(Text("runs: ").append(runs_line))
    if data["tasks_by_state"]:
        console.print(
            Text("tasks of unfinished runs: ").append(states_text(data["tasks_by_state"]))
        )

    runs = Table(title="recent runs", title_justify="left")
    for col in ("run", "logical date", "state", "started", "tasks by state"):
        runs.add_column(col)
    for r in data["runs"]:
        started = datetime.fromtimestamp(r["created_at"]).strftime("%Y-%m-%d %H:%M:%S")
        runs.add_row(
            r["run_id"],
            r["logical_date"],
            Text(r["state"], style=STATE_STYLE.get(r["state"], "")),
            started,
            states_text(r["tasks"]),
        )
    console.print(runs)
    if data["attention"]:
        need = Table(title="needs attention", title_justify="left", title_style="bold yellow")
        for col in ("run", "state", "why", "what to do"):
            need.add_column(col)
        for a in data["attention"]:
            mark = Text(a["state"], style=STATE_STYLE.get(a["state"], ""))
            need.add_row(a["run_id"], mark, a["why"], a["todo"])
        console.print(need)

    titles = {
        "DEFERRED": "DEFERRED: waiting in the triggerer (healthy while within its timeout)",
        "SENSING": "SENSING: reschedule-mode sensors between checks",
        "RETRYING": "RETRYING: an attempt failed, the next is due (sick if it lasts)",
    }
    for state in WAITING:
        w = data["waiting"][state]
        if not w["count"]:
            continue
        style = STATE_STYLE[state]
        table = Table(title=f"{titles[state]} - {w['count']}", title_justify="left")
        table.add_column("task / run", overflow="fold", ratio=3)
        table.add_column("for", justify="right", no_wrap=True)
        if state == "RETRYING":
            table.add_column("next", ratio=2)
            table.add_column("last failure", overflow="fold", ratio=4)
        else:
            table.add_column("waits for", overflow="fold", ratio=4)
            table.add_column("timeout used", justify="right")
            table.add_column("checked by" if state == "DEFERRED" else "next check", ratio=2)
        for t in w["tasks"]:
            name = Text(task_name(t), style=style).append(f"\n{t['run_id']}", style="dim")
            cells: list[Any] = [name, human_seconds(t["for_seconds"])]
            if state == "RETRYING":
                due = t["next_attempt_at"]
                cells.append(f"{t['waits_for']} in {human_seconds((due or now) - now)}")
                cells.append(failure_cause(t["last_error"]))
            else:
                cells.append(t["waits_for"])
                used = t["timeout_used"]
                cells.append(
                    Text(
                        "-" if used is None else f"{used:.0%}",
                        style="bold red" if used is not None and used >= 0.8 else "",
                    )
                )
                if state == "DEFERRED":
                    cells.append(t["checked_by"] or Text("nobody (shard not leased)", style="red"))
                else:
                    cells.append(f"in {human_seconds((t['next_check_at'] or now) - now)}")
            table.add_row(*cells)
        if w["count"] > len(w["tasks"]):
            table.caption = f"the {len(w['tasks'])} longest of {w['count']} shown (--limit)"
        console.print(table)

    _render_pools(data, console)

    trig = Table(title="triggerers", title_justify="left")
    for col in ("triggerer", "shards", "heartbeat age", "triggers held", "loop lag p99"):
        trig.add_column(col)
    for t in data["triggerers"]:
        age = Text(human_seconds(t["heartbeat_age_seconds"]))
        if t["stale"]:
            age.append(" (stale)", style="bold red")
        lag = t["loop_lag_ms"]
        trig.add_row(
            t["id"],
            f"{t['shard_count']} ({shard_ranges(t['shards'])})",
            age,
            str(t["triggers"]),
            "-" if lag is None else f"{lag:.1f} ms",
        )
    if data["triggerers"]:
        console.print(trig)
    else:
        console.print(Text("no triggerer is running", style="bold red" if _deferred(data) else ""))
    unowned = data["shards"]["unowned"]
    if unowned and _deferred(data):
        console.print(
            Text(
                f"{unowned} of {data['shards']['total']} shards have no live triggerer: "
                "DEFERRED waits in them are not being checked",
                style="bold red",
            )
        )


def _render_pools(data: dict[str, Any], console: Console) -> None:
    """Pools in use, queues nobody serves, and the ready tasks they hold back (issue 14)."""
    limited = [p for p in data["pools"] if p["slots"] is not None]
    if limited:
        table = Table(title="pools", title_justify="left")
        for col in ("pool", "used", "ready"):
            table.add_column(col)
        for p in data["pools"]:
            size = "unlimited" if p["slots"] is None else str(p["slots"])
            full = p["slots"] is not None and p["used"] >= p["slots"]
            table.add_row(
                p["name"], Text(f"{p['used']}/{size}", style="bold yellow" if full else ""),
                str(p["ready"]),
            )  # fmt: skip
        console.print(table)
    for q in data["queues"]:
        if q["ready"] and not q["served"]:
            console.print(
                Text(
                    f"queue {q['name']}: {q['ready']} task(s) ready, no live worker serves it "
                    f"(slotless worker --queues {q['name']})",
                    style="bold red",
                )
            )
    held = data["held_back"]
    if held:
        table = Table(
            title=f"HELD BACK: ready, waiting for a pool or a queue - {len(held)}",
            title_justify="left",
        )
        table.add_column("task / run", overflow="fold", ratio=3)
        table.add_column("for", justify="right", no_wrap=True)
        table.add_column("waits for", overflow="fold", ratio=4)
        for t in held:
            name = Text(task_name(t)).append(f"\n{t['run_id']}", style="dim")
            table.add_row(name, human_seconds(t["for_seconds"]), t["waits_for"])
        console.print(table)


_FAILED = re.compile(r"^attempt \d+ of \d+ failed: (.*?)(; retrying in [\d.]+ s)?$", re.DOTALL)


def failure_cause(message: str | None, width: int = 300) -> str:
    """The cause out of a retry transition's message, on one line."""
    if not message:
        return ""
    m = _FAILED.match(message)
    text = m.group(1) if m else message
    return " ".join(text.split())[:width]


def _deferred(data: dict[str, Any]) -> bool:
    return bool(data["waiting"]["DEFERRED"]["count"])
