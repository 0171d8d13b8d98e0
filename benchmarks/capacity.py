"""Triggerer capacity: N distinct waits held by one triggerer process.

    python -m benchmarks.capacity                  # 10,000 and 100,000 waits
    python -m benchmarks.capacity --sizes 1000000  # scale up

For each N, the waits are written as DEFERRED task rows with their trigger rows (as a
worker's deferral writes them), then a fresh subprocess starts a Triggerer over the file
so that its memory baseline is clean. Each wait is a cheap check (:class:`NoopTrigger`,
never true) every ``--interval`` seconds. Measured: time from start until all N are
loaded, RSS per wait above the baseline, event-loop lag (the triggerer's own watch),
checks per second, CPU. Alongside the N waits, ``--probes`` file waits with a 1 s
interval measure the latency from a file landing to its task being PENDING. A second
workload with 40% duplicate waits counts the checks made in each cycle.

Results: benchmarks/results/capacity.json and capacity.png.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from triggers.base import BaseTrigger, TriggerEvent
from triggers.context import TriggerContext
from triggers.files import FileTrigger
from triggers.registry import register

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
KIB = 1024

# The targets at 1,000,000 waits (the largest size run); CPU at W1, the
# cheap-poll workload (19,000 waits on 5 s). CPU per check is measured at every size:
# at 60 s intervals a 70 s window holds each wait's first and second checks, which both
# write a log line, and the fixed costs (reconcile, leases) spread over fewer checks.
TARGETS = {
    "bytes_per_trigger": KIB,
    "loop_lag_p99_ms": 50.0,
    "loop_lag_max_ms": 50.0,
    "load_s": 10.0,
    "latency_p99_s": 1.1,
    "cpu_us_per_check": 10.0,
    "cpu_s_per_min_w1": 3.0,
}

# Calls of NoopTrigger.poke in this process (and, for the duplicates workload, when and
# for which key): the triggerer's own counter says the same, this one is the trigger's word.
CALLS = 0
FIRST_CALL = 0.0  # time.monotonic() of the first call
CALL_LOG: list[tuple[float, str]] | None = None


@register
class NoopTrigger(BaseTrigger):
    """A condition that is never true and costs nothing to check: the triggerer's overhead."""

    key: str
    salt: str = ""  # a distinct salt makes equal keys distinct checks (dedup off)

    def describe(self) -> str:
        return f"noop:{self.key}"

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        global CALLS, FIRST_CALL
        CALLS += 1
        if CALLS == 1:
            FIRST_CALL = time.monotonic()
        if CALL_LOG is not None:
            CALL_LOG.append((time.monotonic(), self.key))
        return None


# -- writing waits as a worker's deferral would -------------------------------------------


def create_schema(db_path: Path) -> None:
    from executor.store import open_store

    async def go() -> None:
        store = await open_store(f"sqlite:///{db_path}")
        await store.close()

    asyncio.run(go())


def insert_waits(
    db_path: Path,
    triggers: Sequence[BaseTrigger],
    *,
    run_id: str,
    prefix: str,
    next_method: str | None = None,
    timeout: float = 12 * 3600.0,
) -> list[int]:
    """Write one DEFERRED task and its trigger row per trigger, in bulk; returns task ids.

    The rows are those ``executor.store.recording._defer`` writes (trigger row, then the task
    with its trigger id, wait start and timeout, state DEFERRED), without a worker
    round-trip per task. Equal triggers are serialized (and hashed) once.
    """
    now = time.time()
    cache: dict[int, tuple[str, str, str, int]] = {}
    trig_rows = []
    for t in triggers:
        ser = cache.get(id(t))
        if ser is None:
            classpath, kwargs = t.serialize()
            ser = (classpath, json.dumps(kwargs, sort_keys=True), t.poke_hash(), t.shard())
            cache[id(t)] = ser
        trig_rows.append((*ser, now))
    conn = sqlite3.connect(str(db_path), timeout=60)
    try:
        with conn:
            exists = conn.execute("SELECT 1 FROM dag_run WHERE run_id = ?", (run_id,)).fetchone()
            if exists:
                conn.execute(
                    "UPDATE dag_run SET tasks_unfinished = tasks_unfinished + ? WHERE run_id = ?",
                    (len(triggers), run_id),
                )
            else:
                conn.execute(
                    "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at,"
                    " tasks_unfinished) VALUES (?, 'capacity', '2026-01-01', 'RUNNING', ?, ?)",
                    (run_id, now, len(triggers)),
                )
            first_trigger = (conn.execute("SELECT max(id) FROM trigger").fetchone()[0] or 0) + 1
            conn.executemany(
                "INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                trig_rows,
            )
            first_task = (conn.execute("SELECT max(id) FROM task").fetchone()[0] or 0) + 1
            conn.executemany(
                "INSERT INTO task (run_id, task_id, state, trigger_rule, is_leaf, updated_at,"
                " started_at, trigger_id, next_method, next_kwargs, wait_started_at,"
                " wait_timeout_at) VALUES (?, ?, 'DEFERRED', 'all_success', 1, ?, ?, ?, ?,"
                " ?, ?, ?)",
                [
                    (
                        run_id,
                        f"{prefix}{i:07d}",
                        now,
                        now,
                        first_trigger + i,
                        next_method,
                        None if next_method is None else "{}",
                        now,
                        now + timeout,
                    )
                    for i in range(len(triggers))
                ],
            )
    finally:
        conn.close()
    return list(range(first_task, first_task + len(triggers)))


