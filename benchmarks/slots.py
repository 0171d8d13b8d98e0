"""Slot usage: the same sensors waited for in poke, reschedule and deferrable modes.

    python -m benchmarks.slots                 # 40 sensors, 8 slots, files over 40 s
    slotless bench slots --sensors 400 --slots 32 --window 600 --interval 30

The seed-004 experiment ("slot usage seconds" of deferred against regular sensors), on
the real executor: ``--sensors`` sensors each wait for their own file, which lands at a
random moment within ``--window`` seconds of the run's start; each sensor has a
downstream task; ``--tasks`` independent tasks (sleeping ``--task-seconds``) compete with
them for ``--slots`` worker slots. The same DAG (same landing times) runs once per mode
through a Worker and a Triggerer in this process against a fresh SQLite file; the
triggerer has its own thread and event loop, so its CPU is measured apart.

Per mode: sensor slot-seconds (sum of the ``slot_usage`` intervals of the sensor tasks),
makespan, latency from a file landing to its downstream task starting, checks made, the
triggerer's CPU, and the busy slots over time (the PNG).

Results: benchmarks/results/slots.json and slots.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import calibration, common

if TYPE_CHECKING:
    from executor.dag import SensorMode

NAME = "slots"
MODES = ("poke", "reschedule", "deferrable")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="slotless bench slots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sensors", type=int, default=40, help="sensors, one file each (40)")
    p.add_argument("--slots", type=int, default=8, help="worker slots (8)")
    p.add_argument("--tasks", type=int, default=40, help="independent normal tasks (40)")
    p.add_argument("--task-seconds", type=float, default=1.0, help="each normal task (1.0)")
    p.add_argument("--downstream-seconds", type=float, default=0.1, help="each downstream task")
    p.add_argument("--window", type=float, default=40.0, help="files land within (40 s)")
    p.add_argument("--interval", type=float, default=5.0, help="sensors' check interval (5 s)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of modes")
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--max-seconds", type=float, default=900.0, help="give up on a mode after")
    p.add_argument("--workdir", help="where databases and files go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--results", type=Path, default=common.RESULTS)
    calibration.add_repeats_argument(p)
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in args.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    return args


def build_dag(mode: SensorMode, landing: Path, args: argparse.Namespace) -> Any:
    from executor import DAG
    from triggers.files import FileTrigger

    dag = DAG(f"slots_{mode}")
    down_s, task_s = args.downstream_seconds, args.task_seconds

    def downstream(ctx: Any) -> int:
        time.sleep(down_s)
        return len(ctx.inputs)

    def work(ctx: Any) -> None:
        time.sleep(task_s)

    for i in range(args.sensors):
        wait = dag.sensor(
            f"wait_{i:04d}",
            FileTrigger(path=str(landing / f"file_{i:04d}.csv"), poke_interval=args.interval),
            mode=mode,
        )
        dag.task(downstream, task_id=f"process_{i:04d}", parents=[wait])
    for j in range(args.tasks):
        dag.task(work, task_id=f"work_{j:04d}")
    return dag


@contextlib.contextmanager
def counting_checks() -> Iterator[dict[str, int]]:
    """Count FileTrigger checks (conditions evaluated) and calls (directory listings).

    Every mode reaches the condition through ``FileTrigger.poke_many``: the worker's
    poke / reschedule checks via ``poke()``, the triggerer in batches.
    """
    from triggers.files import FileTrigger

    counts = {"checks": 0, "calls": 0}
    lock = threading.Lock()
    original = FileTrigger.__dict__["poke_many"]

    async def poke_many(cls: Any, triggers: Any, ctx: Any) -> Any:
        with lock:
            counts["checks"] += len(triggers)
            counts["calls"] += 1
        return await original.__func__(cls, triggers, ctx)

    FileTrigger.poke_many = classmethod(poke_many)  # type: ignore[method-assign,assignment]
    try:
        yield counts
    finally:
        FileTrigger.poke_many = original  # type: ignore[method-assign]


class TriggererThread:
    """A Triggerer with its own event loop, store connection and thread (CPU apart)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ready = threading.Event()
        self.cpu_s = 0.0
        self.triggerer: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="bench-triggerer", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.ready.wait(30)

    def poke(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.triggerer.poke)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.triggerer.stop)
        self._thread.join(30)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        from executor.store import open_store
        from triggerer.service import Triggerer

        store = await open_store(self.url)
        self._loop = asyncio.get_running_loop()
        self.triggerer = Triggerer(store.views)
        cpu0 = time.thread_time()
        db_thread = _db_thread_cpu(store)
        db0 = db_thread()
        self.ready.set()
        try:
            await self.triggerer.run()
        finally:
            self.cpu_s = time.thread_time() - cpu0 + db_thread() - db0
            await store.close()


