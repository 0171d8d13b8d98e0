"""A live page never shows a state the store did not hold at one moment.

A writer moves a run's tasks through the store's real transitions (a worker's claim and
its outcome, an operator's mark and clear) many times, recording every state it committed,
while a reader fetches the run's page, its live JSON, a task's page and the run list over
and over. Each rendered snapshot must agree with itself (the badge, the "cancel" button,
"running for", the graph and the table; a task's state and its end) and equal one of the
recorded states. On SQLite and on PostgreSQL; the app is served in this process, reading
through its own store (its own connection), as `slotless ui` does.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer
from support import backends
from support.exchanging import claim, complete
from support.helpers import attempt_of, write_dag

from executor.loader import load_dag
from executor.outcomes import Failed, Succeeded
from executor.states import RUN_TERMINAL
from executor.store import Store, open_store
from slotless.web.app import make_app

pytestmark = pytest.mark.slow

backend, url = backends.backend, backends.url  # fixtures: SQLite and PostgreSQL
pg_server = backends.pg_server  # fixture

TOKEN = "consistency-token"
TASKS = ("a", "b", "c")
DAG = """
from executor import DAG

dag = DAG("flux")


@dag.task
def a(ctx):
    return 1


@dag.task
def b(ctx):
    return 1


@dag.task
def c(ctx):
    return 1


@dag.task(parents=[a, b, c])
def d(ctx):
    return 1
"""
ALL = (*TASKS, "d")
STEPS = 240  # committed changes per backend
ENDED = {s.value for s in RUN_TERMINAL}

# What the store holds at one moment: (run state, whether the run has ended_at, and each
# task's (id, state, whether it has ended_at)).
State = tuple[str, bool, tuple[tuple[str, str, bool], ...]]


async def _held(store: Store, run_id: str) -> State:
    """What the store holds now (one snapshot)."""
    async with store.db.snapshot() as tx:
        run = await tx.fetchone("run_info", run_id=run_id)
        tasks = await tx.fetch("run_tasks", run_id=run_id)
    assert run is not None
    shown = sorted((t["task_id"], t["state"], t["ended_at"] is not None) for t in tasks)
    return run["state"], run["ended_at"] is not None, tuple(shown)


class Writer:
    """Plays a worker (claims, ends attempts) and an operator (marks, clears) on one run,
    recording every state it commits: it is the only writer, so that is every state held."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.rng = random.Random(7)
        self.claimed: list[Any] = []  # attempts taken and not ended yet
        self.seen: set[State] = set()

    async def run(self) -> None:
        self.seen.add(await _held(self.store, self.run_id))
        for _ in range(STEPS):
            await self.step()
            self.seen.add(await _held(self.store, self.run_id))
            await asyncio.sleep(0)  # the reader may come in between two commits, too

    async def step(self) -> None:
        store, run_id, rng = self.store, self.run_id, self.rng
        run_state, _, tasks = await _held(store, run_id)
        states = {t: s for t, s, _ in tasks}
        settled = [t for t in ALL if states[t] != "RUNNING"]
        move = rng.random()
        if run_state in ENDED and not self.claimed:
            await store.runs.clear(run_id, who="test")  # all again: the run reopens
        elif self.claimed and move < 0.4:
            row = self.claimed.pop(rng.randrange(len(self.claimed)))
            ok = rng.random() < 0.6
            outcome = (
                Succeeded(**attempt_of(row), output_json="1")
                if ok
                else Failed(**attempt_of(row), message="boom")
            )
            await complete(store, [outcome])
        elif move < 0.7 and "PENDING" in states.values():
            self.claimed += await claim(store, "test", 1)
        elif settled and move < 0.85:
            task = rng.choice(settled)
            await store.runs.mark(run_id, task, rng.choice(("success", "failed")), who="test")
        elif settled:
            await store.runs.clear(run_id, [rng.choice(settled)], who="test")


def _one(pattern: str, text: str) -> str:
    found = re.findall(pattern, text, re.DOTALL)
    assert len(found) == 1, (pattern, text[:3000])
    return found[0]