def waits_with_duplicates(n: int, dup_fraction: float, interval: float) -> list[BaseTrigger]:
    """``n`` waits of which ``dup_fraction`` wait for the same condition as another one."""
    dups = round(n * dup_fraction)
    distinct = n - dups
    if dups > distinct:
        raise ValueError("at most half of the waits can be duplicates of another")
    base = [NoopTrigger(key=f"k{i}", poke_interval=interval) for i in range(distinct)]
    rng = random.Random(4)
    twins = rng.sample(range(distinct), dups)
    # A duplicate is an equal condition written by another task: a separate object.
    out: list[BaseTrigger] = list(base)
    out += [NoopTrigger(key=f"k{i}", poke_interval=interval) for i in twins]
    rng.shuffle(out)
    return out


# -- the measuring subprocess ---------------------------------------------------------------


def _emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _pct(values: list[float], q: float) -> float:
    from .common import percentile

    return percentile(sorted(values), 100 * q) if values else 0.0


async def _child(p: dict[str, Any]) -> dict[str, Any]:
    import psutil

    from executor.store import open_store
    from triggerer.service import Triggerer

    global CALL_LOG
    if p.get("log_calls"):
        CALL_LOG = []
    proc = psutil.Process()
    store = await open_store(f"sqlite:///{p['db']}")
    await _warm_up(p["db"])
    triggerer = Triggerer(store.views)
    triggerer.watch.lags = __import__("collections").deque()  # keep every sample
    expected = p["n"] + p["probes"]
    if p.get("tracemalloc"):
        import tracemalloc

        tracemalloc.start()
    gc.collect()
    rss0 = proc.memory_info().rss
    cpu0 = proc.cpu_times()
    traced0 = __import__("tracemalloc").get_traced_memory()[0] if p.get("tracemalloc") else 0

    profiler = None
    if p.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.monotonic()
    runner = asyncio.create_task(triggerer.run())
    samples: list[dict[str, Any]] = []
    lags_seen = 0
    while triggerer.table.subscriptions < expected:
        await asyncio.sleep(0.005)
        if not samples or time.monotonic() - t0 - samples[-1]["t"] >= 0.5:
            lags = triggerer.watch.lags
            new = [lags[i] for i in range(lags_seen, len(lags))]
            lags_seen = len(lags)
            samples.append(
                {
                    "t": round(time.monotonic() - t0, 3),
                    "rss": proc.memory_info().rss,
                    "checks": CALLS,
                    "lag_ms": round(1000 * max(new, default=0.0), 2),
                    "loading": True,
                }
            )
        if time.monotonic() - t0 > p["load_timeout"]:
            raise RuntimeError(
                f"only {triggerer.table.subscriptions} of {expected} waits loaded "
                f"after {p['load_timeout']} s"
            )
    load_s = time.monotonic() - t0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(p["profile"])
    rss_loaded = proc.memory_info().rss
    cpu_loaded = proc.cpu_times()
    traced = (
        __import__("tracemalloc").get_traced_memory()[0] - traced0 if p.get("tracemalloc") else 0
    )
    heap_by_line = _heap_by_line(p["n"]) if p.get("tracemalloc") else None
    lag_at_load = len(triggerer.watch.lags)
    full_gcs: list[float] = []
    full_gc_cpu: list[float] = []  # the loop thread's CPU: wall time counts a busy machine too
    full_gc_objects: list[int] = []  # what a full collection walks (frozen objects are not)
    gc_started = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                full_gc_objects.append(len(gc.get_objects(generation=2)))
                gc_started[:] = [time.perf_counter(), time.thread_time()]
            else:
                full_gcs.append(1000 * (time.perf_counter() - gc_started[0]))
                full_gc_cpu.append(1000 * (time.thread_time() - gc_started[1]))

    gc.callbacks.append(on_gc)
    distinct = len(triggerer.table) - p["probes"]
    _emit(phase="loaded", load_s=load_s)

    # Probe files land at random moments of the window; each one is a FileTrigger wait.
    loop = asyncio.get_running_loop()
    landed: dict[str, float] = {}
    rng = random.Random(p["n"])

    def land(path: str) -> None:
        Path(path).write_text("x")
        landed[path] = time.time()

    for path in p["probe_paths"]:
        loop.call_later(rng.uniform(2.0, max(2.5, p["window"] - 3.0)), land, path)

    calls_at_load = CALLS
    first_cycle_s = None
    t_run = time.monotonic()
    cpu_run0 = proc.cpu_times()
    checks_run0 = CALLS
    while True:
        await asyncio.sleep(0.05)
        now = time.monotonic()
        if first_cycle_s is None and distinct <= CALLS:
            # The first cycle may begin while the rows are still loading.
            first_cycle_s = now - FIRST_CALL
        if not samples or now - t0 - samples[-1]["t"] >= 0.5:
            lags = triggerer.watch.lags
            new = [lags[i] for i in range(lags_seen, len(lags))]
            lags_seen = len(lags)
            samples.append(
                {
                    "t": round(now - t0, 3),
                    "rss": proc.memory_info().rss,
                    "checks": CALLS,
                    "lag_ms": round(1000 * max(new, default=0.0), 2),
                }
            )
            _emit(phase="run", frac=min(1.0, (now - t_run) / p["window"]))
        if now - t_run >= p["window"]:
            break
    window = time.monotonic() - t_run
    gc.callbacks.remove(on_gc)
    cpu_end = proc.cpu_times()
    rss_end = proc.memory_info().rss
    # From the first check on: with paged loading, the first cycle starts before all
    # the waits are loaded.
    checks = CALLS
    checking_s = time.monotonic() - FIRST_CALL
    triggerer.stop()
    await runner
    await store.close()

    conn = sqlite3.connect(p["db"])
    pending = dict(
        conn.execute(
            "SELECT t.task_id, e.ts FROM task_event e JOIN task t ON t.id = e.task_row"
            " WHERE e.to_state = 'PENDING' AND t.task_id LIKE 'probe%'"
        ).fetchall()
    )
    conn.close()
    latencies = []
    probes = []
    wall0 = time.time() - (time.monotonic() - t0)
    for i, path in enumerate(p["probe_paths"]):
        ts = pending.get(f"probe{i:07d}")
        if path in landed and ts is not None:
            latencies.append(ts - landed[path])
            probes.append(
                {
                    "landed_s": round(landed[path] - wall0, 3),
                    "latency_s": round(ts - landed[path], 4),
                }
            )
    lags_ms = [x * 1000 for x in triggerer.watch.lags]
    after = lags_ms[lag_at_load:]

    def cpu_s(a: Any, b: Any) -> float:
        return (b.user - a.user) + (b.system - a.system)

    n = p["n"]
    return {
        "triggers": n,
        "distinct_checks": distinct,
        "load_s": round(load_s, 3),
        "rss_baseline_mib": round(rss0 / 2**20, 1),
        "rss_loaded_mib": round(rss_loaded / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1),
        "rss_peak_mib": round(max([rss_loaded, rss_end] + [s["rss"] for s in samples]) / 2**20, 1),
        "bytes_per_trigger": round((rss_loaded - rss0) / n),
        "bytes_per_trigger_steady": round((rss_end - rss0) / n),
        "python_heap_bytes_per_trigger": round(traced / n) if p.get("tracemalloc") else None,
        "python_heap_by_line": heap_by_line,
        "loop_lag_p50_ms": round(_pct(after, 0.50), 2),
        "loop_lag_p99_ms": round(_pct(after, 0.99), 2),
        "loop_lag_max_ms": round(max(after, default=0.0), 1),
        "loop_lag_samples": len(after),
        "loop_lag_max_while_loading_ms": round(max(lags_ms[:lag_at_load], default=0.0), 1),
        "loop_blocks_reported": sum(triggerer.watch.blocked.values()),
        "full_gc_pauses_ms": [round(x, 1) for x in full_gcs],
        "full_gc_cpu_ms": [round(x, 2) for x in full_gc_cpu],
        "full_gc_objects_max": max(full_gc_objects, default=0),
        "gc_frozen_objects": gc.get_freeze_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "window_s": round(window, 1),
        "checks": checks,
        "checks_per_s": round(checks / checking_s, 1),
        "checks_after_load": checks - calls_at_load,
        "first_cycle_s": None if first_cycle_s is None else round(first_cycle_s, 3),
        "first_cycle_checks_per_s": (round(distinct / first_cycle_s) if first_cycle_s else None),
        "cpu_load_s": round(cpu_s(cpu0, cpu_loaded), 2),
        "cpu_percent": round(100 * cpu_s(cpu_run0, cpu_end) / window, 1),
        "cpu_s_per_min": round(60 * cpu_s(cpu_run0, cpu_end) / window, 2),
        # Everything the process did in the window (checks, heap, loop, writes), per check.
        "cpu_us_per_check": (
            round(1e6 * cpu_s(cpu_run0, cpu_end) / (checks - checks_run0), 2)
            if checks > checks_run0
            else None
        ),
        "checks_in_window": checks - checks_run0,
        "probe_interval_s": p["probe_interval"],
        "probe_latencies_s": sorted(round(x, 4) for x in latencies),
        "probes": probes,
        "probes_landed": len(landed),
        "samples": samples,
        "call_log": CALL_LOG,
    }


