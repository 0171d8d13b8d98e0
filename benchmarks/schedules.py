"""Scheduling at scale, by section: parsing a DAG folder, and a minute tick of 10,000 DAGs.

    python -m benchmarks.schedules                       # every section built: parse, ticks
    python -m benchmarks.schedules --sections parse --files 1000
    python -m benchmarks.schedules --sections ticks --dags 1000 --ticks 2   # ~3 minutes
    slotless bench schedules --files 5000

Sections (``--sections``, comma-separated; each writes its own keys):

* ``parse`` - ``--files`` DAG files (each a chain of 3 to 5 tasks on a cron schedule) in a
  fresh folder, catalogued into a fresh SQLite store by :func:`executor.catalogue.scan`:
  cold (every file parsed), warm (nothing changed: no file parsed), then after
  ``--changed`` files are touched (exactly those parsed again). Keys ``parse_files``,
  ``parse_cold_s``, ``parse_warm_s``, ``parse_changed_s``, ``parse_changed_files``.
* ``ticks`` - ``--dags`` DAGs (default 10,000) each on ``* * * * *`` (catchup off, a chain of
  2 or 3 tasks, ``max_active_runs`` high enough that every run is created RUNNING) held by
  ONE real ``python -m slotless triggerer`` process on SQLite, and no worker. The files are
  written to a folder but catalogued in this process (imported here, then
  ``store.catalogue.record_parse`` with what :func:`executor.catalogue._declared` stores, which arms
  each start wait): the rows :func:`~executor.catalogue.scan` writes, without its
  forkserver's ~8 ms per file (the ``parse`` section's subject; 10,000 files would take
  minutes). A first triggerer creates the runs a freshly armed schedule owes at once and is
  stopped; the measured one is a new process that loaded the waits without firing (RSS per
  schedule: its RSS over that of a triggerer holding one schedule). Then ``--ticks`` minute
  ticks T (each waits for the wall clock's minute): for every tick exactly N runs of
  distinct DAGs for the interval ending at T, or the section fails; per run, the time from
  T until it was committed, that is visible to another process (a worker could claim it;
  a reader counts the runs every 20 ms): ``run_created_*``; ``dag_run.created_at - T``
  (the store's clock when the fire's transaction began): ``fire_began_*``; the
  triggerer's CPU (psutil, user + system) from T - 1 s to T + 10 s, and between ticks per
  minute. ``--profile FILE``
  then runs py-spy on the triggerer during one more tick (not measured). Keys
  ``schedules``, ``ticks``, ``runs_per_tick``, ``run_created_p50_s``/``_p99_s``/``_max_s``,
  ``fire_began_p99_s``, ``cpu_per_tick_s``, ``cpu_per_tick_above_idle_s``,
  ``idle_cpu_per_min_s``, ``rss_per_schedule_bytes`` (and after the ticks),
  ``tick_details``.

Results: benchmarks/results/schedules.json and schedules.png. The JSON is merged key by key
with the one already there, so a run of one section keeps the figures of the others; the
head (machine, versions, commit) is the latest run's, and ``runs`` says when and by which
command each section's figures were made.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import calibration, common

NAME = "schedules"

# A few schedules of the kinds people write, so that the parse computes real next runs.
CRONS = ("*/5 * * * *", "0 * * * *", "30 2 * * *", "0 6 * * 1-5", "15 0 1 * *", "@daily")

DAG_FILE = """\
from executor import DAG

dag = DAG({dag_id!r}, schedule={cron!r}, timezone={zone!r})
{tasks}
"""

TASK = """

@dag.task{parents}
def {name}(ctx):
    return {n}
