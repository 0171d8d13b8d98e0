"""slotless's triggerer against Airflow's own ``airflow triggerer``, the same workloads, one
after the other in one run, both on SQLite.

    python -m benchmarks.vs_airflow                          # W1 at 1,000 / 5,000 / 19,000
    python -m benchmarks.vs_airflow --w1-sizes 1000,5000     # a shorter run
    python -m benchmarks.vs_airflow --through-airflow        # one Airflow deployment served
                                                             # by each (vs_airflow_triggerer)

First it builds ``.venv-bench-airflow`` (apache-airflow pinned by constraints-airflow.txt;
once, about a minute with a warm pip cache; not in CI). Each system then runs:

* W1: N file waits (5 s interval) that never fire: PSS per wait of the triggerer process and
  its children (above the same triggerer holding nothing), time from start until every wait
  has been checked once, idle CPU-seconds per minute, event-loop stalls over 50 ms;
* W2: 1,000 file waits, the files created in one burst, at 1 s and at 5 s intervals: file
  created -> task leaves DEFERRED, p50 / p99 / max; slotless twice, polling (``--no-push``,
  as Airflow's FileTrigger does) and with push (inotify, its default);
* W3: 1,000 waits on 600 distinct paths: checks per second made, counted inside the trigger,
  polling (slotless also with push, where it makes no periodic check between safety
  polls). slotless checks a cycle in one burst: the rate is taken over whole cycles, from
  the end of the first burst in the window to the end of the last.

Each system's run is repeated (``--repeats``, default 3; ``--airflow-repeats`` for
Airflow's, whose run is long), with the machine's calibration and load
(benchmarks/calibration.py).

How each is measured, the same for both: a probe (benchmarks/airflow_side/probe) in the
triggerer's processes counts checks by an audit hook (Airflow's FileTrigger globs once per
check; slotless's lists a directory once per batch, and its triggerer counts the triggers
each batch checked) and records loop stalls with a coroutine on every event loop; psutil
reads PSS and CPU time of the process tree; the orchestrator polls each database every
20 ms for tasks that left DEFERRED. Airflow's waits are task instances in DEFERRED with one
FileTrigger row each (benchmarks/airflow_side/seed.py, as a deferrable FileSensor leaves
them), slotless's are DEFERRED task rows with their trigger rows (benchmarks.capacity's
insert_waits). A workload Airflow fails (its triggerer dies, or does not hold every wait in
the time allowed) is recorded with its cause, and the figures measured so far are kept.

Results: benchmarks/results/vs_airflow.json and vs_airflow.png.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from . import calibration
from .airflow_env import BENCH_VENV, CONSTRAINTS, airflow_python
from .common import (
    RESULTS,
    MachineLoad,
    percentile,
    result_document,
    save_figure,
    subplots,
    write_json,
)

HERE = Path(__file__).resolve().parent
PROBE = HERE / "airflow_side" / "probe"
SEED = HERE / "airflow_side" / "seed.py"

AIRFLOW_DAG = """
from datetime import datetime

from airflow.providers.standard.sensors.filesystem import FileSensor
from airflow.sdk import DAG