def _heap_by_line(n: int, top: int = 15) -> list[dict[str, Any]]:
    """Where the held waits' Python memory was allocated (tracemalloc, by source line)."""
    import tracemalloc

    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]
    )
    stats = snap.statistics("lineno")[:top]
    return [
        {
            "where": f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}",
            "bytes_per_trigger": round(s.size / n, 1),
            "blocks_per_trigger": round(s.count / n, 3),
        }
        for s in stats
    ]


async def _warm_up(db: str) -> None:
    """What any serving triggerer has done once, so that it is not counted per wait: the
    allow-list's entry-point scan, the thread that lists directories, the first queries."""
    from triggers.checking import CheckContext
    from triggers.registry import load_trigger

    probe = load_trigger("triggers.files.FileTrigger", {"path": str(Path(db).parent / "none")})
    # The context the triggerer checks with: a stand-in falls behind what checks use.
    await FileTrigger.poke_many([probe], CheckContext())


# -- the parent: one subprocess per N ------------------------------------------------------


def _run_child(params: dict[str, Any], on_progress: Any) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.capacity", "--child", json.dumps(params)]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=HERE.parent)
    assert proc.stdout is not None
    result = None
    for line in proc.stdout:
        msg = json.loads(line)
        if "result" in msg:
            result = msg["result"]
        else:
            on_progress(msg)
    if proc.wait() != 0 or result is None:
        raise RuntimeError(f"capacity child for N={params['n']} failed (exit {proc.returncode})")
    return result