def _db_thread_cpu(store: Any) -> Any:
    """CPU seconds of the store's own connection thread (aiosqlite), if it can be found."""
    import psutil

    thread = getattr(getattr(store.db, "_conn", None), "_thread", None)
    native = getattr(thread, "native_id", None)

    def cpu() -> float:
        if native is None:
            return 0.0
        for t in psutil.Process().threads():
            if t.id == native:
                return t.user_time + t.system_time
        return 0.0

    return cpu


def land_files(landing: Path, offsets: list[float], t0: float, landed: dict[int, float]) -> None:
    """Write file i at t0 + offsets[i] (a thread, so that no event loop delays it)."""
    for i in sorted(range(len(offsets)), key=offsets.__getitem__):
        delay = t0 + offsets[i] - time.time()
        if delay > 0:
            time.sleep(delay)
        path = landing / f"file_{i:04d}.csv"
        tmp = path.with_suffix(".part")
        tmp.write_text("merchant,amount\n")
        tmp.rename(path)  # lands whole, as an upload's final rename does
        landed[i] = time.time()


async def run_mode(
    mode: SensorMode, folder: Path, args: argparse.Namespace, offsets: list[float], bar: Any
) -> dict[str, Any]:
    import psutil

    from executor.store import open_store
    from executor.worker import Worker

    landing = folder / f"landing_{mode}"
    landing.mkdir(parents=True, exist_ok=True)
    url = common.fresh_db(folder, f"slots_{mode}")
    db_path = url[len("sqlite:///") :]
    dag = build_dag(mode, landing, args)
    store = await open_store(url)
    total = len(dag.tasks)
    task = bar.add_task(f"{mode:<10}", total=total)
    proc = psutil.Process()
    rss_peak = proc.memory_info().rss
    with counting_checks() as counts:
        sidecar = TriggererThread(url)
        sidecar.start()
        worker = Worker(
            store,
            slots=args.slots,
            dags={dag.dag_id: dag},
            poll_interval=0.05,
            on_defer=sidecar.poke,
        )
        run_id = await store.runs.create_run(dag, date(2026, 1, 1))
        t0 = time.time()
        landed: dict[int, float] = {}
        lander = threading.Thread(
            target=land_files, args=(landing, offsets, t0, landed), daemon=True
        )
        lander.start()

        def done_count() -> int:
            return _terminal_count(db_path, run_id)

        async def until() -> bool:
            nonlocal rss_peak
            rss_peak = max(rss_peak, proc.memory_info().rss)
            info = await store.views.run_info(run_id)
            if time.time() - t0 > args.max_seconds:
                raise TimeoutError(f"{mode} mode did not finish within {args.max_seconds:g} s")
            return info is None or info["state"] != "RUNNING"

        try:
            with common.follow(bar, task, done_count):
                await worker.run(until=until)
        finally:
            sidecar.stop()
        lander.join(args.window + 5)
        checks = dict(counts)
    triggerer = sidecar.triggerer
    await store.close()
    return _measure(db_path, run_id, mode, t0, landed, checks, triggerer, sidecar, rss_peak)


def _terminal_count(db_path: str, run_id: str) -> int:
    conn = sqlite3.connect(db_path, timeout=30)
    try:
        return conn.execute(
            "SELECT count(*) FROM task WHERE run_id = ? AND state IN"
            " ('SUCCESS', 'FAILED', 'UPSTREAM_FAILED', 'SKIPPED')",
            (run_id,),
        ).fetchone()[0]
    finally:
        conn.close()


