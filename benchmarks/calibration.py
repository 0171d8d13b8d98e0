"""What makes a benchmark's figures comparable across machines: calibration, repeats, load.

A figure alone cannot tell a slow machine from a regression. Every benchmark therefore
records, in the same run:

- ``calibration``: two fixed pieces of work timed at the start and at the end of the run,
  a CPU-bound pure-Python loop (what the triggerer's and the executor's Python costs
  scale with) and small committed SQLite transactions in a temporary file, with the
  store's own settings (what a task's transition costs scale with); plus the cores, the
  Python version and the commit measured;
- ``repeats``: every run's headline figures and, for each, min / median / max;
- ``load``: how busy the rest of the machine was over the whole run (load average, and
  the CPU time other processes used, from the kernel's counters minus this process's).

Use :class:`Recording` around a benchmark's measurement::

    with calibration.Recording(folder) as rec:
        outs = rec.repeat(args.repeats, lambda i: measure(), headline)
    doc.update(rec.fields())

``python -m benchmarks.calibration`` prints the calibration of this machine alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from benchmarks import common

T = TypeVar("T")

# Fixed work: change these and calibrations from before stop being comparable.
CPU_LOOP_ITERATIONS = 600_000
CPU_LOOP_ROUNDS = 3
SQLITE_COMMITS = 2_000
SQLITE_FSYNC_COMMITS = 50
VERSION = 1


# -- the fixed work ------------------------------------------------------------------------


def cpu_loop(iterations: int = CPU_LOOP_ITERATIONS) -> int:
    """Pure-Python work of the kind a check or a transition does: dict, str, int, calls."""
    table: dict[int, int] = {}
    total = 0
    for i in range(iterations):
        key = i & 1023
        table[key] = table.get(key, 0) + i
        total += len(str(i)) + (i % 7)
    return total + len(table)


def time_cpu_loop(rounds: int = CPU_LOOP_ROUNDS) -> dict[str, Any]:
    """:func:`cpu_loop` timed in this thread's CPU time (the core's speed: time spent waiting
    for a CPU other processes hold is not counted) and in wall time (the speed this process
    got), best of ``rounds`` each.

    On a shared machine the wall figure swings with the load (4x within an hour here); the
    CPU-time figure is the calibration, the load is recorded beside it.
    """
    cpu, wall = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.thread_time()
        cpu_loop()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return {
        "cpu_loop_kiter_per_s": round(CPU_LOOP_ITERATIONS / min(cpu) / 1e3, 1),
        "cpu_loop_kiter_per_s_wall": round(CPU_LOOP_ITERATIONS / min(wall) / 1e3, 1),
        "cpu_loop_cpu_s": [round(x, 4) for x in cpu],
        "cpu_loop_wall_s": [round(x, 4) for x in wall],
    }


def time_sqlite_commits(folder: Path | None = None) -> dict[str, Any]:
    """Small committed transactions per second in a temp file: the store's settings (WAL,
    synchronous NORMAL, so no fsync per commit) and, apart, synchronous FULL (one fsync per
    commit: what the disk adds)."""
    with tempfile.TemporaryDirectory(prefix="slotless-calib-", dir=folder) as tmp:
        normal = _commits(Path(tmp) / "normal.db", "NORMAL", SQLITE_COMMITS)
        full = _commits(Path(tmp) / "full.db", "FULL", SQLITE_FSYNC_COMMITS)
    return {
        "sqlite_commits_per_s": round(normal),
        "sqlite_fsync_commits_per_s": round(full),
        "sqlite_version": sqlite3.sqlite_version,
    }


def _commits(path: Path, synchronous: str, n: int) -> float:
    """Commits per second of wall time: a commit's fsync waits on the disk, not a CPU."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, state TEXT, payload TEXT)")
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (state, payload) VALUES ('QUEUED', ?)", (f"p{i}",))
            conn.execute("UPDATE t SET state = 'RUNNING' WHERE id = ?", (i + 1,))
            conn.execute("COMMIT")
        return n / (time.perf_counter() - t0)
    finally:
        conn.close()