def run_size(
    n: int,
    args: argparse.Namespace,
    on_progress: Any,
    *,
    dup_fraction: float = 0.0,
    interval: float | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="slotless-capacity-") as tmp:
        db = Path(tmp) / "capacity.db"
        create_schema(db)
        if interval is None:
            interval = args.interval if not dup_fraction else args.dup_interval
        if dup_fraction:
            waits = waits_with_duplicates(n, dup_fraction, interval)
        else:
            waits = [NoopTrigger(key=f"k{i}", poke_interval=interval) for i in range(n)]
        insert_waits(db, waits, run_id="capacity", prefix="w")
        del waits
        probes = 0 if dup_fraction else args.probes
        probe_dir = Path(tmp) / "landing"
        probe_dir.mkdir()
        paths = [str(probe_dir / f"file{i}.csv") for i in range(probes)]
        probe_triggers = [FileTrigger(path=p_, poke_interval=args.probe_interval) for p_ in paths]
        insert_waits(
            db, list(probe_triggers), run_id="capacity", prefix="probe", next_method="resume"
        )
        params = {
            "db": str(db),
            "n": n,
            "probes": probes,
            "probe_paths": paths,
            "probe_interval": args.probe_interval,
            "window": args.dup_window if dup_fraction else args.window,
            "load_timeout": args.load_timeout,
            "log_calls": bool(dup_fraction),
            "tracemalloc": args.tracemalloc,
            "interval": interval,
            "profile": str(args.profile) if args.profile and not dup_fraction else None,
        }
        result = _run_child(params, on_progress)
        result["interval_s"] = interval
        return result


