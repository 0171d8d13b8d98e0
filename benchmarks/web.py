"""The web page on a big store: how long its pages take, and how soon a log line shows.

    python -m benchmarks.web                      # SQLite and PostgreSQL, 100,000 runs,
                                                  # 1,000,000 task rows, 3 repeats
    python -m benchmarks.web --backends sqlite --runs 5000 --tasks 50000 --repeats 1
    slotless bench web --backends postgres

For each backend (SQLite: a file; PostgreSQL: a private schema of ``--dsn``, made with
``?search_path=`` and dropped afterwards), one store is seeded, then measured
``--repeats`` times:

* the seed: ``--runs`` runs and about ``--tasks`` task rows. One DAG of
  :data:`BIG_TASKS` tasks (20 layers of 10, each task the child of the one above it) has
  :data:`BIG_RUNS` runs, for the DAG page's grid of 25 runs x 200 tasks; the other runs
  are spread over :data:`OTHER_DAGS` DAGs of equal size (as many tasks each as makes the
  total), newest last, one run every few minutes back over :data:`SPAN_DAYS` days, in
  every run state but QUEUED and PAUSED (mostly SUCCESS, 10 % FAILED, 2 % CANCELLED and
  the newest :data:`RUNNING_RUNS` RUNNING) and every run type (85 % scheduled). Every
  DAG file is catalogued as ``slotless dags list --dags`` does, and one template run of
  each DAG is created through the store (``Runs.start_run``, as ``slotless trigger``);
  the rest are copies of the templates made in SQL, ``INSERT ... SELECT`` over a numbers
  CTE, :data:`CHUNK` runs a transaction. Direct SQL bypasses the state machine: fine for
  seeding a benchmark, never for the product. Copies are given finished task states,
  start and end times, and ``ready_at`` NULL (nothing a worker would claim); a RUNNING
  copy's tasks are half SUCCESS, half PENDING on parents. Their edges and log entries are
  not copied (the pages measured do not read them). On PostgreSQL the schema is then
  ``VACUUM ANALYZE``d, as autovacuum would have done within a minute of such a write; a
  SQLite store is left as the product leaves it (no ANALYZE: it never runs one).
* page times: a real ``slotless ui --db URL --port P`` process; from this process, one
  aiohttp client asks each page ``--warmups`` times, then ``--requests`` times in a row,
  each request timed from sending to the last byte of the body (p50 / p99, ms). Pages:
  ``/`` (the home page), the big DAG's page with ``?runs=25``, and the runs list filtered
  three ways: ``state=FAILED`` with a ``from``/``to`` month, a text search (``q=`` a run
  number: every run's id and key are compared), and a DAG with a run type.
* log line to page: a DAG whose one task waits for a file, then ``ctx.log``s a line
  holding ``time.time()`` every :data:`LOG_EVERY` s for :data:`LOG_FOR` s. It is
  triggered on the seeded store, a real ``slotless worker`` runs it, and headless
  Chromium opens its task page (``/runs/{run}/tasks/{task}``; the streaming viewer polls
  the log API every 0.5 s, the worker writes a running attempt's lines every 0.5 s). A
  MutationObserver installed in the page records ``Date.now()`` as each line's row is
  added; once the observer is in, the benchmark creates the file. Each line's delay is
  the time it was seen less the time written in it (one host, one clock): p50 / p99, s.
  On PostgreSQL the log API holds back an entry until every transaction older than it has
  ended, on the whole server (executor/store/loglines.py: ids are taken at INSERT): other
  sessions' transactions lengthen the delays, so the longest one seen during the test is
  recorded beside them (``server_longest_other_transaction_s``).

Targets: every page's p99 under :data:`TARGET_PAGE_MS` ms, log line to page p99 under
:data:`TARGET_LOG_S` s. The headline figures (``dag_page_p99_ms``, ``runs_page_p99_ms``:
the worst of the runs list's filters, ``log_line_to_page_p99_s``) are the worse
backend's median over the repeats; each backend's under ``backends``.

Writes benchmarks/results/web.json and web.png (``--name`` another name, for a trial).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from . import calibration, common

NAME = "web"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
TARGET_PAGE_MS = 300.0
TARGET_LOG_S = 1.0
BIG_DAG = "wide_200"
BIG_LAYERS, BIG_WIDTH = 20, 10
BIG_TASKS = BIG_LAYERS * BIG_WIDTH
BIG_RUNS = 100  # the grid shows 25; the rest are there to page back through
OTHER_DAGS = 20
SPAN_DAYS = 730  # the seeded runs' logical dates go back this far from today
RUNNING_RUNS = 20  # the newest seeded runs are still RUNNING
CHUNK = 20_000  # runs copied per transaction: a whole million task rows would hold a
# SQLite write lock for long, and one PostgreSQL transaction of them bloats its WAL
LOG_EVERY = 0.2
LOG_FOR = 20.0
LOG_DAG = "chatty_bench"
LOG_TASK = "talk"
STARTUP_TIMEOUT = 60.0

BIG_SOURCE = f'''"""The web benchmark's DAG: {BIG_LAYERS} layers of {BIG_WIDTH} tasks."""
from executor import DAG