def calibrate(folder: Path | None = None) -> dict[str, Any]:
    """One calibration: the CPU loop, then the SQLite commits (about 0.5 s in all)."""
    return {
        **time_cpu_loop(),
        **time_sqlite_commits(folder),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def environment() -> dict[str, Any]:
    """Cores, Python and commit: what else a figure depends on."""
    git = common.git_revision()
    return {
        "cores": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "commit": git["commit"],
        "dirty": git["dirty"],
    }


def summarize(start: dict[str, Any], end: dict[str, Any] | None) -> dict[str, Any]:
    """The calibration block: the slower of start and end is the headline (a machine is only
    as fast as it was for the whole run), both kept."""
    both = [start] if end is None else [start, end]
    return {
        "version": VERSION,
        "cpu_loop_kiter_per_s": min(c["cpu_loop_kiter_per_s"] for c in both),
        "cpu_loop_kiter_per_s_wall": min(c["cpu_loop_kiter_per_s_wall"] for c in both),
        "sqlite_commits_per_s": min(c["sqlite_commits_per_s"] for c in both),
        "sqlite_fsync_commits_per_s": min(c["sqlite_fsync_commits_per_s"] for c in both),
        **environment(),
        "at_start": start,
        "at_end": end,
    }


# -- repeats -------------------------------------------------------------------------------


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """min / median / max of one figure over the runs that measured it, and their values."""
    clean = [float(v) for v in values if v is not None]
    if not clean:
        return {"min": None, "median": None, "max": None, "values": list(values)}
    return {
        "min": min(clean),
        "median": round(statistics.median(clean), 6),
        "max": max(clean),
        "values": clean,  # the runs that measured it
    }


def median_index(values: Sequence[float]) -> int:
    """The index of the run whose value is the (lower) median: that run's details are kept."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(order) - 1) // 2]


def add_repeats_argument(parser: argparse.ArgumentParser, default: int = 3) -> None:
    parser.add_argument(
        "--repeats",
        type=_positive,
        default=default,
        help=f"runs of the measurement; min / median / max are recorded (default {default})",
    )


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of runs >= 1")
    return n


# -- the recording -------------------------------------------------------------------------


class Recording:
    """Calibrates at enter and exit, records the machine's load between, and the repeats.

    ``calibrate_at_end=False`` skips the second calibration (for a benchmark whose last
    measurement is still running in other processes at exit).
    """

    def __init__(self, folder: Path | None = None, *, calibrate_at_end: bool = True) -> None:
        self.folder = folder
        self.calibrate_at_end = calibrate_at_end
        self.runs: list[dict[str, Any]] = []
        self.start: dict[str, Any] = {}
        self.end: dict[str, Any] | None = None
        self._load = common.MachineLoad()

    def __enter__(self) -> Recording:
        common.console.print("calibrating the machine (CPU loop, SQLite commits)...")
        self.start = calibrate(self.folder)
        self._load.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._load.__exit__(*exc)
        if self.calibrate_at_end and exc[0] is None:
            self.end = calibrate(self.folder)

    def add(self, figures: dict[str, float | None], load: dict[str, Any] | None = None) -> None:
        """One run's headline figures (and the load over that run, if measured apart)."""
        self.runs.append({"figures": dict(figures), "load": load})

    def repeat(
        self,
        n: int,
        once: Callable[[int], T],
        headline: Callable[[T], dict[str, float | None]],
    ) -> list[T]:
        """Run ``once(i)`` n times, recording each run's headline figures and load."""
        outs = []
        for i in range(n):
            if n > 1:
                common.console.print(f"[bold]run {i + 1} of {n}[/bold]")
            with common.MachineLoad() as load:
                out = once(i)
            self.add(headline(out), load.summary)
            outs.append(out)
        return outs

    def repeats(self) -> dict[str, Any]:
        names: list[str] = []
        for run in self.runs:
            names += [k for k in run["figures"] if k not in names]
        return {
            "count": len(self.runs),
            "figures": {k: spread([r["figures"].get(k) for r in self.runs]) for k in names},
            "runs": self.runs,
        }

    def medians(self) -> dict[str, float | None]:
        """Each headline figure's median over the runs (None: never measured)."""
        return {k: v["median"] for k, v in self.repeats()["figures"].items()}

    def kept(self, figure: str) -> int:
        """The run whose ``figure`` is the median one: its details go in the document."""
        values = [r["figures"].get(figure) for r in self.runs]
        if not values or any(v is None for v in values):
            return 0
        return median_index([float(v) for v in values if v is not None])

    @property
    def load(self) -> dict[str, Any]:
        return getattr(self._load, "summary", {})

    def fields(self) -> dict[str, Any]:
        """``calibration``, ``repeats`` and ``load``, to merge into a result document."""
        return {
            "calibration": summarize(self.start, self.end),
            "repeats": self.repeats(),
            "load": self.load,
        }


def calibration_row(cal: dict[str, Any]) -> tuple[str, str]:
    """A table row: the machine's calibration."""
    return (
        "calibration (slower of start / end)",
        f"CPU loop {cal['cpu_loop_kiter_per_s']:,.0f} k iter/CPU-s "
        f"({cal['cpu_loop_kiter_per_s_wall']:,.0f} per wall s), "
        f"SQLite {cal['sqlite_commits_per_s']:,} commits/s "
        f"({cal['sqlite_fsync_commits_per_s']:,} with fsync)",
    )


def repeat_rows(repeats: dict[str, Any], fmt: str = "{:,.4g}") -> list[tuple[str, str]]:
    """Table rows: each headline figure's median and spread over the runs."""
    rows = []
    n = repeats["count"]
    for name, s in repeats["figures"].items():
        if s["median"] is None:
            rows.append((f"{name} (of {n} runs)", "not measured"))
            continue
        rows.append(
            (
                f"{name} (median of {n}, min-max)",
                f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})",
            )
        )
    return rows


def caption(doc: dict[str, Any]) -> str:
    """A figure's line on the machine and its calibration."""
    text = common.machine_caption(doc["machine"])
    cal = doc.get("calibration")
    if cal:
        text += (
            f"; calibration {cal['cpu_loop_kiter_per_s']:,.0f} k iter/CPU-s, "
            f"{cal['sqlite_commits_per_s']:,} SQLite commits/s"
        )
    busy = (doc.get("load") or {}).get("other_processes_cpus_busy")
    if busy is not None:
        text += f"; {busy:.2f} CPUs busy elsewhere"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.calibration", description=__doc__)
    p.parse_args(argv)
    cal = summarize(calibrate(), None)
    common.print_table(
        "calibration", [calibration_row(cal), *((k, str(v)) for k, v in cal["at_start"].items())]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