def cycles_of(call_log: list[tuple[float, str]], interval: float) -> list[list[str]]:
    """Split the checks into cycles: bursts separated by more than half an interval."""
    cycles: list[list[str]] = []
    last = None
    for t, key in sorted(call_log):
        if last is None or t - last > interval / 2:
            cycles.append([])
        cycles[-1].append(key)
        last = t
    return cycles


def duplicates_summary(
    dup: dict[str, Any] | None, n: int, fraction: float, interval: float
) -> dict[str, Any]:
    """What the duplicates workload showed; ``dup`` None: it did not run (``--no-dup``).

    "Each condition once per cycle" is a claim about cycles that were seen: with no cycle
    seen (the workload skipped, or no check made in its window) it is None, not measured,
    never a vacuous True.
    """
    if dup is None:
        return {
            "subscriptions": n,
            "duplicate_fraction": fraction,
            "measured": False,
            "each_condition_once_per_cycle": None,
        }
    cycles = cycles_of(dup.get("call_log") or [], interval)
    distinct = dup["distinct_checks"]
    return {
        "subscriptions": n,
        "duplicate_fraction": fraction,
        "measured": True,
        "distinct_conditions": distinct,
        "interval_s": interval,
        "checks_per_cycle": [len(c) for c in cycles],
        "each_condition_once_per_cycle": (
            all(len(c) == len(set(c)) == distinct for c in cycles) if cycles and distinct else None
        ),
        "checks_without_dedup_per_cycle": n,
    }