dag = DAG({BIG_DAG!r})


def noop(ctx):
    return None


for layer in range({BIG_LAYERS}):
    for col in range({BIG_WIDTH}):
        parents = [f"t{{layer - 1:02d}}_{{col}}"] if layer else []
        dag.task(noop, task_id=f"t{{layer:02d}}_{{col}}", parents=parents)
'''

OTHER_SOURCE = '''"""A DAG of {n} tasks in a chain for the web benchmark."""
from executor import DAG

dag = DAG({dag_id!r})


def noop(ctx):
    return None


for i in range({n}):
    dag.task(noop, task_id=f"step_{{i:02d}}", parents=[f"step_{{i - 1:02d}}"] if i else [])
'''

LOG_SOURCE = f'''"""The web benchmark's talking task: a timestamped line every {LOG_EVERY} s."""
import time
from pathlib import Path

from executor import DAG

dag = DAG({LOG_DAG!r}, params={{"go": "", "lines": 100}})


@dag.task(task_id={LOG_TASK!r})
def talk(ctx):
    go = Path(ctx.params["go"])
    deadline = time.time() + 300
    while not go.exists():  # the benchmark's page is open and watching
        if time.time() > deadline:
            raise RuntimeError("the benchmark never said go")
        time.sleep(0.05)
    n = int(ctx.params["lines"])
    start = time.time()
    for i in range(n):
        due = start + i * {LOG_EVERY}
        time.sleep(max(0.0, due - time.time()))
        ctx.log(f"bench-line {{i}} {{time.time():.6f}}")
    return n