"""


def dag_source(i: int) -> str:
    """File ``i``: a chain of 3 to 5 tasks, a schedule and a zone that vary with ``i``."""
    names = [f"step{k}" for k in range(3 + i % 3)]
    tasks = "".join(
        TASK.format(name=name, n=k, parents=f"(parents=[{names[k - 1]}])" if k else "")
        for k, name in enumerate(names)
    )
    zone = ("UTC", "Europe/Paris", "America/New_York")[i % 3]
    return DAG_FILE.format(
        dag_id=f"dag_{i:05d}", cron=CRONS[i % len(CRONS)], zone=zone, tasks=tasks
    )


def touch(path: Path) -> None:
    """A later mtime, as an editor saving it a second later would leave (a rewrite within
    the filesystem's timestamp granularity could keep the old one)."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


# -- section: parse ------------------------------------------------------------------------


async def _parse(args: argparse.Namespace, folder: Path, db_url: str) -> dict[str, Any]:
    from executor.catalogue import scan
    from executor.store import open_store

    files = [
        common.write_dag_file(folder, f"dag_{i:05d}", dag_source(i)) for i in range(args.files)
    ]
    store = await open_store(db_url)
    try:

        async def timed(expected: int, what: str) -> float:
            t0 = time.perf_counter()
            result = await scan(store, folder, timeout=args.timeout, jobs=args.jobs)
            seconds = time.perf_counter() - t0
            if result.errors or len(result.parsed) != expected:
                raise RuntimeError(
                    f"{what} scan parsed {len(result.parsed)} files (expected {expected}), "
                    f"errors: {dict(list(result.errors.items())[:3])}"
                )
            common.console.print(f"{what}: {len(result.parsed):,} files parsed in {seconds:.3f} s")
            return seconds

        cold = await timed(args.files, "cold")
        warm = await timed(0, "warm")
        changed = files[:: max(1, len(files) // args.changed)][: args.changed]
        for path in changed:
            touch(path)
        again = await timed(len(changed), "changed")
        dags = len(await store.catalogue.catalogue_dags())
    finally:
        await store.close()
    if dags != args.files:
        raise RuntimeError(f"{dags} DAGs catalogued from {args.files} files")
    return {
        "parse_files": args.files,
        "parse_cold_s": round(cold, 3),
        "parse_cold_ms_per_file": round(1000 * cold / args.files, 2),
        "parse_warm_s": round(warm, 4),
        "parse_changed_s": round(again, 3),
        "parse_changed_files": len(changed),
    }


def run_parse(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    folder = workdir / "dags"
    folder.mkdir()
    return asyncio.run(_parse(args, folder, common.fresh_db(workdir, "parse")))


def plot_parse(ax: Any, doc: dict[str, Any]) -> None:
    labels = [
        f"cold\n{doc['parse_files']:,} parsed",
        "warm\n0 parsed",
        f"changed\n{doc['parse_changed_files']} parsed",
    ]
    values = [doc["parse_cold_s"], doc["parse_warm_s"], doc["parse_changed_s"]]
    bars = ax.bar(labels, values, color=["tab:blue", "tab:green", "tab:orange"])
    for b, v in zip(bars, values, strict=True):
        ax.annotate(f"{v:.3g} s", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom")
    ax.axhline(30, color="red", ls="--", lw=1, label="target: 1,000 files cold < 30 s")
    ax.set_yscale("log")
    ax.set(title=f"catalogue scan of {doc['parse_files']:,} DAG files", ylabel="seconds (log)")
    ax.legend(loc="upper right")


# -- section: ticks -------------------------------------------------------------------------

TICK_DAG_FILE = """\
from executor import DAG

dag = DAG({dag_id!r}, schedule="* * * * *", catchup=False, max_active_runs={max_active})
{tasks}
"""
# Runs are never run here (no worker), so each DAG keeps every run RUNNING: a limit well
# above the runs one benchmark creates keeps them RUNNING, never QUEUED.
TICK_MAX_ACTIVE = 1000
TICK_TARGET_P99_S = 1.0
CAPACITY_BYTES_PER_WAIT = 1630  # README, triggerer capacity at 10,000 waits (2026-11-23)
SAMPLE_EVERY = 0.02  # the observer's period: runs committed, triggerer CPU and RSS
CPU_BEFORE_S = 1.0  # a tick's CPU is counted from T - 1 s ...
CPU_AFTER_S = 10.0  # ... to T + 10 s


def tick_dag_source(i: int) -> str:
    """File ``i`` of the ticks section: every minute, a chain of 2 or 3 tasks."""
    names = [f"step{k}" for k in range(2 + i % 2)]
    tasks = "".join(
        TASK.format(name=name, n=k, parents=f"(parents=[{names[k - 1]}])" if k else "")
        for k, name in enumerate(names)
    )
    return TICK_DAG_FILE.format(dag_id=f"tick_{i:05d}", max_active=TICK_MAX_ACTIVE, tasks=tasks)


async def _seed_ticks(folder: Path, db_url: str, n: int) -> None:
    """N DAG files in ``folder``, catalogued as :func:`executor.catalogue.scan` would store
    them, but imported in this process: the forkserver's ~8 ms per file is the ``parse``
    section's subject, not this one's (10,000 files would take minutes)."""
    from executor.catalogue import _declared
    from executor.loader import import_dags
    from executor.store import open_store
    from executor.store.catalogue import DeclaredDag

    store = await open_store(db_url)
    try:
        for i in range(n):
            path = common.write_dag_file(folder, f"tick_{i:05d}", tick_dag_source(i)).resolve()
            declared: list[dict[str, Any]] = [
                _declared(d, dag_id) for dag_id, d in import_dags(path).items()
            ]
            dags = [DeclaredDag(**d) for d in declared]
            error = await store.catalogue.record_parse(str(path), path.stat().st_mtime, dags, None)
            if error is not None:
                raise RuntimeError(f"{path}: {error}")
        armed = len(await store.catalogue.start_waits())
    finally:
        await store.close()
    if armed != n:
        raise RuntimeError(f"{armed} start waits armed for {n} DAGs")


class _TriggererProcess:
    """``python -m slotless triggerer --db URL``: a real process, as an operator starts it."""

    def __init__(self, db_url: str, log: Path) -> None:
        import subprocess

        import psutil

        env = {k: v for k, v in os.environ.items() if k != "SLOTLESS_DAGS"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(common.REPO), env.get("PYTHONPATH")]))
        self._log = log.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "slotless", "triggerer", "--db", db_url],
            stdout=self._log,
            stderr=self._log,
            env=env,
            cwd=common.REPO,
        )
        self.proc = psutil.Process(self.popen.pid)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_s(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    def rss(self) -> int:
        return self.proc.memory_info().rss

    def alive(self) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(
                f"the triggerer exited ({self.popen.returncode}): see {self._log.name}"
            )

    def stop(self) -> None:
        import signal
        import subprocess

        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


class _Db:
    """The benchmark's own read-only look at the SQLite file (WAL: it never blocks the
    triggerer's writes)."""

    def __init__(self, path: Path) -> None:
        import sqlite3

        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)

    def one(self, sql: str, *args: Any) -> Any:
        return self.conn.execute(sql, args).fetchone()

    def runs(self) -> int:
        return int(self.one("SELECT count(*) FROM dag_run")[0])

    def held(self, pid: int) -> tuple[int, int]:
        """(shards held, waits loaded) by the triggerer process ``pid``."""
        row = self.one("SELECT id, triggers FROM triggerer WHERE id LIKE ?", f"%:{pid}:%")
        if row is None:
            return 0, 0
        shards = self.one(
            "SELECT count(*) FROM shard_lease WHERE owner = ? AND expires_at > ?",
            row[0],
            time.time(),
        )[0]
        return int(shards), int(row[1])

    def armed_ends(self) -> tuple[int, float | None]:
        """(start waits, the earliest interval end they wait for, epoch seconds)."""
        from datetime import datetime

        count, first = self.one("SELECT count(*), min(interval_end) FROM start_wait")
        return int(count), None if first is None else datetime.fromisoformat(first).timestamp()

    def close(self) -> None:
        self.conn.close()


def _until(what: str, ready: Callable[[], bool], timeout: float, tp: _TriggererProcess) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        tp.alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.5))