with DAG("vs_bench", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    FileSensor(task_id="wait", filepath="/nonexistent", deferrable=True, poke_interval=5)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree(pid: int) -> list[Any]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def pss_bytes(pid: int) -> int:
    import psutil

    total = 0
    for p in tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_full_info().pss
    return total


def cpu_seconds(pid: int) -> float:
    import psutil

    total = 0.0
    for p in tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


class Failed(Exception):
    """The system under test failed this workload; the message says why."""


class System:
    """One triggerer under test: set up N waits, start it, observe it, stop it."""

    name = ""

    def __init__(self, work: Path, push: bool = False) -> None:
        self.work = work
        self.push = push  # slotless: wake waits by inotify; Airflow's FileTrigger only polls
        work.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.probe_dir = work / "probe"
        self.log = work / "triggerer.log"
        self.started_at = 0.0
        self.settings: dict[str, Any] = {}

    # -- to implement ----------------------------------------------------------------
    def seed(self, paths: list[str], interval: float) -> float:
        """Write one wait per path; seconds it took."""
        raise NotImplementedError

    def command(self, n: int) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def held(self, n_distinct: int) -> bool:
        """Whether every distinct wait has been checked once."""
        raise NotImplementedError

    def checks(self) -> int:
        raise NotImplementedError

    def seen(self) -> int:
        """How many distinct waits have been checked at least once so far."""
        raise NotImplementedError

    def left_deferred(self) -> set[int]:
        """Indexes of the waits whose task left DEFERRED."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------
    def start(self, n: int, n_distinct: int) -> None:
        self.probe_dir.mkdir(parents=True, exist_ok=True)
        argv, env = self.command(n)
        env = {
            **env,
            "PYTHONPATH": os.pathsep.join([str(PROBE), env.get("PYTHONPATH", "")]),
            "VS_PROBE_DIR": str(self.probe_dir),
            "VS_EXPECT_PATHS": str(n_distinct),
        }
        self.started_at = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, cwd=self.work, stdout=log, stderr=subprocess.STDOUT
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def why_dead(self) -> str:
        code = self.proc.poll() if self.proc else None
        tail = self.log.read_text(errors="replace").splitlines()[-400:]
        causes = [
            line.strip()[:300]
            for line in tail
            if any(k in line for k in ("Error", "error", "Too many open files", "Killed"))
        ]
        return f"{self.name} triggerer exited with code {code}: " + (
            " | ".join(causes[-3:]) or "(no error in its log)"
        )

    def probe(self) -> dict[str, Any]:
        """The probe's counters summed over the processes of this run."""
        out: dict[str, Any] = {"glob": 0, "scandir": 0, "distinct": 0, "stalls": []}
        out["all_seen_at"] = None
        for f in self.probe_dir.glob("*.json"):
            try:
                doc = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            for k in ("glob", "scandir", "distinct"):
                out[k] += doc[k]
            out["stalls"] += doc["stalls"]
            if doc.get("all_seen_at"):
                out["all_seen_at"] = doc["all_seen_at"]
        return out

    def wait_held(self, n_distinct: int, limit: float) -> float:
        """Seconds from start until every wait was checked once; Failed if not."""
        deadline = self.started_at + limit
        while True:
            if not self.alive():
                raise Failed(self.why_dead())
            if self.held(n_distinct):
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                raise Failed(
                    f"{self.name}: not every wait was checked within {limit:g} s "
                    f"({self.seen()} of {n_distinct} distinct waits checked by then)"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            for p in reversed(tree(self.proc.pid)):
                p.kill()
            self.proc.wait(10)


class Airflow(System):
    name = "airflow"

    def __init__(self, work: Path, python: Path) -> None:
        super().__init__(work)
        self.python = python
        self.bin = python.parent
        self.db = work / "airflow.db"
        (work / "dags").mkdir(parents=True, exist_ok=True)
        (work / "dags" / "vs_bench.py").write_text(textwrap.dedent(AIRFLOW_DAG))
        self.env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(work),
            "AIRFLOW_HOME": str(work),
            "AIRFLOW__CORE__DAGS_FOLDER": str(work / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.db}",
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        }

    def _airflow(self, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / "airflow"), *args],
            env=self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise Failed(f"airflow {' '.join(args)} failed: {done.stderr[-2000:]}")

    def seed(self, paths: list[str], interval: float) -> float:
        began = time.monotonic()
        self._airflow("db", "migrate")
        self._airflow("dags", "reserialize")
        (self.work / "paths.json").write_text(json.dumps(paths))
        done = subprocess.run(
            [str(self.python), str(SEED), str(len(paths)), str(interval), "paths.json"],
            env=self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise Failed(f"seeding Airflow failed: {done.stderr[-2000:]}")
        return time.monotonic() - began

    def command(self, n: int) -> tuple[list[str], dict[str, str]]:
        capacity = n + 1000
        self.settings = {
            "command": f"airflow triggerer --capacity {capacity}",
            "[triggerer] capacity": capacity,
            "[triggerer] max_trigger_to_select_per_loop": capacity,
            "[database] sql_alchemy_conn": "sqlite (one file)",
            "open files limit (ulimit -n)": _nofile(),
            "other settings": "Airflow's defaults",
        }
        env = {
            **self.env,
            "AIRFLOW__TRIGGERER__CAPACITY": str(capacity),
            "AIRFLOW__TRIGGERER__MAX_TRIGGER_TO_SELECT_PER_LOOP": str(capacity),
        }
        return [str(self.bin / "airflow"), "triggerer", "--capacity", str(capacity)], env

    def held(self, n_distinct: int) -> bool:
        return self.probe()["all_seen_at"] is not None or n_distinct == 0

    def checks(self) -> int:
        return int(self.probe()["glob"])

    def seen(self) -> int:
        return int(self.probe()["distinct"])

    def left_deferred(self) -> set[int]:
        return _read(self.db, "SELECT map_index FROM task_instance WHERE state IS NOT 'deferred'")


class Slotless(System):
    name = "slotless"

    def __init__(self, work: Path, push: bool = True) -> None:
        super().__init__(work, push)
        self.db = work / "slotless.db"
        self.port = free_port()
        self.run_id = "vs_airflow"

    def seed(self, paths: list[str], interval: float) -> float:
        from triggers.files import FileTrigger

        from .capacity import create_schema, insert_waits

        began = time.monotonic()
        create_schema(self.db)
        cache: dict[str, FileTrigger] = {}
        triggers = [cache.setdefault(p, FileTrigger(path=p, poke_interval=interval)) for p in paths]
        if triggers:
            insert_waits(self.db, triggers, run_id=self.run_id, prefix="w")
        return time.monotonic() - began

    def command(self, n: int) -> tuple[list[str], dict[str, str]]:
        self.settings = {
            "command": "slotless triggerer (defaults: 64 shards, 256 checks in flight, "
            "batches of 1,000; push by inotify unless --no-push)",
            "database": "sqlite (one file, WAL)",
            "open files limit (ulimit -n)": _nofile(),
        }
        argv = [sys.executable, "-m", "slotless", "triggerer", "--db", f"sqlite:///{self.db}"]
        argv += ["--metrics-port", str(self.port), "--metrics-host", "127.0.0.1"]
        if not self.push:
            argv.append("--no-push")
        return argv, {k: v for k, v in os.environ.items() if k != "SLOTLESS_DB"}

    def metric(self, name: str) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def held(self, n_distinct: int) -> bool:
        return self.metric("slotless_triggerer_checks_total") >= n_distinct

    def checks(self) -> int:
        return int(self.metric("slotless_triggerer_checks_total"))

    def seen(self) -> int:
        # Each distinct wait is checked once per cycle: before the first cycle ends, the
        # checks made are the distinct waits checked.
        return self.checks()

    def left_deferred(self) -> set[int]:
        rows = _read(
            self.db,
            "SELECT task_id FROM task WHERE run_id = 'vs_airflow' AND state <> 'DEFERRED'",
        )
        return {int(str(t)[1:]) for t in rows}


def _read(db: Path, query: str) -> set[Any]:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return {r[0] for r in conn.execute(query)}
        finally:
            conn.close()
    except sqlite3.Error:
        return set()


def _nofile() -> int:
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- workloads ------------------------------------------------------------------------------


def w1(system: System, n: int, interval: float, idle_window: float, hold_limit: float) -> dict:
    """N waits that never fire: memory, time to hold them all, idle CPU, loop stalls."""
    inbox = system.work / "never"
    paths = [f"{inbox}/{i}.csv" for i in range(n)]
    out: dict[str, Any] = {"n": n, "interval_s": interval}
    try:
        out["seed_s"] = round(system.seed(paths, interval), 2)
        system.start(n, n)
        out["all_held_s"] = round(system.wait_held(n, hold_limit), 2)
        time.sleep(max(2.0, interval))  # settle: the first cycle's allocations are done
        assert system.proc is not None
        cpu0, t0 = cpu_seconds(system.proc.pid), time.monotonic()
        while time.monotonic() - t0 < idle_window:
            if not system.alive():
                raise Failed(system.why_dead())
            time.sleep(0.5)
        cpu1, t1 = cpu_seconds(system.proc.pid), time.monotonic()
        out["idle_cpu_s_per_min"] = round((cpu1 - cpu0) / (t1 - t0) * 60, 3)
        out["pss_bytes"] = pss_bytes(system.proc.pid)
        stalls = system.probe()["stalls"]
        out["loop_stalls_over_50ms"] = len(stalls)
        out["loop_stalls_over_50ms_idle"] = sum(1 for s, _ in stalls if s >= t0)
        out["worst_stall_ms"] = round(max((lag for _, lag in stalls), default=0.0) * 1000, 1)
    except Failed as exc:
        out["failed"] = str(exc)
    finally:
        system.stop()
    return out


def w2(system: System, n: int, interval: float, hold_limit: float, fire_limit: float) -> dict:
    """N waits whose files are created in one burst: file created -> task leaves DEFERRED."""
    inbox = system.work / "burst"
    inbox.mkdir(parents=True, exist_ok=True)
    paths = [f"{inbox}/{i}.csv" for i in range(n)]
    out: dict[str, Any] = {"n": n, "interval_s": interval, "push": system.push}
    try:
        out["seed_s"] = round(system.seed(paths, interval), 2)
        system.start(n, n)
        out["all_held_s"] = round(system.wait_held(n, hold_limit), 2)
        time.sleep(interval + 1.0)  # every wait is in its steady cycle
        created: list[float] = []
        for p in paths:
            Path(p).write_text("x\n")
            created.append(time.time())
        burst_s = created[-1] - created[0]
        left_at: dict[int, float] = {}
        deadline = time.monotonic() + fire_limit
        while len(left_at) < n and time.monotonic() < deadline:
            now = time.time()
            for i in system.left_deferred() - left_at.keys():
                left_at[i] = now
            if not system.alive():
                raise Failed(system.why_dead())
            time.sleep(0.02)
        lat = sorted(left_at[i] - created[i] for i in left_at)
        out["burst_s"] = round(burst_s, 3)
        out["fired"] = len(lat)
        if lat:
            out["p50_s"] = round(percentile(lat, 50), 3)
            out["p99_s"] = round(percentile(lat, 99), 3)
            out["max_s"] = round(lat[-1], 3)
        if len(lat) < n:
            out["failed"] = f"{n - len(lat)} of {n} tasks still DEFERRED after {fire_limit:g} s"
    except Failed as exc:
        out["failed"] = str(exc)
    finally:
        system.stop()
    return out


def w3(system: System, n: int, distinct: int, interval: float, window: float, limit: float) -> dict:
    """N waits on `distinct` paths: checks made per second, counted inside the trigger."""
    inbox = system.work / "shared"
    paths = [f"{inbox}/{i % distinct}.csv" for i in range(n)]
    out: dict[str, Any] = {
        "n": n,
        "distinct_paths": distinct,
        "interval_s": interval,
        "push": system.push,
    }
    try:
        out["seed_s"] = round(system.seed(paths, interval), 2)
        system.start(n, distinct)
        out["all_held_s"] = round(system.wait_held(distinct, limit), 2)
        time.sleep(interval)
        checks: list[tuple[float, int]] = []
        listings: list[tuple[float, int]] = []
        t0 = time.monotonic()
        while True:
            now = time.monotonic()
            p = system.probe()
            checks.append((now, system.checks()))
            listings.append((now, p["scandir"] + p["glob"]))
            if now - t0 >= window:
                break
            if not system.alive():
                raise Failed(system.why_dead())
            time.sleep(0.05)
        out["window_s"] = round(checks[-1][0] - checks[0][0], 2)
        out.update(rate_over_whole_cycles(checks, interval))
        out["listings_per_s"] = rate_over_whole_cycles(listings, interval)["checks_per_s"]
    except Failed as exc:
        out["failed"] = str(exc)
    finally:
        system.stop()
    return out


def rate_over_whole_cycles(samples: list[tuple[float, int]], interval: float) -> dict[str, Any]:
    """Checks per second from (time, checks so far) samples, over whole cycles only.

    slotless checks a cycle's waits in one burst every interval: a fixed window holds
    one burst more or less depending on where it starts (20 s of 5 s cycles count 3 or
    4 bursts), so the rate is taken from the end of the first burst seen to the end of
    the last one, which holds whole cycles. Checks that never pause for half an
    interval (Airflow's, each trigger on its own clock) have no bursts: their rate is
    over the whole window.
    """
    changes = [(t, c) for (_, before), (t, c) in itertools.pairwise(samples) if c > before]
    bursts: list[list[tuple[float, int]]] = []
    for t, c in changes:
        if not bursts or t - bursts[-1][-1][0] > interval / 2:
            bursts.append([])
        bursts[-1].append((t, c))
    if len(bursts) >= 2:
        (t_a, c_a), (t_b, c_b) = bursts[0][-1], bursts[-1][-1]
        cycles = len(bursts) - 1
        return {
            "checks_per_s": round((c_b - c_a) / (t_b - t_a), 1),
            "checks_per_cycle": round((c_b - c_a) / cycles, 1),
            "cycle_s": round((t_b - t_a) / cycles, 3),
            "cycles_counted": cycles,
        }
    (t_a, c_a), (t_b, c_b) = samples[0], samples[-1]
    rate = (c_b - c_a) / (t_b - t_a) if t_b > t_a else 0.0
    return {
        "checks_per_s": round(rate, 1),
        "checks_per_cycle": round(rate * interval, 1),
        "cycle_s": None,
        "cycles_counted": None,
    }


# -- the run --------------------------------------------------------------------------------


def loaded(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One workload's figures, with how busy the rest of the (shared) machine was."""
    with MachineLoad() as load:
        out = work()
    out["machine_load"] = load.summary
    return out


def run_system(
    name: str,
    make: Callable[..., System],
    args: argparse.Namespace,
    root: Path,
    log: Callable[[str], None],
    w2_push: tuple[bool, ...] = (False,),
) -> dict[str, Any]:
    """Every workload on one system; W2 once per push mode (Airflow's triggers only poll;
    slotless runs with push by default, and W2 is where it shows, so it runs both)."""
    res: dict[str, Any] = {"w1": [], "w2": [], "w3": None}
    log(f"{name}: W1 baseline (no waits)")
    base = loaded(
        lambda: w1(make(root / f"{name}-w1-0"), 0, 5.0, args.idle_window, args.hold_limit)
    )
    res["baseline"] = base
    for n in args.w1_sizes:
        log(f"{name}: W1 at {n:,} waits")
        system = make(root / f"{name}-w1-{n}")
        r = loaded(partial(w1, system, n, 5.0, args.idle_window, args.hold_limit))
        if "pss_bytes" in r and "pss_bytes" in base:
            r["bytes_per_wait"] = round((r["pss_bytes"] - base["pss_bytes"]) / n)
        res["w1"].append(r)
        log(f"  {json.dumps(r)}")
    res.update(w2_and_w3(name, make, args, root, log, w2_push))
    res["settings"] = _settings_of(make, root)
    return res


def w2_and_w3(
    name: str,
    make: Callable[..., System],
    args: argparse.Namespace,
    root: Path,
    log: Callable[[str], None],
    modes: tuple[bool, ...],
) -> dict[str, Any]:
    """W2 at each interval and W3, once per push mode: ``w2`` (a list), ``w3`` (polling)
    and ``w3_push``."""
    res: dict[str, Any] = {"w2": []}
    for push in modes:
        mode = "push" if push else "polling"
        for interval in (1.0, 5.0):
            log(f"{name}: W2 at {interval:g} s, {mode}")
            system = make(root / f"{name}-w2-{interval:g}-{mode}", push=push)
            r = loaded(partial(w2, system, args.w2_n, interval, 300, args.fire_limit))
            res["w2"].append(r)
            log(f"  {json.dumps(r)}")
    # W3 counts periodic checks: polling, like Airflow's. With push, slotless makes none
    # between the safety polls (inotify says when a path changes): measured apart.
    for push in modes:
        key = "w3_push" if push else "w3"
        log(f"{name}: W3, {'push' if push else 'polling'}")
        system = make(root / f"{name}-{key}", push=push)
        res[key] = loaded(
            partial(w3, system, args.w3_n, args.w3_distinct, 5.0, args.w3_window, 300)
        )
        log(f"  {json.dumps(res[key])}")
    return res


def _settings_of(make: Callable[[Path], System], root: Path) -> dict[str, Any]:
    s = make(root / "settings")
    s.command(5000)
    return s.settings


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


def pick(rows: list[dict], key: str, **match: Any) -> float | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()) and key in r:
            return float(r[key])
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--w1-sizes", default="1000,5000,19000")
    ap.add_argument("--idle-window", type=float, default=30.0, help="seconds of idle CPU")
    ap.add_argument("--w3-window", type=float, default=30.0)
    ap.add_argument("--hold-limit", type=float, default=600.0, help="seconds to hold all")
    ap.add_argument("--fire-limit", type=float, default=120.0)
    ap.add_argument("--only", choices=["airflow", "slotless"], default=None)
    # The sizes are the defaults; smaller ones are for trying the command out.
    ap.add_argument("--w2-n", type=int, default=1000)
    ap.add_argument("--w3-n", type=int, default=1000)
    ap.add_argument("--w3-distinct", type=int, default=600)
    ap.add_argument(
        "--through-airflow",
        action="store_true",
        help="one Airflow deployment (PostgreSQL) served by `airflow triggerer`, then by "
        "`slotless airflow-triggerer` (benchmarks/vs_airflow_triggerer.py; its own options)",
    )
    calibration.add_repeats_argument(ap)
    ap.add_argument(
        "--airflow-repeats",
        type=int,
        default=3,
        help="runs of Airflow's side (default 3; each is long, 1 keeps the command short)",
    )
    raw = sys.argv[1:] if argv is None else argv
    if "--through-airflow" in raw:
        # Not slotless's own triggerer: `slotless airflow-triggerer` serving an Airflow
        # deployment, against `airflow triggerer` on the same one (its own options).
        from .vs_airflow_triggerer import main as through_airflow

        through_airflow(raw)
        return
    args = ap.parse_args(raw)
    args.w1_sizes = [int(x) for x in args.w1_sizes.split(",") if x]

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    began = time.monotonic()
    python = airflow_python(BENCH_VENV, what="the benchmark's Airflow")
    venv_s = time.monotonic() - began
    versions = subprocess.run(
        [str(python), "-c", "import airflow; print(airflow.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="vs_airflow-") as tmp:
        root = Path(tmp)
        doc = result_document(
            "vs_airflow",
            raw,
            {
                "w1": {
                    "sizes": args.w1_sizes,
                    "interval_s": 5.0,
                    "idle_window_s": args.idle_window,
                },
                "w2": {"n": args.w2_n, "intervals_s": [1.0, 5.0], "poll_every_s": 0.02},
                "w3": {"n": args.w3_n, "distinct_paths": args.w3_distinct, "interval_s": 5.0},
                "hold_limit_s": args.hold_limit,
                "fire_limit_s": args.fire_limit,
            },
            root,
        )
        doc["airflow_version"] = versions
        doc["airflow_constraints"] = CONSTRAINTS.name
        doc["airflow_venv_ready_s"] = round(venv_s, 1)
        systems: dict[str, tuple[Callable[..., System], tuple[bool, ...]]] = {
            "airflow": (lambda w, push=False: Airflow(w, python), (False,)),
            "slotless": (lambda w, push=True: Slotless(w, push), (False, True)),
        }
        with calibration.Recording(root) as rec:
            for name, (make, w2_push) in systems.items():
                if args.only and name != args.only:
                    continue
                repeats = args.airflow_repeats if name == "airflow" else args.repeats
                runs = []
                for i in range(repeats):
                    log(f"{name}: run {i + 1} of {repeats}")
                    runs.append(run_system(name, make, args, root / f"run{i}", log, w2_push))
                    rec.add({f"{name}_{k}": v for k, v in headline(runs[-1]).items()})
                # The run with the median W2 p99 (1 s, polling) gives the details; each
                # headline figure's spread over the runs is in `repeats`.
                p99s = [headline(r).get("w2_p99_s_1s_polling") for r in runs]
                kept = 0 if None in p99s else calibration.median_index(p99s)  # type: ignore[arg-type]
                doc[name] = {**runs[kept], "kept_run": kept, "runs": len(runs)}
        doc.update(rec.fields())
        doc["machine_load"] = rec.load
    doc["not_run"] = [
        f"W1 at {n:,}: not asked for (--w1-sizes)"
        for n in (1000, 5000, 19000)
        if n not in args.w1_sizes
    ]
    if args.only:
        keep_other(doc, args.only, RESULTS / "vs_airflow.json")
    a, s = doc.get("airflow", {}), doc.get("slotless", {})
    doc["ratios"] = {
        "w1_bytes_per_wait": ratio(
            pick(a.get("w1", []), "bytes_per_wait", n=5000),
            pick(s.get("w1", []), "bytes_per_wait", n=5000),
        ),
        "w1_idle_cpu_at_5000": ratio(
            pick(a.get("w1", []), "idle_cpu_s_per_min", n=5000),
            pick(s.get("w1", []), "idle_cpu_s_per_min", n=5000),
        ),
        "w1_all_held_s_at_5000": ratio(
            pick(a.get("w1", []), "all_held_s", n=5000),
            pick(s.get("w1", []), "all_held_s", n=5000),
        ),
        **{
            f"w2_p99_{i:g}s_{mode}": ratio(
                pick(a.get("w2", []), "p99_s", interval_s=i),
                pick(s.get("w2", []), "p99_s", interval_s=i, push=mode == "push"),
            )
            for mode in ("polling", "push")
            for i in (1.0, 5.0)
        },
        "w3_checks_per_s": ratio(
            (a.get("w3") or {}).get("checks_per_s"), (s.get("w3") or {}).get("checks_per_s")
        ),
        "how": "Airflow / slotless; above 1 means Airflow needs more (time, memory, checks)",
    }
    derive(doc)
    doc["run_s"] = round(time.monotonic() - began, 1)
    path = write_json("vs_airflow", doc)
    plot(doc)
    log(f"wrote {path} in {time.monotonic() - began:.0f} s")
    print(json.dumps(doc["ratios"], indent=2))


def keep_other(doc: dict[str, Any], only: str, previous: Path) -> None:
    """With ``--only``, the other system's section of the last result file, as it was, with
    when and how it was measured (``measured``): one side can be rerun without the other
    (Airflow's takes half an hour)."""
    if not previous.exists():
        return
    old = json.loads(previous.read_text())
    other = "slotless" if only == "airflow" else "airflow"
    if other not in old:
        return
    section = dict(old[other])
    section.setdefault(
        "measured",
        {k: old.get(k) for k in ("date", "command", "git", "machine_load", "calibration")},
    )
    doc[other] = section


def headline(res: dict[str, Any]) -> dict[str, float | None]:
    """One run of one system: each workload's headline figures (none for a failed one)."""
    out: dict[str, float | None] = {}
    for r in res["w1"]:
        for key in ("all_held_s", "bytes_per_wait", "idle_cpu_s_per_min"):
            out[f"w1_{key}_{r['n']}"] = r.get(key)
    for r in res["w2"]:
        mode = "push" if r.get("push") else "polling"
        for key in ("p50_s", "p99_s"):
            out[f"w2_{key}_{r['interval_s']:g}s_{mode}"] = r.get(key)
    w3 = res.get("w3") or {}
    out["w3_checks_per_s"] = w3.get("checks_per_s")
    out["w3_checks_per_cycle"] = w3.get("checks_per_cycle")
    if "w3_push" in res:
        out["w3_checks_per_s_push"] = (res["w3_push"] or {}).get("checks_per_s")
    return out


def derive(doc: dict[str, Any]) -> None:
    """Figures computed from the measured ones: the marginal memory of a wait between two
    sizes (what one more wait costs, without the imports a first trigger pulls in)."""
    for name in ("airflow", "slotless"):
        res = doc.get(name)
        if not res:
            continue
        rows = [r for r in res["w1"] if "pss_bytes" in r]
        res["w1_marginal_bytes_per_wait"] = [
            {
                "from": a["n"],
                "to": b["n"],
                "bytes_per_wait": round((b["pss_bytes"] - a["pss_bytes"]) / (b["n"] - a["n"])),
            }
            for a, b in itertools.pairwise(rows)
        ]


W2_OFFSETS = {"airflow, polling": -0.28, "slotless, polling": 0.0, "slotless, push": 0.28}
W2_COLORS = {
    "airflow, polling": "#d62728",
    "slotless, polling": "#1f77b4",
    "slotless, push": "#2ca02c",
}


def plot(doc: dict[str, Any]) -> None:
    fig, axes = subplots(3, width=5.0)
    colors = {"airflow": "#d62728", "slotless": "#1f77b4"}
    for name in ("airflow", "slotless"):
        res = doc.get(name)
        if not res:
            continue
        rows = [r for r in res["w1"] if "bytes_per_wait" in r]
        axes[0].plot(
            [r["n"] for r in rows],
            [r["bytes_per_wait"] / 1024 for r in rows],
            "o-",
            color=colors[name],
            label=name,
        )
        for r in res["w1"]:
            if "failed" in r:
                axes[0].annotate("failed", (r["n"], 0), color=colors[name])
        for r in res["w2"]:
            if "p99_s" not in r:
                continue
            series = f"{name}, {'push' if r.get('push') else 'polling'}"
            x = (0 if r["interval_s"] == 1.0 else 1) + W2_OFFSETS[series]
            axes[1].bar(x, r["p99_s"], width=0.27, color=W2_COLORS[series], label=series)
            axes[1].plot([x], [r["p50_s"]], "k_", markersize=10)
        w3 = res.get("w3") or {}
        if "checks_per_s" in w3:
            axes[2].bar(name, w3["checks_per_s"], color=colors[name])
    axes[0].set(xlabel="waits held", ylabel="KiB PSS per wait", title="W1: memory per wait")
    axes[0].legend()
    axes[1].set_xticks([0, 1], ["1 s interval", "5 s interval"])
    axes[1].set(
        ylabel="seconds (bar p99, tick p50), log",
        title="W2: file created -> task moves",
        yscale="log",
    )
    handles, labels = axes[1].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes[1].legend(unique.values(), unique.keys(), fontsize=8)
    axes[2].set(ylabel="checks per second", title="W3: 1,000 waits on 600 paths (5 s)")
    fig.suptitle("Airflow's triggerer vs slotless's, SQLite. " + calibration.caption(doc))
    save_figure(fig, "vs_airflow")


if __name__ == "__main__":
    main()