'''


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.web", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--backends", default="sqlite,postgres", help="sqlite, postgres or both")
    ap.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (a schema is made)")
    ap.add_argument("--runs", type=_count, default=100_000, help="runs in the store")
    ap.add_argument("--tasks", type=_count, default=1_000_000, help="task rows in the store")
    calibration.add_repeats_argument(ap)
    ap.add_argument("--requests", type=_count, default=50, help="timed requests per page")
    ap.add_argument("--warmups", type=int, default=5, help="untimed requests per page first")
    ap.add_argument("--log-for", type=float, default=LOG_FOR, help="seconds of log lines")
    ap.add_argument("--workdir", help="where SQLite files and DAG files go")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--name", default=NAME, help="result files' name (web: the real one)")
    ap.add_argument("--results", type=Path, default=common.RESULTS)
    args = ap.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in args.backends:
        if b not in ("sqlite", "postgres"):
            ap.error(f"--backends: {b!r} is neither sqlite nor postgres")
    if args.runs < BIG_RUNS + OTHER_DAGS:
        ap.error(f"--runs: at least {BIG_RUNS + OTHER_DAGS}")
    if args.tasks < args.runs:
        ap.error("--tasks: at least one task row per run")
    return args


def _count(text: str) -> int:
    try:
        n = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return n


# -- the seed --------------------------------------------------------------------------------


def shapes(runs: int, tasks: int) -> list[tuple[str, int, int]]:
    """(dag_id, tasks per run, runs) of every seeded DAG: the big one and the others,
    each other one with as many tasks as brings the total near ``tasks``."""
    rest_runs = runs - BIG_RUNS
    per_run = max(1, round((tasks - BIG_RUNS * BIG_TASKS) / rest_runs))
    out = [(BIG_DAG, BIG_TASKS, BIG_RUNS)]
    for k in range(OTHER_DAGS):
        share = rest_runs // OTHER_DAGS + (1 if k < rest_runs % OTHER_DAGS else 0)
        out.append((f"batch_{k:02d}", per_run, share))
    return out


class Dialect:
    """What differs between the backends' SQL in the seed: a numbers CTE, dates from epoch
    seconds, and how statements run (sqlite3 here, asyncpg there)."""

    def __init__(self, url: str) -> None:
        self.pg = url.startswith("postgres")

    def numbers(self, low: int, high: int) -> str:
        if self.pg:
            return f"k(i) AS (SELECT generate_series({low}, {high - 1}) AS i)"
        return f"k(i) AS (SELECT {low} UNION ALL SELECT i + 1 FROM k WHERE i < {high - 1})"

    def with_(self) -> str:
        return "WITH" if self.pg else "WITH RECURSIVE"

    def day(self, epoch: str) -> str:
        if self.pg:
            return f"to_char(to_timestamp({epoch}) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
        return f"strftime('%Y-%m-%d', {epoch}, 'unixepoch')"

    def hour(self, epoch: str) -> str:
        if self.pg:
            return (
                f"to_char(to_timestamp({epoch}) AT TIME ZONE 'UTC', "
                "'YYYY-MM-DD\"T\"HH24:00:00+00:00')"
            )
        return f"strftime('%Y-%m-%dT%H:00:00+00:00', {epoch}, 'unixepoch')"

    def text(self, expr: str) -> str:
        return f"CAST({expr} AS TEXT)"


async def columns(url: str, table: str) -> list[str]:
    """A table's columns in order: the copies name every one, so that a migration's new
    column is copied from the template (its value as the store wrote it) without a change
    here."""
    if url.startswith("postgres"):
        async with pg_conn(url) as conn:
            rows = await conn.fetch(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = $1 "
                "ORDER BY ordinal_position",
                table,
            )
        return [r["column_name"] for r in rows]

    def read() -> list[str]:
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        finally:
            conn.close()

    return await asyncio.to_thread(read)


@dataclass(frozen=True)
class Chunk:
    """Runs ``low`` .. ``high - 1`` of one DAG (the ``shape_no``-th of ``n_shapes``), to copy
    from its ``template`` run in one statement; ``total`` runs seeded in all, up to ``now``."""

    template: str
    dag_id: str
    shape_no: int
    n_shapes: int
    low: int
    high: int
    total: int
    now: float

    @property
    def g(self) -> str:
        """A copy's place among all seeded runs (the DAGs' runs interleaved), 0 the oldest."""
        return f"(k.i * {self.n_shapes} + {self.shape_no})"

    @property
    def created(self) -> str:
        """A copy's creation time: the seeded runs spread evenly over SPAN_DAYS to ``now``."""
        step = SPAN_DAYS * 86400 / self.total
        return f"({self.now} - ({self.total} - {self.g}) * {step})"


def run_copy_sql(d: Dialect, cols: list[str], c: Chunk) -> str:
    """Copies the chunk's runs from its template run."""
    g, created, total, dag_id = c.g, c.created, c.total, c.dag_id
    state = (
        f"CASE WHEN {g} >= {total - RUNNING_RUNS} THEN 'RUNNING' "
        f"WHEN {g} % 10 = 3 THEN 'FAILED' WHEN {g} % 50 = 7 THEN 'CANCELLED' "
        "ELSE 'SUCCESS' END"
    )
    run_type = (
        f"CASE WHEN {g} % 20 = 0 THEN 'manual' WHEN {g} % 20 = 1 THEN 'backfill' "
        f"WHEN {g} % 20 = 2 THEN 'event' ELSE 'scheduled' END"
    )
    run_id = f"'{dag_id}__seed_' || {d.text(g)}"
    over = {
        "run_id": run_id,
        "created_at": created,
        "ended_at": f"CASE WHEN {g} >= {total - RUNNING_RUNS} THEN NULL ELSE {created} + 600 END",
        "state": state,
        "logical_date": d.day(created),
        "logical_time": d.hour(created),
        "data_interval_start": d.hour(created),
        "data_interval_end": d.hour(f"{created} + 3600"),
        "timezone": "'UTC'",
        "run_type": run_type,
        "run_key": f"{d.day(created)} || '~seed-' || {d.text(g)}",
        "tasks_unfinished": f"CASE WHEN {g} >= {total - RUNNING_RUNS} THEN 1 ELSE 0 END",
        "leaves_failed": (
            f"CASE WHEN {g} % 10 = 3 AND {g} < {total - RUNNING_RUNS} THEN 1 ELSE 0 END"
        ),
        "state_reason": "NULL",
        "deadline_at": "NULL",
        "deadline_missed_at": "NULL",
        "start_event": "NULL",
    }
    select = ", ".join(f"{over[c]}" if c in over else f"t.{c}" for c in cols)
    return (
        f"{d.with_()} {d.numbers(c.low, c.high)} INSERT INTO dag_run ({', '.join(cols)}) "
        f"SELECT {select} FROM k CROSS JOIN dag_run t WHERE t.run_id = '{c.template}'"
    )


def task_copy_sql(d: Dialect, cols: list[str], c: Chunk) -> str:
    """The task rows of the same runs, copied from the template run's rows."""
    g, created, total, dag_id = c.g, c.created, c.total, c.dag_id
    running = f"{g} >= {total - RUNNING_RUNS}"
    # A failed run: one task in seven FAILED, the next UPSTREAM_FAILED; a cancelled one:
    # its later half CANCELLED; a running one: its later half PENDING on parents.
    state = (
        f"CASE WHEN {running} THEN (CASE WHEN t.id % 2 = 0 THEN 'SUCCESS' ELSE 'PENDING' END) "
        f"WHEN {g} % 10 = 3 THEN (CASE WHEN t.id % 7 = 0 THEN 'FAILED' "
        "WHEN t.id % 7 = 1 THEN 'UPSTREAM_FAILED' ELSE 'SUCCESS' END) "
        f"WHEN {g} % 50 = 7 THEN (CASE WHEN t.id % 2 = 1 THEN 'CANCELLED' ELSE 'SUCCESS' END) "
        "ELSE 'SUCCESS' END"
    )
    pending = f"({running} AND t.id % 2 = 1)"
    started = f"({created} + (t.id % 40) * 3)"
    over = {
        "run_id": f"'{dag_id}__seed_' || {d.text(g)}",
        "state": state,
        "ready_at": "NULL",
        "owner": "NULL",
        "heartbeat_at": "NULL",
        "started_at": f"CASE WHEN {pending} THEN NULL ELSE {started} END",
        "ended_at": f"CASE WHEN {pending} THEN NULL ELSE {started} + 1 + ({g} + t.id) % 17 END",
        "updated_at": created,
        "n_done": f"CASE WHEN {pending} THEN 0 ELSE t.n_parents END",
        "n_success": f"CASE WHEN {pending} THEN 0 ELSE t.n_parents END",
    }
    select = ", ".join(f"{over[c]}" if c in over else f"t.{c}" for c in cols if c != "id")
    names = ", ".join(c for c in cols if c != "id")
    return (
        f"{d.with_()} {d.numbers(c.low, c.high)} INSERT INTO task ({names}) "
        f"SELECT {select} FROM k CROSS JOIN task t WHERE t.run_id = '{c.template}'"
    )


def finish_template_sql(template: str, now: float) -> list[str]:
    """The template runs (made by the store, their roots claimable) set SUCCESS, as the
    copies: a worker started later must not run them."""
    return [
        f"UPDATE task SET state = 'SUCCESS', ready_at = NULL, started_at = {now - 60}, "
        f"ended_at = {now - 50}, n_done = n_parents, n_success = n_parents "
        f"WHERE run_id = '{template}'",
        f"UPDATE dag_run SET state = 'SUCCESS', ended_at = {now - 50}, tasks_unfinished = 0, "
        f"run_type = 'manual' WHERE run_id = '{template}'",
    ]


async def seed(url: str, folder: Path, runs: int, tasks: int, schema: str | None) -> dict:
    """Catalogue the DAG files, one template run each through the store, then the copies."""
    from executor.catalogue import scan
    from executor.store import open_store
    from slotless.trigger import import_dag

    dags = folder / "dags"
    dags.mkdir(exist_ok=True)
    plan = shapes(runs, tasks)
    common.write_dag_file(dags, BIG_DAG, BIG_SOURCE)
    for dag_id, n, _ in plan[1:]:
        common.write_dag_file(dags, dag_id, OTHER_SOURCE.format(dag_id=dag_id, n=n))
    common.write_dag_file(dags, LOG_DAG, LOG_SOURCE)
    t0 = time.perf_counter()
    store = await open_store(url)
    try:
        await scan(store, dags, timeout=60, by_hand=True)
        templates = {}
        for dag_id, _, _ in plan:
            entry = await store.catalogue.catalogue_dag(dag_id)
            dag = await import_dag(entry["file"], dag_id, 60)
            started = await store.runs.start_run(
                dag, datetime.now(UTC).date(), dag_file=entry["file"]
            )
            templates[dag_id] = started.run_id
    finally:
        await store.close()
    run_cols = await columns(url, "dag_run")
    task_cols = await columns(url, "task")
    templated_s = time.perf_counter() - t0

    d = Dialect(url)
    now = time.time()
    total = max(n for _, _, n in plan) * len(plan)  # g spans this many places
    statements: list[list[str]] = []
    for shape_no, (dag_id, _, n) in enumerate(plan):
        for low in range(0, n, max(1, CHUNK // len(plan))):
            high = min(n, low + max(1, CHUNK // len(plan)))
            c = Chunk(templates[dag_id], dag_id, shape_no, len(plan), low, high, total, now)
            statements.append([run_copy_sql(d, run_cols, c), task_copy_sql(d, task_cols, c)])
    for dag_id in templates:
        statements.append(finish_template_sql(templates[dag_id], now))
    t1 = time.perf_counter()
    bar = common.progress()
    with bar:
        job = bar.add_task("seeding", total=len(statements))
        if schema is None:
            await asyncio.to_thread(_sqlite_batches, url, statements, bar, job)
        else:
            await _pg_batches(url, statements, bar, job)
    copied_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    if schema is not None:
        await vacuum(url, schema)
    counts = await count_rows(url)
    return {
        "templates_s": round(templated_s, 2),
        "copies_s": round(copied_s, 2),
        "vacuum_analyze_s": round(time.perf_counter() - t2, 2) if schema else None,
        "runs": counts["runs"],
        "tasks": counts["tasks"],
        "big_dag": BIG_DAG,
        "big_dag_runs": counts["big_runs"],
        "dags_folder": str(dags),
        "shapes": [{"dag_id": a, "tasks_per_run": b, "runs": c} for a, b, c in plan],
    }


def _sqlite_batches(url: str, batches: list[list[str]], bar: Any, job: Any) -> None:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 30000")
        for batch in batches:
            conn.execute("BEGIN IMMEDIATE")
            for sql in batch:
                conn.execute(sql)
            conn.execute("COMMIT")
            bar.advance(job)
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def pg_conn(url: str) -> AsyncIterator[Any]:
    import asyncpg

    from executor.driver.postgres import split_url

    conn = await asyncpg.connect(split_url(url)[0])  # search_path: a server setting
    try:
        yield conn
    finally:
        await conn.close()


async def _pg_batches(url: str, batches: list[list[str]], bar: Any, job: Any) -> None:
    async with pg_conn(url) as conn:
        for batch in batches:
            async with conn.transaction():
                for sql in batch:
                    await conn.execute(sql)
            bar.advance(job)


async def vacuum(url: str, schema: str) -> None:
    async with pg_conn(url) as conn:
        for t in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema):
            await conn.execute(f'VACUUM (ANALYZE) "{schema}"."{t["tablename"]}"')


async def count_rows(url: str) -> dict[str, int]:
    queries = {
        "runs": "SELECT count(*) FROM dag_run",
        "tasks": "SELECT count(*) FROM task",
        "big_runs": f"SELECT count(*) FROM dag_run WHERE dag_id = '{BIG_DAG}'",
    }
    if url.startswith("postgres"):
        async with pg_conn(url) as conn:
            return {k: int(await conn.fetchval(q)) for k, q in queries.items()}

    def read() -> dict[str, int]:
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            return {k: int(conn.execute(q).fetchone()[0]) for k, q in queries.items()}
        finally:
            conn.close()

    return await asyncio.to_thread(read)


# -- the processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def slotless(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """``slotless ARGS`` as a process of this checkout, stopped (SIGTERM) at the end."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(common.REPO), os.environ.get("PYTHONPATH")])
        ),
    }
    env.pop("SLOTLESS_DB", None)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slotless", *args],
            cwd=common.REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


async def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    """``predicate()`` (awaited) once it is truthy, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.05)


async def ui_up(http: Any, base: str, proc: subprocess.Popen, log: Path) -> None:
    async def up() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"slotless ui exited ({proc.returncode}):\n{log.read_text()}")
        try:
            async with http.get(base + "/api/status") as r:
                await r.read()
                return r.status == 200
        except OSError:
            return False

    await wait_for(up, STARTUP_TIMEOUT, "slotless ui")


# -- page times ------------------------------------------------------------------------------


def pages(now: datetime) -> dict[str, str]:
    """The pages timed: name -> path and query."""
    month_end = now.date() - timedelta(days=30)
    month_start = month_end - timedelta(days=30)
    return {
        "home": "/",
        "dag_page": f"/dags/{BIG_DAG}?runs=25",
        "runs_failed_month": "/runs?"
        + urlencode(
            {"state": "FAILED", "from": month_start.isoformat(), "to": month_end.isoformat()}
        ),
        "runs_text_search": "/runs?" + urlencode({"q": "seed_4242"}),
        "runs_dag_type": "/runs?" + urlencode({"dag": "batch_03", "type": "backfill"}),
    }


async def time_pages(http: Any, base: str, requests: int, warmups: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, path in pages(datetime.now(UTC)).items():
        times = []
        size = 0
        for i in range(warmups + requests):
            t0 = time.perf_counter()
            async with http.get(base + path) as r:
                body = await r.read()
                if r.status != 200:
                    raise SystemExit(f"GET {path}: {r.status}\n{body[:500]!r}")
            if i >= warmups:
                times.append((time.perf_counter() - t0) * 1e3)
                size = len(body)
        times.sort()
        out[name] = {
            "path": path,
            "p50_ms": round(common.percentile(times, 50), 2),
            "p99_ms": round(common.percentile(times, 99), 2),
            "max_ms": round(times[-1], 2),
            "bytes": size,
        }
    return out


# -- log line to page ------------------------------------------------------------------------

# The viewer says so when the task has ended; with a failure, the benchmark stops at once.
FAILED = "(document.querySelector('.logstream .log-status') || {}).textContent === " + (
    "'the whole log is shown: the task is FAILED'"
)
OBSERVER = """(() => {
  window.__seen = [];
  const body = document.querySelector('.logstream tbody');
  new MutationObserver((records) => {
    const at = Date.now();
    for (const r of records) {
      for (const n of r.addedNodes) {
        if (n.nodeType === 1 && n.tagName === 'TR') {
          window.__seen.push([n.textContent, at]);
        }
      }
    }
  }).observe(body, {childList: true});
  return true;
})()"""


async def log_to_page(
    url: str, base: str, folder: Path, log_for: float, proc_ui: subprocess.Popen
) -> dict[str, Any]:
    """Trigger the talking DAG, open its task page, let a worker run it; each line's delay."""
    sys.path.insert(0, str(common.REPO / "tests"))
    from support.browser import devtools  # the tests' DevTools helpers

    from executor.store import open_store
    from slotless.trigger import import_dag

    go = folder / f"go-{secrets.token_hex(4)}"
    lines = int(log_for / LOG_EVERY)
    store = await open_store(url)
    try:
        entry = await store.catalogue.catalogue_dag(LOG_DAG)
        dag = await import_dag(entry["file"], LOG_DAG, 60)
        started = await store.runs.start_run(
            dag,
            datetime.now(UTC).date(),
            dag_file=entry["file"],
            conf={"go": str(go), "lines": lines},
        )
    finally:
        await store.close()
    run_id = started.run_id
    page_url = f"{base}/runs/{quote(run_id, safe='')}/tasks/{LOG_TASK}"
    with slotless(["worker", "--db", url], folder / "worker.log") as worker:
        async with devtools(folder, page_url) as page:
            await page.eval_when(
                "document.querySelector('.logstream tbody') && document.readyState === 'complete'",
                "the task page's log viewer",
            )
            await page.eval(OBSERVER)
            go.touch()
            deadline = time.monotonic() + log_for + 60
            oldest = 0.0
            while True:
                oldest = max(oldest, await oldest_other_transaction_s(url))
                seen = await page.eval(
                    "window.__seen.filter(s => s[0].includes('bench-line')).length"
                )
                if seen >= lines:
                    break
                if worker.poll() is not None or proc_ui.poll() is not None:
                    raise SystemExit("the worker or the ui exited during the log test")
                if await page.eval(FAILED):
                    raise SystemExit(f"the talking task failed: see {page_url}/log.txt")
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {seen} of {lines} log lines reached the page")
                await asyncio.sleep(0.5)
            seen_rows = await page.eval("window.__seen")
    delays = []
    for text, at_ms in seen_rows:
        if "bench-line" not in text:
            continue
        words = text.split("bench-line", 1)[1].split()
        delays.append(at_ms / 1e3 - float(words[1]))
    delays.sort()
    return {
        "run_id": run_id,
        "lines": len(delays),
        "p50_s": round(common.percentile(delays, 50), 3),
        "p99_s": round(common.percentile(delays, 99), 3),
        "max_s": round(delays[-1], 3),
        "min_s": round(delays[0], 3),
        # PostgreSQL: the longest any other transaction on the server ran meanwhile (its
        # lines wait behind it; see the module's docstring). None on SQLite.
        "server_longest_other_transaction_s": round(oldest, 3)
        if url.startswith("postgres")
        else None,
    }


async def oldest_other_transaction_s(url: str) -> float:
    """How long the oldest transaction holding an xid or a snapshot on the whole PostgreSQL
    server has run (any database: the xmin horizon is the cluster's), but this look's own."""
    if not url.startswith("postgres"):
        return 0.0
    async with pg_conn(url) as conn:
        age = await conn.fetchval(
            "SELECT COALESCE(EXTRACT(EPOCH FROM max(clock_timestamp() - xact_start)), 0) "
            "FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)"
        )
    return float(age)


# -- one backend -----------------------------------------------------------------------------


async def measure(url: str, folder: Path, args: argparse.Namespace, i: int) -> dict[str, Any]:
    import aiohttp

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = folder / f"ui-{i}.log"
    with slotless(["ui", "--db", url, "--port", str(port)], log) as ui:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await ui_up(http, base, ui, log)
            times = await time_pages(http, base, args.requests, args.warmups)
        log_line = await log_to_page(url, base, folder, args.log_for, ui)
    return {"pages": times, "log_line_to_page": log_line}


def headline(out: dict[str, Any]) -> dict[str, float | None]:
    p = out["pages"]
    return {
        "home_p99_ms": p["home"]["p99_ms"],
        "dag_page_p99_ms": p["dag_page"]["p99_ms"],
        "runs_page_p99_ms": max(v["p99_ms"] for k, v in p.items() if k.startswith("runs_")),
        "log_line_to_page_p99_s": out["log_line_to_page"]["p99_s"],
        "log_line_to_page_p50_s": out["log_line_to_page"]["p50_s"],
    }


@contextlib.asynccontextmanager
async def backend_store(
    backend: str, folder: Path, dsn: str
) -> AsyncIterator[tuple[str, str | None]]:
    """The store's URL and its PostgreSQL schema (None: a SQLite file), dropped after."""
    if backend == "sqlite":
        yield common.fresh_db(folder, "web"), None
        return
    from .postgres import Schema

    async with Schema(dsn) as schema:
        yield schema.url, schema.name


def one_backend(
    backend: str, args: argparse.Namespace, folder: Path, rec: calibration.Recording
) -> dict[str, Any]:
    sub = folder / backend
    sub.mkdir(exist_ok=True)

    async def seeded_then_measured() -> dict[str, Any]:
        async with backend_store(backend, sub, args.dsn) as (url, schema):
            return await body(url, schema)

    async def body(url: str, schema: str | None) -> dict[str, Any]:
        common.console.print(
            f"[bold]{backend}[/bold]: seeding {args.runs:,} runs, ~{args.tasks:,} task rows"
        )
        seeded = await seed(url, sub, args.runs, args.tasks, schema)
        common.console.print(
            f"seeded {seeded['runs']:,} runs, {seeded['tasks']:,} task rows in "
            f"{seeded['templates_s'] + seeded['copies_s']:.1f} s"
        )
        runs = []
        for i in range(args.repeats):
            with common.MachineLoad() as load:
                out = await measure(url, sub, args, i)
            figures = headline(out)
            rec.add({f"{backend}_{k}": v for k, v in figures.items()}, load.summary)
            common.console.print(f"{backend} run {i + 1}: {figures}")
            runs.append(out | {"figures": figures})
        return {"seed": seeded, "runs": runs}

    got = asyncio.run(seeded_then_measured())
    medians = {
        k: statistics.median(r["figures"][k] for r in got["runs"])
        for k in got["runs"][0]["figures"]
    }
    pages_median = {
        name: {
            "p50_ms": statistics.median(r["pages"][name]["p50_ms"] for r in got["runs"]),
            "p99_ms": statistics.median(r["pages"][name]["p99_ms"] for r in got["runs"]),
            "path": got["runs"][0]["pages"][name]["path"],
        }
        for name in got["runs"][0]["pages"]
    }
    return {"backend": backend, **medians, "pages": pages_median, **got}


# -- the document ----------------------------------------------------------------------------


def verdicts(doc: dict[str, Any]) -> dict[str, Any]:
    page_p99 = max(p["p99_ms"] for b in doc["backends"].values() for p in b["pages"].values())
    return {
        "every_page_p99_ms": {
            "value": page_p99,
            "target": TARGET_PAGE_MS,
            "met": page_p99 < TARGET_PAGE_MS,
        },
        "log_line_to_page_p99_s": {
            "value": doc["log_line_to_page_p99_s"],
            "target": TARGET_LOG_S,
            "met": doc["log_line_to_page_p99_s"] < TARGET_LOG_S,
        },
    }


def plot(doc: dict[str, Any], results: Path, name: str) -> Path:
    fig, axes = common.subplots(2, width=6.0)
    backends = list(doc["backends"])
    names = list(next(iter(doc["backends"].values()))["pages"])
    width = 0.8 / max(1, len(backends))
    for j, b in enumerate(backends):
        p = doc["backends"][b]["pages"]
        xs = [i + j * width for i in range(len(names))]
        axes[0].bar(xs, [p[n]["p99_ms"] for n in names], width, label=f"{b} p99")
        axes[0].scatter(xs, [p[n]["p50_ms"] for n in names], color="black", s=10, zorder=3)
    axes[0].axhline(TARGET_PAGE_MS, color="tab:red", linestyle="--", label="target p99")
    axes[0].set_xticks([i + width * (len(backends) - 1) / 2 for i in range(len(names))])
    axes[0].set_xticklabels(names, rotation=25, ha="right")
    axes[0].set_ylabel("ms (bar p99, dot p50)")
    axes[0].set_title(f"pages, {doc['runs']:,} runs / {doc['tasks']:,} task rows")
    axes[0].legend()
    for b in backends:
        run = doc["backends"][b]["runs"][0]["log_line_to_page"]
        axes[1].bar([f"{b} p50", f"{b} p99"], [run["p50_s"], run["p99_s"]], label=b)
    axes[1].axhline(TARGET_LOG_S, color="tab:red", linestyle="--", label="target p99")
    axes[1].set_ylabel("s")
    axes[1].set_title("log line written -> shown on the task page")
    axes[1].legend()
    fig.suptitle(calibration.caption(doc), fontsize=8)
    return common.save_figure(fig, name, results)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    backends: dict[str, Any] = {}
    with common.workdir(args.workdir, args.keep) as folder, calibration.Recording(folder) as rec:
        for backend in args.backends:
            backends[backend] = one_backend(backend, args, folder, rec)
        doc = common.result_document(
            NAME,
            argv,
            {
                "runs": args.runs,
                "tasks": args.tasks,
                "requests": args.requests,
                "warmups": args.warmups,
                "repeats": args.repeats,
                "log_every_s": LOG_EVERY,
                "log_for_s": args.log_for,
                "big_dag_tasks": BIG_TASKS,
                "big_dag_runs": BIG_RUNS,
            },
            folder,
        )
    doc.update(rec.fields())
    first = next(iter(backends.values()))
    doc["runs"] = first["seed"]["runs"]
    doc["tasks"] = first["seed"]["tasks"]
    for key in ("dag_page_p99_ms", "runs_page_p99_ms", "log_line_to_page_p99_s"):
        doc[key] = max(b[key] for b in backends.values())  # the worse backend's
    doc["backends"] = backends
    doc["targets"] = verdicts(doc)
    path = common.write_json(args.name, doc, args.results)
    plot(doc, args.results, args.name)
    rows = [(k, f"{doc[k]:,}") for k in ("runs", "tasks")]
    for b, r in backends.items():
        for name, p in r["pages"].items():
            rows.append((f"{b} {name} p50 / p99", f"{p['p50_ms']:.1f} / {p['p99_ms']:.1f} ms"))
        rows.append(
            (
                f"{b} log line to page p50 / p99",
                f"{r['log_line_to_page_p50_s']:.3f} / {r['log_line_to_page_p99_s']:.3f} s",
            )
        )
        held = r["runs"][-1]["log_line_to_page"]["server_longest_other_transaction_s"]
        if held is not None:
            rows.append((f"{b} longest other transaction on the server", f"{held:.1f} s"))
        rows.append(
            (
                f"{b} seed (templates + copies)",
                f"{r['seed']['templates_s']} + {r['seed']['copies_s']} s",
            )
        )
    for k, v in doc["targets"].items():
        rows.append(
            (f"target {k} < {v['target']}", f"{v['value']}: {'met' if v['met'] else 'MISSED'}")
        )
    rows.append(calibration.calibration_row(doc["calibration"]))
    rows.append(common.load_row(doc["load"]))
    common.print_table("web page on a big store", rows)
    common.console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