def _run_page(html: str) -> State:
    """A run page's (or its live block's) state, checked against itself on the way."""
    state = _one(r'<h1 id="run-title">.*?<span class="badge st-([A-Z_]+)">', html)
    table = dict(re.findall(r'<tr data-task="(\w+)"><td>.*?<span class="badge st-([A-Z_]+)">',
                            html, re.DOTALL))  # fmt: skip
    boxes = dict(re.findall(r'data-task="(\w+)" data-state="([A-Z_]+)"', html))
    assert table == boxes and len(table) == len(ALL), (table, boxes)
    ended = state in ENDED
    assert ("cancel run</button>" in html) == (not ended), (state, html[:2000])
    took = _one(r'<span id="run-took"><b>([a-z ]+)</b>', html)
    return state, took == "ran", tuple(sorted(table.items()))  # type: ignore[arg-type]


def _task_page(html: str) -> tuple[str, bool]:
    """Task a's state, and whether its page says when it ended."""
    state = _one(r'<h1 id="task-title">.*?<span class="badge st-([A-Z_]+)">', html)
    ended = _one(r'<span id="task-ended"><b>ended</b>([^<]*)</span>', html)
    return state, ended != "-"


def _index(html: str, run_id: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """The run list's row of the run: its state and its tasks by state."""
    row = _one(rf'<tr data-run="{re.escape(run_id)}">(.*?)</tr>', html)
    state = _one(r'<span class="badge st-([A-Z_]+)">', row)
    counts = {s: int(n) for n, s in re.findall(r'title="(\d+) ([A-Z_]+)"', row)}
    return state, tuple(sorted(counts.items()))


async def _get(client: TestClient, path: str) -> tuple[str, bool]:
    """A page's HTML (a live poll's: its one block) and whether it says it is live."""
    resp = await client.get(path)
    assert resp.status == 200, path
    if path.startswith("/api/live"):
        data = await resp.json()
        [html] = data["blocks"].values()
        return html, data["live"]
    html = await resp.text()
    return html, 'data-live="1"' in html


async def test_every_rendered_snapshot_is_a_state_the_store_held(url: str, tmp_path: Path):
    dag = load_dag(str(write_dag(tmp_path, DAG, "flux.py")), None)
    store = await open_store(url)  # the writer's
    reader = await open_store(url)  # the page's: its own connection, as `slotless ui`'s
    run_id = await store.runs.create_run(dag, date(2026, 6, 1))
    writer = Writer(store, run_id)
    shown: list[tuple[str, Any]] = []
    client = TestClient(TestServer(make_app(reader, token=TOKEN, refresh=0.5)))
    await client.start_server()
    try:
        r = await client.post("/login", data={"token": TOKEN, "back": "/"})
        assert r.status == 200  # signed in: the run page draws its buttons
        page = f"/runs/{quote(run_id, safe='')}"
        task = f"{page}/tasks/a"
        writing = asyncio.create_task(writer.run())
        paths = (page, "/api/live" + page, task, "/api/live" + task, "/")
        while not writing.done():
            # Several reads at once, so that reads and commits overlap as much as they can.
            got_all = await asyncio.gather(*(_get(client, p) for p in paths))
            for path, got in zip(paths, got_all, strict=True):
                html, live = got
                if path.endswith(page):
                    state = _run_page(html)
                    assert live == (state[0] not in ENDED), (live, state)
                    shown.append(("run", state))
                elif path.endswith(task):
                    shown.append(("task", _task_page(html)))
                else:
                    shown.append(("index", _index(html, run_id)))
        await writing
    finally:
        await client.close()
        await store.close()
        await reader.close()

    seen = writer.seen
    assert len(seen) > 20, "the writer hardly changed anything"
    assert sum(kind == "run" for kind, _ in shown) > 20, "the reader hardly read"
    runs = {(r, ran, tuple((t, s) for t, s, _ in tasks)) for r, ran, tasks in seen}
    task_a = {next((s, e) for t, s, e in tasks if t == "a") for _, _, tasks in seen}
    by_counts = {
        (r, tuple(sorted(Counter(s for _, s, _ in tasks).items()))) for r, _, tasks in seen
    }
    held: dict[str, set[Any]] = {"run": runs, "task": task_a, "index": by_counts}
    for kind, s in shown:
        assert s in held[kind], f"the {kind} page showed {s}: the store never held it"