def _hold(db_path: Path, n: int, log: Path) -> tuple[_TriggererProcess, _Db]:
    """A triggerer holding the ``n`` schedules of ``db_path``, none of them due soon.

    Armed from scratch, a schedule without catchup waits for its latest ended interval, so
    a first triggerer creates those runs at once and re-arms every schedule on the next
    minute (one trigger row). It is stopped once every wait is at least 15 s away, and the
    triggerer returned is a fresh process that has loaded all ``n`` waits and fired nothing:
    its memory is that of holding them."""
    db = _Db(db_path)
    url = f"sqlite:///{db_path}"
    first = _TriggererProcess(url, log)
    try:

        def settled() -> bool:
            count, end = db.armed_ends()
            return db.runs() >= n and count == n and end is not None and end > time.time() + 15

        _until("the first runs and the waits re-armed", settled, 180, first)
    finally:
        first.stop()
    tp = _TriggererProcess(url, log)
    _until(
        f"a triggerer holding 64 shards and {n:,} waits", lambda: db.held(tp.pid) == (64, n), 60, tp
    )
    return tp, db


def _rss_settled(tp: _TriggererProcess, seconds: float = 2.0) -> int:
    """The triggerer's RSS once it has been idle ``seconds``: the median of 10 samples."""
    samples = []
    for _ in range(10):
        time.sleep(seconds / 10)
        samples.append(tp.rss())
    return sorted(samples)[len(samples) // 2]


class _Observer:
    """Samples, every :data:`SAMPLE_EVERY` s from a thread: (time, runs committed, the
    triggerer's CPU seconds, its RSS)."""

    def __init__(self, db_path: Path, tp: _TriggererProcess) -> None:
        import threading

        self._db_path = db_path
        self._tp = tp
        self.samples: list[tuple[float, int, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-ticks", daemon=True)

    def __enter__(self) -> _Observer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        db = _Db(self._db_path)
        try:
            while True:
                self.samples.append((time.time(), db.runs(), self._tp.cpu_s(), self._tp.rss()))
                if self._stop.wait(SAMPLE_EVERY):
                    return
        finally:
            db.close()

    def at(self, t: float) -> tuple[float, int, float, int]:
        """The sample nearest ``t``."""
        return min(self.samples, key=lambda s: abs(s[0] - t))

    def between(self, a: float, b: float) -> list[tuple[float, int, float, int]]:
        return [s for s in self.samples if a <= s[0] <= b]


def _py_spy() -> str | None:
    import shutil

    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _profile_tick(tp: _TriggererProcess, tick: float, out: Path) -> None:
    """py-spy on the triggerer from ``tick`` - 2 s for 20 s (a flame graph for .svg, a
    speedscope file for .json, else collapsed stacks). Not a measured tick: the sampler
    slows the process down."""
    import subprocess

    exe = _py_spy()
    if exe is None:
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(out.suffix, "raw")
    _sleep_until(tick - 2)
    common.console.print(f"profiling the tick at {time.strftime('%H:%M:%S', time.localtime(tick))}")
    subprocess.run(
        [exe, "record", "--pid", str(tp.pid), "--duration", "20", "--rate", "200",
         "--format", fmt, "-o", str(out)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    common.console.print(f"wrote {out}")


def run_ticks(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    n = args.dags
    logs = workdir / "triggerer.log"
    # The baseline: a triggerer holding one schedule (the same imports, trigger class and
    # statements warmed up), so that memory per schedule is what the others add.
    base_folder, base_db = workdir / "dags-one", workdir / "ticks-one.db"
    base_folder.mkdir()
    asyncio.run(_seed_ticks(base_folder, f"sqlite:///{base_db}", 1))
    tp, db = _hold(base_db, 1, logs)
    try:
        rss_one = _rss_settled(tp)
    finally:
        tp.stop()
        db.close()

    folder, db_path = workdir / "dags-ticks", workdir / "ticks.db"
    folder.mkdir()
    t0 = time.perf_counter()
    asyncio.run(_seed_ticks(folder, f"sqlite:///{db_path}", n))
    seed_s = time.perf_counter() - t0
    common.console.print(f"ticks: {n:,} DAGs written and catalogued in {seed_s:.1f} s")
    tp, db = _hold(db_path, n, logs)
    try:
        rss_loaded = _rss_settled(tp)
        _, first = db.armed_ends()
        assert first is not None
        moments = [first + 60 * k for k in range(args.ticks)]
        with _Observer(db_path, tp) as seen:
            for tick in moments:
                common.console.print(
                    f"ticks: waiting for {time.strftime('%H:%M:%S', time.localtime(tick))}"
                )
                _sleep_until(tick + CPU_AFTER_S)
                _until(
                    f"{n:,} runs of the tick",
                    functools.partial(_tick_done, db, tick, n),
                    60 - CPU_AFTER_S - CPU_BEFORE_S,
                    tp,
                )
        rss_after = _rss_settled(tp)
        if args.profile:
            _profile_tick(tp, moments[-1] + 60, Path(args.profile))
    finally:
        tp.stop()
    try:
        return _tick_figures(db, seen, moments, n, rss_one, rss_loaded, rss_after, seed_s)
    finally:
        db.close()


def _tick_done(db: _Db, tick: float, n: int) -> bool:
    runs = db.one("SELECT count(*) FROM dag_run WHERE data_interval_end = ?", _iso(tick))[0]
    return int(runs) >= n


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat()


def _tick_figures(
    db: _Db,
    seen: _Observer,
    moments: list[float],
    n: int,
    rss_one: int,
    rss_loaded: int,
    rss_after: int,
    seed_s: float,
) -> dict[str, Any]:
    latencies: list[float] = []  # T -> committed, per run
    began: list[float] = []  # T -> created_at (the fire's transaction began), per run
    per_tick: list[dict[str, Any]] = []
    for tick in moments:
        rows = db.conn.execute(
            "SELECT dag_id, created_at, state FROM dag_run WHERE data_interval_end = ?",
            (_iso(tick),),
        ).fetchall()
        dags = {r[0] for r in rows}
        states = sorted({r[2] for r in rows})
        if len(rows) != n or len(dags) != n:
            raise RuntimeError(f"tick {_iso(tick)}: {len(rows)} runs of {len(dags)} DAGs, not {n}")
        lat = sorted(r[1] - tick for r in rows)
        began += lat
        before = seen.at(tick - CPU_BEFORE_S)
        after = seen.at(tick + CPU_AFTER_S)
        # When each run was visible to another process: the k-th run of the tick at the
        # first sample that counted k runs more than before T (created_at is only when
        # the fire's transaction began; nothing can claim a run before its commit).
        since = [(s[0] - tick, s[1] - before[1]) for s in seen.samples if s[0] >= tick]
        committed = [next(t for t, count in since if count >= k) for k in range(1, n + 1)]
        latencies += committed
        visible = tick + committed[-1]
        window = seen.between(tick - CPU_BEFORE_S, tick + CPU_AFTER_S)
        per_tick.append(
            {
                "tick": _iso(tick),
                "runs": len(rows),
                "states": states,
                "created_first_s": round(lat[0], 4),
                "created_last_s": round(lat[-1], 4),
                "visible_s": round(visible - tick, 3),
                "cpu_s": round(after[2] - before[2], 3),
                "rss_peak_mib": round(max(s[3] for s in window) / 2**20, 1),
                # For the figure: seconds after T, runs committed since, CPU since T - 1 s.
                "curve": [
                    [round(s[0] - tick, 3), s[1] - before[1], round(s[2] - before[2], 3)]
                    for s in window
                ],
                "created_after_s": [round(x, 4) for x in lat[:: max(1, n // 200)]],
            }
        )
    # Idle: from T + 10 s to the next T - 1 s, per minute.
    idle = []
    for a, b in itertools.pairwise(moments):
        s0, s1 = seen.at(a + CPU_AFTER_S), seen.at(b - CPU_BEFORE_S)
        idle.append((s1[2] - s0[2]) * 60 / (s1[0] - s0[0]))
    latencies.sort()
    cpu = [t["cpu_s"] for t in per_tick]
    idle_per_min = sum(idle) / len(idle) if idle else None
    return {
        "schedules": n,
        "ticks": len(moments),
        "runs_per_tick": [t["runs"] for t in per_tick],
        "run_created_p50_s": round(common.percentile(latencies, 50), 4),
        "run_created_p99_s": round(common.percentile(latencies, 99), 4),
        "run_created_max_s": round(latencies[-1], 4),
        "fire_began_p99_s": round(common.percentile(sorted(began), 99), 4),
        "cpu_per_tick_s": round(sum(cpu) / len(cpu), 3),
        "idle_cpu_per_min_s": None if idle_per_min is None else round(idle_per_min, 3),
        # The tick's window minus what the same 11 s cost between ticks: the fire's own.
        "cpu_per_tick_above_idle_s": None
        if idle_per_min is None
        else round(sum(cpu) / len(cpu) - idle_per_min * (CPU_BEFORE_S + CPU_AFTER_S) / 60, 3),
        "rss_per_schedule_bytes": round((rss_loaded - rss_one) / max(1, n - 1)),
        "rss_per_schedule_after_ticks_bytes": round((rss_after - rss_one) / max(1, n - 1)),
        "rss_one_schedule_mib": round(rss_one / 2**20, 1),
        "rss_loaded_mib": round(rss_loaded / 2**20, 1),
        "rss_after_ticks_mib": round(rss_after / 2**20, 1),
        "ticks_seed_s": round(seed_s, 1),
        "tick_details": per_tick,
    }


def plot_ticks(ax: Any, doc: dict[str, Any]) -> None:
    cpu_ax = ax.twinx()
    for k, t in enumerate(doc["tick_details"]):
        color = f"C{k}"
        xs = [p[0] for p in t["curve"]]
        ax.step(xs, [p[1] for p in t["curve"]], where="post", color=color,
                label=f"{t['tick'][11:16]} UTC: committed ({t['visible_s']:.2f} s)")  # fmt: skip
        created = t["created_after_s"]
        ax.plot(created, [doc["schedules"] * (i + 1) / len(created) for i in range(len(created))],
                ls=":", color=color, lw=2)  # fmt: skip
        cpu_ax.plot(xs, [p[2] for p in t["curve"]], ls="--", color=color, lw=1)
    ax.axvline(TICK_TARGET_P99_S, color="red", ls="--", lw=1, label="target: p99 < 1 s")
    ax.set_xlim(-CPU_BEFORE_S, CPU_AFTER_S)
    ax.set(
        title=(
            f"{doc['schedules']:,} DAGs on * * * * *, one triggerer: runs after the tick T\n"
            f"committed p50 {doc['run_created_p50_s']:.2f} s, p99 "
            f"{doc['run_created_p99_s']:.2f} s; fire began (dotted) p99 "
            f"{doc['fire_began_p99_s']:.3f} s\nCPU {doc['cpu_per_tick_s']:.2f} s per tick"
        ),
        xlabel="seconds after T",
        ylabel="runs (solid: committed, seen by a reader)",
    )
    cpu_ax.set_ylabel("triggerer CPU seconds since T - 1 s (dashed)")
    ax.legend(loc="center right", fontsize=8)
    ax.grid(alpha=0.3)


# -- the sections, the merged result -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Section:
    run: Callable[[argparse.Namespace, Path], dict[str, Any]]  # -> its keys of the JSON
    plot: Callable[[Any, dict[str, Any]], None]  # one axis, from the merged JSON
    first_key: str  # present in the JSON once the section ran: its axis is drawn
    params: Callable[[argparse.Namespace], dict[str, Any]]


SECTIONS: dict[str, Section] = {
    "parse": Section(
        run_parse,
        plot_parse,
        "parse_files",
        lambda a: {"files": a.files, "changed": a.changed, "jobs": a.jobs, "timeout": a.timeout},
    ),
    "ticks": Section(
        run_ticks,
        plot_ticks,
        "tick_details",
        lambda a: {"dags": a.dags, "ticks": a.ticks, "max_active_runs": TICK_MAX_ACTIVE},
    ),
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="slotless bench schedules",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated, of: {', '.join(SECTIONS)} (default: all of them)",
    )
    p.add_argument("--files", type=int, default=1000, help="DAG files in the folder (1,000)")
    p.add_argument("--changed", type=int, default=10, help="files touched for the re-scan (10)")
    p.add_argument("--jobs", type=int, default=None, help="files at once (default: one per core)")
    p.add_argument("--timeout", type=float, default=30.0, help="parse limit per file (30 s)")
    p.add_argument("--dags", type=int, default=10_000, help="scheduled DAGs (10,000)")
    p.add_argument("--ticks", type=int, default=3, help="minute ticks observed (3)")
    p.add_argument(
        "--profile",
        help="py-spy the triggerer during one more tick, into this file (.svg, .json or raw)",
    )
    p.add_argument("--workdir", help="where DAG files and the database go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--results", type=Path, default=common.RESULTS)
    calibration.add_repeats_argument(p)
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown or not args.sections:
        p.error(
            f"unknown section(s) {', '.join(unknown) or '(none)'}; built: {', '.join(SECTIONS)}"
        )
    if args.dags < 1 or args.ticks < 1:
        p.error("--dags and --ticks must be at least 1")
    if not 0 < args.changed <= args.files:
        p.error("--changed must be between 1 and --files")
    return args


def merged(path: Path, new: dict[str, Any]) -> dict[str, Any]:
    """The result file as it was, with ``new``'s keys over it (one level deep for dicts:
    ``params`` and ``runs`` are per section)."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict) and key in ("params", "runs"):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return doc


def numbers(figures: dict[str, Any]) -> dict[str, float | None]:
    """One run's headline figures: every number its sections report at the top level."""
    return {
        k: v
        for f in figures.values()
        for k, v in f.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def plot(doc: dict[str, Any], results: Path) -> Path:
    drawn = [s for s in SECTIONS.values() if s.first_key in doc]
    fig, axes = common.subplots(len(drawn))
    for section, ax in zip(drawn, axes if len(drawn) > 1 else [axes], strict=True):
        section.plot(ax, doc)
    fig.suptitle(f"slotless scheduling ({calibration.caption(doc)})", fontsize=9)
    return common.save_figure(fig, NAME, results)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)

    def once(workdir: Path, i: int) -> dict[str, Any]:
        where = workdir / f"run{i}"
        where.mkdir(exist_ok=True)
        return {name: SECTIONS[name].run(args, where) for name in args.sections}

    with common.workdir(args.workdir, args.keep) as workdir, calibration.Recording(workdir) as rec:
        head = common.result_document(NAME, argv, {}, workdir)
        every = rec.repeat(args.repeats, lambda i: once(workdir, i), numbers)
    first = next(iter(rec.runs[0]["figures"]), None)
    figures = every[rec.kept(first) if first else 0]
    load = rec.load
    runs = {
        name: {"date": head["date"], "command": head["command"], "machine_load": load}
        for name in args.sections
    }
    params = {name: SECTIONS[name].params(args) for name in args.sections}
    new = {**head, "params": params, "runs": runs, **rec.fields()}
    for keys in figures.values():
        new.update(keys)
    doc = merged(args.results / f"{NAME}.json", new)
    png = plot(doc, args.results)
    path = common.write_json(NAME, doc, args.results)
    rows = [
        (k, f"{v:,}" if isinstance(v, int) else f"{v:g}")
        for f in figures.values()
        for k, v in f.items()
        if isinstance(v, int | float)  # the per-tick details are in the JSON
    ]
    common.print_table(
        f"schedules: {', '.join(args.sections)}",
        [
            *rows,
            *calibration.repeat_rows(doc["repeats"]),
            calibration.calibration_row(doc["calibration"]),
            common.load_row(load),
        ],
    )
    common.console.print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