def _measure(
    db_path: str,
    run_id: str,
    mode: str,
    t0: float,
    landed: dict[int, float],
    checks: dict[str, int],
    triggerer: Any,
    sidecar: TriggererThread,
    rss_peak: int,
) -> dict[str, Any]:
    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    try:
        run = conn.execute("SELECT * FROM dag_run WHERE run_id = ?", (run_id,)).fetchone()
        tasks = {
            r["task_id"]: r
            for r in conn.execute("SELECT * FROM task WHERE run_id = ?", (run_id,)).fetchall()
        }
        by_row = {r["id"]: r["task_id"] for r in tasks.values()}
        usage = [
            (by_row.get(r["task_row"], "?"), r["kind"], r["started_at"], r["ended_at"])
            for r in conn.execute("SELECT * FROM slot_usage ORDER BY started_at").fetchall()
        ]
        states: dict[str, int] = {}
        for r in tasks.values():
            states[r["state"]] = states.get(r["state"], 0) + 1
    finally:
        conn.close()

    def held(prefix: str) -> float:
        return sum(end - start for tid, _, start, end in usage if tid.startswith(prefix))

    latencies = []
    for i, at in sorted(landed.items()):
        down = tasks.get(f"process_{i:04d}")
        if down is not None and down["started_at"] is not None:
            latencies.append(down["started_at"] - at)
    latencies.sort()
    work_end = [r["ended_at"] - t0 for t, r in tasks.items() if t.startswith("work_")]
    work_start = [
        r["started_at"] - t0 for t, r in tasks.items() if t.startswith("work_") and r["started_at"]
    ]
    last_landing = max(landed.values(), default=t0) - t0
    makespan = (run["ended_at"] or time.time()) - t0
    sensor_intervals = sum(1 for tid, *_ in usage if tid.startswith("wait_"))
    return {
        "state": run["state"],
        "task_states": states,
        "sensor_slot_seconds": round(held("wait_"), 3),
        "downstream_slot_seconds": round(held("process_"), 3),
        "normal_slot_seconds": round(held("work_"), 3),
        "sensor_slot_intervals": sensor_intervals,
        "makespan_s": round(makespan, 3),
        "last_landing_s": round(last_landing, 3),
        "finished_after_last_landing_s": round(makespan - last_landing, 3),
        "latency_p50_s": round(common.percentile(latencies, 50), 3),
        "latency_p99_s": round(common.percentile(latencies, 99), 3),
        "latency_max_s": round(max(latencies, default=float("nan")), 3),
        "normal_tasks_first_start_s": round(min(work_start, default=float("nan")), 3),
        "normal_tasks_done_s": round(max(work_end, default=float("nan")), 3),
        "checks": checks["checks"],
        "check_calls": checks["calls"],
        "triggerer_checks": getattr(triggerer, "checks_done", None),
        "triggerer_cpu_s": round(sidecar.cpu_s, 3),
        "process_rss_peak_mib": round(rss_peak / 2**20, 1),
        "slot_usage": [
            (tid, kind, round(start - t0, 4), round(end - t0, 4)) for tid, kind, start, end in usage
        ],
    }


def busy_over_time(
    usage: list[tuple[str, str, float, float]], prefix: str = "", step: float = 0.1
) -> tuple[list[float], list[int]]:
    """Slots held at each moment (a step function sampled every ``step`` seconds)."""
    spans = [(s, e) for tid, _, s, e in usage if tid.startswith(prefix)]
    if not spans:
        return [0.0], [0]
    end = max(e for _, e in spans)
    ts = [i * step for i in range(int(end / step) + 2)]
    return ts, [sum(1 for s, e in spans if s <= t < e) for t in ts]


