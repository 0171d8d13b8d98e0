"""`slotless run`'s live view: the run as the store has it, redrawn a few times a second.

Tasks by state, a bar per mapped task, what each waiting sensor waits for and since when,
what each retrying task failed with, the time elapsed. :func:`follow` is a task of its own
beside the worker and only reads (:meth:`Views.run_progress`: one run's rows, the waits
limited); it waits at least 20 times as long as a read took, so that reading costs the run
at most ~5% of the store's time (SQLite serves a process's reads and writes in turn).
:func:`render` builds the view from what was read, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from executor.mapping import describe
from executor.states import TERMINAL
from executor.store import Store
from executor.store.inspecting import RunProgress

from .status import (
    STATE_STYLE,
    failure_cause,
    human_seconds,
    retrying_task,
    states_text,
    waiting_task,
)

EVERY = 0.3  # seconds between reads, at least
BAR = 30  # a bar's width in columns


async def follow(
    store: Store, run_id: str, console: Console, done: asyncio.Event, *, redirect_stdout: bool
) -> None:
    """Redraw the view until ``done`` is set; then it is erased (the summary takes its place)."""
    with Live(
        console=console,
        auto_refresh=False,
        transient=True,
        redirect_stdout=redirect_stdout,
        redirect_stderr=True,
    ) as live:
        while not done.is_set():
            started = time.perf_counter()
            progress = await store.views.run_progress(run_id)
            if progress is None:
                return
            live.update(render(progress), refresh=True)
            pause = max(EVERY, 20 * (time.perf_counter() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), pause)


def render(p: RunProgress) -> RenderableType:
    run = p.run
    head = Text.assemble(
        (run.run_id, "bold"),
        " ",
        (run.state, STATE_STYLE.get(run.state, "")),
        f"  elapsed {human_seconds(p.now - run.created_at)}",
    )
    bars = Table.grid(padding=(0, 1))
    total = sum(p.counts.values())
    ended = sum(n for state, n in p.counts.items() if state in TERMINAL)
    failed = p.counts.get("FAILED", 0) + p.counts.get("UPSTREAM_FAILED", 0)
    bars.add_row("tasks", _bar(ended, total, failed), f"{ended}/{total}", states_text(p.counts))
    for m in p.mapped:
        if m.map_total is None:
            bars.add_row(m.task_id, Text(f"maps over {describe(m.expand_from)}", style="dim"))
        else:
            done, of = m.n_done, m.map_total
            bars.add_row(m.task_id, _bar(done, of, m.n_failed), f"{done}/{of}")
    parts: list[RenderableType] = [head, bars]
    waiting = p.counts.get("DEFERRED", 0) + p.counts.get("SENSING", 0)
    if p.waits:
        rows = Table.grid(padding=(0, 2))
        for r in p.waits:
            t = waiting_task(r, p.now)
            since = datetime.fromtimestamp(t.since).strftime("%H:%M:%S")
            rows.add_row(
                Text(t.name, style=STATE_STYLE[t.state]),
                t.state,
                Text(t.waits_for, overflow="fold"),
                f"since {since} ({human_seconds(t.for_seconds)})",
            )
        parts += [_title("waiting", waiting, len(p.waits)), rows]
    if p.retrying:
        rows = Table.grid(padding=(0, 2))
        for rr in p.retrying:
            rt = retrying_task(rr, p.now)
            due = (rt.next_attempt_at or p.now) - p.now
            rows.add_row(
                Text(rt.name, style=STATE_STYLE["RETRYING"]),
                f"{rt.waits_for} " + (f"in {human_seconds(due)}" if due > 0 else "due"),
                Text(failure_cause(rt.last_error), overflow="ellipsis", no_wrap=True),
            )
        parts += [_title("retrying", p.counts.get("RETRYING", 0), len(p.retrying)), rows]
    return Group(*parts)


def _bar(done: int, total: int, failed: int) -> ProgressBar:
    """Green, or red once something failed; 0 of 0 (a mapped task over an empty list) is
    complete, not a division by zero."""
    bar = ProgressBar(total=max(total, 1), completed=done if total else 1, width=BAR)
    bar.complete_style = bar.finished_style = "red" if failed else "green"
    return bar


def _title(name: str, count: int, shown: int) -> Text:
    more = f", the first {shown} shown" if count > shown else ""
    return Text(f"{name} ({count}{more})", style="bold")