def main(argv: list[str] | None = None) -> int:
    from . import calibration

    ap = argparse.ArgumentParser(prog="slotless bench capacity", description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="10000,100000", help="numbers of waits (comma-separated)")
    ap.add_argument("--interval", type=float, default=60.0, help="check interval of each wait (s)")
    ap.add_argument(
        "--intervals",
        default=None,
        help="an interval per size (comma-separated, e.g. 5,60,60), instead of --interval",
    )
    ap.add_argument("--window", type=float, default=70.0, help="seconds measured after loading")
    ap.add_argument("--probes", type=int, default=20, help="file waits timing file -> PENDING")
    ap.add_argument("--probe-interval", type=float, default=1.0)
    ap.add_argument("--dup-n", type=int, default=10_000, help="waits in the duplicates workload")
    ap.add_argument("--dup-fraction", type=float, default=0.4)
    ap.add_argument("--dup-interval", type=float, default=5.0)
    ap.add_argument("--dup-window", type=float, default=17.0)
    ap.add_argument("--load-timeout", type=float, default=600.0)
    ap.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations")
    ap.add_argument("--no-dup", action="store_true", help="skip the duplicates workload")
    ap.add_argument(
        "--profile",
        type=Path,
        help="write cProfile stats of the largest size's load to this file (slows the load)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    calibration.add_repeats_argument(ap)
    args = ap.parse_args(argv)
    if args.child:
        try:
            result = asyncio.run(_child(json.loads(args.child)))
        except BaseException:
            # The store's driver thread would keep a failed child alive, and its parent
            # waiting on it for ever: say why and go.
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        _emit(result=result)
        return 0

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from . import common

    console = common.console
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    intervals = (
        [float(x) for x in args.intervals.split(",")]
        if args.intervals
        else [args.interval] * len(sizes)
    )
    if len(intervals) != len(sizes):
        ap.error("--intervals needs one interval per size")
    interval_of = dict(zip(sizes, intervals, strict=True))
    rec = calibration.Recording(Path(tempfile.gettempdir()))
    rounds: list[list[dict[str, Any]]] = []
    with (
        rec,
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        dup: dict[str, Any] | None = None
        # Every size once per repeat, the duplicates workload once at the end (it counts
        # checks per cycle: a property, not a timing).
        plan: list[tuple[int, int | None]] = [(r, n) for r in range(args.repeats) for n in sizes]
        for rep, n in [*plan, *([] if args.no_dup else [(args.repeats - 1, None)])]:
            label = f"{n:,} waits" if n else f"{args.dup_n:,} waits, {args.dup_fraction:.0%} dup"
            if args.repeats > 1 and n:
                label += f", run {rep + 1} of {args.repeats}"
            bar = progress.add_task(label, total=1.0, note="writing rows")

            def on_progress(msg: dict[str, Any], bar: Any = bar) -> None:
                if msg["phase"] == "loaded":
                    progress.update(bar, note=f"loaded in {msg['load_s']:.2f} s")
                else:
                    progress.update(bar, completed=msg["frac"])

            if n is None:
                dup = run_size(args.dup_n, args, on_progress, dup_fraction=args.dup_fraction)
            else:
                if rep == len(rounds):
                    rounds.append([])
                with common.MachineLoad() as one:
                    run = run_size(n, args, on_progress, interval=interval_of[n])
                run.pop("call_log", None)
                run["machine_load"] = one.summary
                rounds[rep].append(run)
                if len(rounds[rep]) == len(sizes):
                    rec.add(headline(rounds[rep], args.probe_interval))
            progress.update(bar, completed=1.0, note="done")

    duplicates = duplicates_summary(dup, args.dup_n, args.dup_fraction, args.dup_interval)
    repeats = rec.repeats()
    # The repeat whose load time is the median gives the detail (samples, probes, plot);
    # the headline figures are each one's median over the repeats.
    kept = calibration.median_index([h["figures"]["load_s"] for h in repeats["runs"]])
    runs = rounds[kept]
    med = {k: v["median"] for k, v in repeats["figures"].items()}
    top = max(runs, key=lambda r: r["triggers"])
    lat = top["probe_latencies_s"]
    latency = {
        "triggers_held": top["triggers"],
        "probes": len(lat),
        "check_interval_s": args.probe_interval,
        "p50_s": round(_pct(lat, 0.5), 3),
        "p99_s": round(_pct(lat, 0.99), 3),
        "max_s": round(max(lat, default=0.0), 3),
        "p99_s_median_of_repeats": med["latency_p99_s"],
        "target_s": args.probe_interval + 0.1,
    }
    small = min(runs, key=lambda r: r["triggers"])
    marginal = None
    if top is not small:
        grown = (top["rss_loaded_mib"] - small["rss_loaded_mib"]) * 2**20
        marginal = round(grown / (top["triggers"] - small["triggers"]))
    cpu_w1 = med["cpu_us_per_check_w1"]
    met = {  # the targets, at the largest size (and W1 for CPU), on the repeats' medians
        "bytes_per_trigger": med["bytes_per_trigger"] <= TARGETS["bytes_per_trigger"],
        "load_s": med["load_s"] <= TARGETS["load_s"],
        "loop_lag_p99_ms": med["loop_lag_p99_ms"] < TARGETS["loop_lag_p99_ms"],
        "loop_lag_max_ms": max(med["loop_lag_max_ms"], med["loop_lag_max_while_loading_ms"])
        < TARGETS["loop_lag_max_ms"],
        # A full collection may happen; it must not walk the held waits.
        "no_full_gc_of_held_waits": top["full_gc_objects_max"] < top["triggers"] // 100,
        # No probe landed in the window (a short --window): not measured, not a pass.
        "latency_p99_s": _at_most(med["latency_p99_s"], TARGETS["latency_p99_s"]),
        "cpu_us_per_check_w1": _at_most(cpu_w1, TARGETS["cpu_us_per_check"]),
        "cpu_s_per_min_w1": _at_most(med["cpu_s_per_min_w1"], TARGETS["cpu_s_per_min_w1"]),
        "checks_per_cycle_equal_distinct": duplicates["each_condition_once_per_cycle"],
    }
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    del params["child"]
    argv = sys.argv[1:] if argv is None else argv
    result = {
        **common.result_document("capacity", argv, params, Path(tempfile.gettempdir())),
        "triggers": top["triggers"],
        "bytes_per_trigger": med["bytes_per_trigger"],
        "bytes_per_trigger_steady": top["bytes_per_trigger_steady"],
        "bytes_per_trigger_marginal": marginal,
        "loop_lag_p50_ms": top["loop_lag_p50_ms"],
        "loop_lag_p99_ms": med["loop_lag_p99_ms"],
        "loop_lag_max_ms": med["loop_lag_max_ms"],
        "loop_lag_max_while_loading_ms": med["loop_lag_max_while_loading_ms"],
        "full_gc_pauses_ms": top["full_gc_pauses_ms"],
        "full_gc_cpu_ms": top["full_gc_cpu_ms"],
        "full_gc_objects_max": top["full_gc_objects_max"],
        "checks_per_s": top["checks_per_s"],
        "cpu_us_per_check": top["cpu_us_per_check"],
        "cpu_s_per_min": top["cpu_s_per_min"],
        "cpu_us_per_check_w1": cpu_w1,
        "cpu_s_per_min_w1": med["cpu_s_per_min_w1"],
        "load_s": med["load_s"],
        "cpu_percent": top["cpu_percent"],
        "headline": "each figure above with a spread in repeats is that figure's median",
        **rec.fields(),
        "targets": TARGETS,
        "targets_met": met,
        "latency": latency,
        "duplicates": duplicates,
        "runs": runs,
        "kept_repeat": kept,
        "runs_of_every_repeat": [[_brief(r) for r in rnd] for rnd in rounds],
    }
    png_path = common.save_figure(_plot(runs, latency), "capacity", args.out)
    json_path = common.write_json("capacity", result, args.out)
    _table(console, runs, latency, duplicates, met)
    common.print_table(
        f"capacity: medians of {args.repeats} run(s)",
        [
            *calibration.repeat_rows(repeats),
            calibration.calibration_row(result["calibration"]),
            common.load_row(result["load"]),
        ],
    )
    console.print(f"wrote {json_path} and {png_path}")
    return 0


def headline(runs: list[dict[str, Any]], probe_interval: float) -> dict[str, float | None]:
    """One repeat's headline figures: the largest size's, and W1's for CPU (None when no
    run was W1's 19,000 waits on 5 s: another size's CPU per check is not W1's)."""
    top = max(runs, key=lambda r: r["triggers"])
    w1 = next((r for r in runs if r["triggers"] == 19_000 and r["interval_s"] == 5), None)
    lat = top["probe_latencies_s"]
    return {
        "load_s": top["load_s"],
        "loop_lag_p99_ms": top["loop_lag_p99_ms"],
        "loop_lag_max_ms": top["loop_lag_max_ms"],
        "loop_lag_max_while_loading_ms": top["loop_lag_max_while_loading_ms"],
        "bytes_per_trigger": top["bytes_per_trigger"],
        "latency_p99_s": round(_pct(lat, 0.99), 3) if lat else None,
        "cpu_us_per_check_w1": None if w1 is None else w1["cpu_us_per_check"],
        "cpu_s_per_min_w1": None if w1 is None else w1["cpu_s_per_min"],
    }


def _at_most(value: float | None, target: float) -> bool | None:
    """Whether a figure meets its target; None when it was not measured."""
    return None if value is None else value <= target


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    """A run without its time series (the kept repeat has them in full)."""
    bulky = ("samples", "probes", "probe_latencies_s", "python_heap_by_line")
    return {k: v for k, v in run.items() if k not in bulky}


def _table(
    console: Any,
    runs: list[dict[str, Any]],
    latency: dict[str, Any],
    dup: dict[str, Any],
    met: dict[str, Any],
) -> None:
    from rich.table import Table

    t = Table(title="triggerer capacity (one process)")
    for col in (
        "waits",
        "loaded in",
        "bytes/wait",
        "lag p50",
        "lag p99",
        "lag max",
        "interval",
        "checks/s",
        "1st cycle",
        "CPU",
        "CPU/check",
    ):
        t.add_column(col, justify="right")
    for r in runs:
        t.add_row(
            f"{r['triggers']:,}",
            f"{r['load_s']:.2f} s",
            f"{r['bytes_per_trigger']:,} ({r['bytes_per_trigger_steady']:,})",
            f"{r['loop_lag_p50_ms']:.1f} ms",
            f"{r['loop_lag_p99_ms']:.1f} ms",
            f"{r['loop_lag_max_ms']:.0f} ms",
            f"{r.get('interval_s', 0):g} s",
            f"{r['checks_per_s']:,.0f}",
            f"{r['first_cycle_checks_per_s'] or 0:,}/s",
            f"{r['cpu_percent']:.1f}% ({r['cpu_s_per_min']:.2f} s/min)",
            "-" if r["cpu_us_per_check"] is None else f"{r['cpu_us_per_check']:.1f} us",
        )
    console.print(t)
    if not latency["probes"]:
        console.print("file landing -> task PENDING: not measured (no probe landed in the window)")
    else:
        console.print(
            f"file landing -> task PENDING with {latency['triggers_held']:,} waits held, "
            f"{latency['check_interval_s']:g} s interval: p50 {latency['p50_s']:.3f} s, "
            f"p99 {latency['p99_s']:.3f} s, max {latency['max_s']:.3f} s "
            f"(target <= {latency['target_s']:.1f} s)"
        )
    console.print(duplicates_line(dup))
    console.print(
        "targets met: "
        + ", ".join(f"{k}={'not measured' if v is None else v}" for k, v in met.items())
    )


def duplicates_line(dup: dict[str, Any]) -> str:
    """The duplicates workload in one line; says so when it was not measured."""
    head = f"{dup['subscriptions']:,} waits, {dup['duplicate_fraction']:.0%} duplicates: "
    if not dup["measured"]:
        return head + "not run (--no-dup): each condition once per cycle: not measured"
    once = dup["each_condition_once_per_cycle"]
    return head + (
        f"{dup['distinct_conditions']:,} distinct conditions, checks per cycle "
        f"{dup['checks_per_cycle']} (each condition once per cycle: "
        f"{'not measured (no cycle seen)' if once is None else once})"
    )


def _plot(runs: list[dict[str, Any]], latency: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (ax_mem, ax_lag), (ax_chk, ax_lat) = axes
    for r in runs:
        s = r["samples"]
        label = f"{r['triggers']:,} waits"
        ts = [x["t"] for x in s]
        base = r["rss_baseline_mib"] * 2**20
        held = [x for x in s if not x.get("loading")]  # per wait once all are held
        ax_mem.plot(
            [x["t"] for x in held], [(x["rss"] - base) / r["triggers"] for x in held], label=label
        )
        ax_lag.plot(ts, [x["lag_ms"] for x in s], label=label)
        ax_chk.plot(ts, [x["checks"] for x in s], label=label)
    ax_mem.axhline(TARGETS["bytes_per_trigger"], color="red", ls="--", lw=1, label="target 1 KiB")
    ax_mem.set(title="RSS above baseline per wait", xlabel="s since start", ylabel="bytes")
    ax_lag.axhline(TARGETS["loop_lag_max_ms"], color="red", ls="--", lw=1, label="max target")
    ax_lag.set(
        title="event-loop lag (max per 0.5 s, loading included)",
        xlabel="s since start",
        ylabel="ms",
        yscale="symlog",
    )
    ax_lag.set_ylim(bottom=0)
    ax_chk.set(title="checks made (cumulative)", xlabel="s since start", ylabel="checks")
    lat = latency
    top = max(runs, key=lambda r: r["triggers"])
    xs = top["probe_latencies_s"]
    ax_lat.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], marker=".", label="probes")
    ax_lat.axvline(lat["target_s"], color="red", ls="--", lw=1, label="interval + 100 ms")
    ax_lat.set(
        title=f"file lands -> task PENDING ({lat['triggers_held']:,} waits held)",
        xlabel="s",
        ylabel="fraction of probes",
    )
    for ax in axes.flat:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("slotless triggerer capacity")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    # Import under the package name so that NoopTrigger's classpath is
    # benchmarks.capacity.NoopTrigger in every process.
    from benchmarks.capacity import main as _main

    sys.exit(_main())