def plot(doc: dict[str, Any], results: Path) -> Path:
    fig, (ax_all, ax_sensors, ax_bar) = common.subplots(3, width=5.6)
    colors = {"poke": "tab:red", "reschedule": "tab:orange", "deferrable": "tab:green"}
    slots = doc["params"]["slots"]
    for mode, m in doc["modes"].items():
        ts, busy = busy_over_time(m["slot_usage"])
        ax_all.step(ts, busy, where="post", label=mode, color=colors[mode], lw=1.4)
        ts, busy = busy_over_time(m["slot_usage"], "wait_")
        ax_sensors.step(ts, busy, where="post", label=mode, color=colors[mode], lw=1.4)
    for ax, title in ((ax_all, "busy worker slots"), (ax_sensors, "slots held by sensors")):
        ax.axhline(slots, color="grey", ls=":", lw=1)
        ax.set(title=title, xlabel="seconds since the run started", ylabel="slots")
        ax.set_ylim(0, slots + 0.5)
        ax.legend()
        ax.grid(alpha=0.3)
    last = max(m["last_landing_s"] for m in doc["modes"].values())
    ax_all.axvline(last, color="black", ls="--", lw=0.8)
    ax_all.annotate("last file lands", (last, slots + 0.1), fontsize=8, ha="right")
    modes = list(doc["modes"])
    values = [max(doc["modes"][m]["sensor_slot_seconds"], 1e-3) for m in modes]
    bars = ax_bar.bar(modes, values, color=[colors[m] for m in modes])
    ax_bar.set_yscale("log")
    ax_bar.set(title="sensor slot-seconds (log scale)", ylabel="slot-seconds")
    for b, v in zip(bars, values, strict=True):
        text = f"{v:,.1f}" if v >= 10 else f"{v:.3g}"
        ax_bar.annotate(text, (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom")
    p = doc["params"]
    fig.suptitle(
        f"{p['sensors']} sensors (files over {p['window']:g} s, checked every "
        f"{p['interval']:g} s) + {p['tasks']} tasks on {slots} slots"
    )
    return common.save_figure(fig, NAME, results)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    rng = random.Random(args.seed)
    offsets = [rng.uniform(0.5, args.window) for _ in range(args.sensors)]
    params = {
        "sensors": args.sensors,
        "slots": args.slots,
        "tasks": args.tasks,
        "task_seconds": args.task_seconds,
        "downstream_seconds": args.downstream_seconds,
        "window": args.window,
        "interval": args.interval,
        "modes": args.modes,
        "seed": args.seed,
        "store": "sqlite",
        "trigger": "triggers.files.FileTrigger (one file each, one directory)",
    }

    def once(i: int) -> dict[str, Any]:
        modes: dict[str, Any] = {}
        with common.progress() as bar:
            for mode in args.modes:
                where = folder / f"run{i}"
                where.mkdir(exist_ok=True)
                modes[mode] = asyncio.run(run_mode(mode, where, args, offsets, bar))
        return modes

    with common.workdir(args.workdir, args.keep) as folder, calibration.Recording(folder) as rec:
        doc = common.result_document(NAME, argv, params, folder)
        doc["command"] = "slotless bench slots" + "".join(f" {a}" for a in argv)
        runs = rec.repeat(args.repeats, once, lambda m: _headline(m, args))
    modes = runs[rec.kept(f"makespan_s_{args.modes[-1]}")]
    load = rec.load
    doc["machine_load"] = load
    doc.update(rec.fields())
    doc["modes"] = modes
    summary = _summary(modes, args)
    doc["summary"] = summary
    png = plot(doc, args.results)
    path = common.write_json(NAME, doc, args.results)
    _table(modes, summary, args, load)
    common.console.print(f"wrote {path} and {png}")
    return 0


def _headline(modes: dict[str, Any], args: argparse.Namespace) -> dict[str, float | None]:
    """One run's headline figures: per mode, sensor slot-seconds, makespan, p99 latency."""
    out: dict[str, float | None] = {}
    for mode, m in modes.items():
        out[f"sensor_slot_seconds_{mode}"] = m["sensor_slot_seconds"]
        out[f"makespan_s_{mode}"] = m["makespan_s"]
        out[f"latency_p99_s_{mode}"] = m.get("latency_p99_s")
    return out


def _summary(modes: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    poke = modes.get("poke")
    deferrable = modes.get("deferrable")
    if poke and deferrable:
        ratio = deferrable["sensor_slot_seconds"] / max(poke["sensor_slot_seconds"], 1e-9)
        out["deferrable_over_poke_sensor_slot_seconds"] = round(ratio, 6)
        out["target_under_1_percent"] = ratio < 0.01
    if deferrable:
        allowed = deferrable["last_landing_s"] + args.interval + 1.0
        out["deferrable_finish_allowed_s"] = round(allowed, 3)
        out["deferrable_within_last_landing_plus_interval_plus_1s"] = (
            deferrable["makespan_s"] <= allowed
        )
    if poke:
        out["poke_starved"] = {
            "more_sensors_than_slots": args.sensors > args.slots,
            "normal_tasks_first_start_s": poke["normal_tasks_first_start_s"],
            "downstream_latency_p99_s": poke["latency_p99_s"],
        }
    return out


def _table(
    modes: dict[str, Any], summary: dict[str, Any], args: argparse.Namespace, load: dict[str, Any]
) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"{args.sensors} sensors + {args.tasks} tasks on {args.slots} slots; files land "
        f"within {args.window:g} s, checked every {args.interval:g} s"
    )
    for col in (
        "mode",
        "sensor slot-s",
        "makespan",
        "after last file",
        "latency p50",
        "latency p99",
        "first normal task",
        "checks (calls)",
        "triggerer CPU",
    ):
        t.add_column(col, justify="right")
    for mode, m in modes.items():
        t.add_row(
            mode,
            f"{m['sensor_slot_seconds']:,.2f}",
            f"{m['makespan_s']:.1f} s",
            f"{m['finished_after_last_landing_s']:+.1f} s",
            f"{m['latency_p50_s']:.2f} s",
            f"{m['latency_p99_s']:.2f} s",
            f"{m['normal_tasks_first_start_s']:.1f} s",
            f"{m['checks']:,} ({m['check_calls']:,})",
            f"{m['triggerer_cpu_s']:.2f} s",
        )
    console = Console()
    console.print(t)
    if "deferrable_over_poke_sensor_slot_seconds" in summary:
        console.print(
            f"deferrable / poke sensor slot-seconds: "
            f"{100 * summary['deferrable_over_poke_sensor_slot_seconds']:.3f}% "
            f"(target < 1%: {summary['target_under_1_percent']})"
        )
    if "deferrable_finish_allowed_s" in summary:
        console.print(
            f"deferrable finished at {modes['deferrable']['makespan_s']:.1f} s; last file + "
            f"interval + 1 s = {summary['deferrable_finish_allowed_s']:.1f} s "
            f"(within: {summary['deferrable_within_last_landing_plus_interval_plus_1s']})"
        )
    console.print(f"machine: {common.load_row(load)[1]}")


if __name__ == "__main__":
    sys.exit(main())
