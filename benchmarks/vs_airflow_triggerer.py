"""One Airflow deployment served by ``airflow triggerer``, then by ``slotless
airflow-triggerer``: the same metadata database, the same deferred task instances, side by
side in one run (``python -m benchmarks.vs_airflow --through-airflow``).

    python -m benchmarks.vs_airflow --through-airflow                  # the issue's sizes
    python -m benchmarks.vs_airflow --through-airflow --w1-sizes 5000 --most 50000
    python -m benchmarks.vs_airflow --through-airflow --most-only   # slotless's most held
                                    # alone, merged into the last result file

The deployment: Airflow 3.3 (``.venv-bench-airflow``, benchmarks/airflow_env.py, which also
holds this checkout, so ``slotless airflow-triggerer`` runs in the deployment's own
environment as docs/airflow-triggerer.md asks) with its metadata database on PostgreSQL
(``--pg``, 127.0.0.1:5432 by default), what a deployment with thousands of deferred tasks
runs and the only backend ``slotless airflow-triggerer`` supports. One private database is
migrated (``airflow db migrate``) and its DAG serialized once; every workload then runs on
a fresh copy of it (``CREATE DATABASE ... TEMPLATE``), dropped after; the template is
dropped at the end. The waits are written as benchmarks/airflow_side/seed.py writes them:
task instances DEFERRED through Airflow's ORM, one FileTrigger row each, as a deferrable
FileSensor leaves them. Both triggerers get the same settings: capacity and
``[triggerer] max_trigger_to_select_per_loop`` of the waits plus 1,000 (the latter at most
50,000: see SELECT_LIMIT_CAP), Airflow's defaults otherwise.

Each triggerer runs, in turn, the workloads of benchmarks/vs_airflow.py (its ``w1``,
``w2``, ``w3``), measured the same way for both:

* W1: N waits (5 s interval) that never fire: PSS per wait of the process tree above the
  same triggerer holding none, time until every wait was checked once, idle CPU, loop
  stalls; at ``--w1-sizes`` (5,000 and 19,000), then the most held: slotless at
  ``--most`` (100,000), recorded with the time it took to check them all, or what it
  reached and why. Airflow's most held is its largest W1 size held (the issue measured it
  dying at 20,000, one log file per trigger against the open-files limit; not tried again
  here);
* W2: 1,000 waits whose files are created in one burst, at 1 s and 5 s intervals: file
  created -> task instance out of DEFERRED, read from Airflow's ``task_instance`` table
  every 20 ms, p50 / p99 / max;
* W3: 1,000 waits on 600 distinct paths (5 s interval): checks per second, over whole
  cycles.

How checks are counted: the probe (benchmarks/airflow_side/probe) in each triggerer's
processes counts ``glob.glob`` calls (Airflow's FileTrigger globs once per check, and so
does slotless's native file check) and the distinct paths globbed ("all held": every wait
checked once); slotless's checks are also read from its ``/metrics``
(``slotless_airflow_native_checks_total``, ``--metrics-port``), which W3's rate uses for
slotless. Target: ``w3_distinct_paths_per_s``, the distinct paths over the interval.

Results: benchmarks/results/vs_airflow_triggerer.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
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
from urllib.parse import urlsplit, urlunsplit

from triggers.inotify import POLL_FSTYPES_ENV

from . import calibration
from .airflow_env import BENCH_VENV, CONSTRAINTS, airflow_python
from .common import RESULTS, result_document, save_figure, subplots, write_json
from .vs_airflow import (
    AIRFLOW_DAG,
    SEED,
    Failed,
    System,
    _nofile,
    free_port,
    loaded,
    w1,
    w2_and_w3,
)

NAME = "vs_airflow_triggerer"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
INTERVALS = (1.0, 5.0)
# Airflow's assign_unassigned takes its rows with one UPDATE ... WHERE id IN (...), a bind
# parameter per row, and PostgreSQL's protocol allows 65,535: a select limit above that
# fails every cycle (psycopg refuses the statement), whichever triggerer asks.
SELECT_LIMIT_CAP = 50_000


def select_limit(n: int) -> int:
    """``[triggerer] max_trigger_to_select_per_loop`` for n waits: all of them in one
    cycle where PostgreSQL allows it (Airflow's default, 50, would take them 50 a cycle)."""
    return min(n + 1000, SELECT_LIMIT_CAP)


async def _admin(dsn: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


class Deployment:
    """The Airflow home, and a migrated template database each workload gets a copy of."""

    def __init__(self, python: Path, work: Path, admin_dsn: str) -> None:
        self.python = python
        self.bin = python.parent
        self.work = work
        self.admin_dsn = admin_dsn
        self.template = f"vs_aft_{secrets.token_hex(4)}"
        self.copies = 0
        (work / "dags").mkdir(parents=True, exist_ok=True)
        (work / "dags" / "vs_bench.py").write_text(textwrap.dedent(AIRFLOW_DAG))
        self.fernet = base64.urlsafe_b64encode(os.urandom(32)).decode()

    def url(self, db: str, driver: str = "postgresql+psycopg") -> str:
        parts = urlsplit(self.admin_dsn)
        return urlunsplit(parts._replace(scheme=driver, path=f"/{db}", query=""))

    def env(self, db: str, home: Path) -> dict[str, str]:
        url = self.url(db)
        return {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(home),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.work / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__FERNET_KEY": self.fernet,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url,
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            # slotless runs on uvloop here (Airflow installs it): the probe's loop-stall
            # watch then hooks uvloop's loop too, in both triggerers alike.
            "VS_PROBE_UVLOOP": "1",
        }

    def admin(self, statement: str) -> None:
        asyncio.run(_admin(self.admin_dsn, statement))

    def airflow(self, db: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / "airflow"), *args],
            env=self.env(db, self.work),
            cwd=self.work,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise Failed(f"airflow {' '.join(args)} failed: {done.stderr[-2000:]}")

    def build(self) -> float:
        began = time.monotonic()
        self.admin(f'CREATE DATABASE "{self.template}"')
        self.airflow(self.template, "db", "migrate")
        self.airflow(self.template, "dags", "reserialize")
        return time.monotonic() - began

    def copy(self) -> str:
        self.copies += 1
        name = f"{self.template}_{self.copies}"
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name

    def drop(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class OnAirflow(System):
    """A triggerer serving a copy of the deployment's database: seeded by seed.py, read
    back from Airflow's ``task_instance`` table."""

    def __init__(self, work: Path, dep: Deployment, push: bool = False) -> None:
        super().__init__(work, push)
        self.dep = dep
        self.db: str | None = None
        self.env: dict[str, str] = {}
        self.n_rows = 0
        self.seed_timeout: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Any = None

    def seed(self, paths: list[str], interval: float) -> float:
        began = time.monotonic()
        self.db = self.dep.copy()
        self.env = self.dep.env(self.db, self.work)
        (self.work / "paths.json").write_text(json.dumps(paths))
        try:
            done = subprocess.run(
                [str(self.dep.python), str(SEED), str(len(paths)), str(interval), "paths.json"],
                env=self.env,
                cwd=self.work,
                capture_output=True,
                text=True,
                timeout=self.seed_timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise Failed(
                f"writing {len(paths):,} deferred task instances through Airflow's ORM took "
                f"over {exc.timeout:g} s"
            ) from exc
        if done.returncode != 0:
            raise Failed(f"seeding Airflow's database failed: {done.stderr[-2000:]}")
        return time.monotonic() - began

    def start(self, n: int, n_distinct: int) -> None:
        self.n_rows = n
        super().start(n, n_distinct)

    def left_deferred(self) -> set[int]:
        if self._loop is None:
            import asyncpg

            assert self.db is not None
            self._loop = asyncio.new_event_loop()
            self._conn = self._loop.run_until_complete(
                asyncpg.connect(self.dep.url(self.db, "postgresql"))
            )
        rows = self._loop.run_until_complete(
            self._conn.fetch(
                "SELECT map_index FROM task_instance WHERE state IS DISTINCT FROM 'deferred'"
            )
        )
        return {int(r["map_index"]) for r in rows}

    def probed_checks(self) -> int:
        return int(self.probe()["glob"])

    def seen(self) -> int:
        return int(self.probe()["distinct"])

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._loop is not None:
                self._loop.run_until_complete(self._conn.close())
                self._loop.close()
                self._loop = None
            if self.db is not None:
                self.dep.drop(self.db)
                self.db = None


class AirflowTriggerer(OnAirflow):
    name = "airflow"

    def command(self, n: int) -> tuple[list[str], dict[str, str]]:
        capacity = n + 1000
        self.settings = {
            "command": f"airflow triggerer --capacity {capacity}",
            "[triggerer] capacity": capacity,
            "[triggerer] max_trigger_to_select_per_loop": select_limit(n),
            "[database] sql_alchemy_conn": "postgresql+psycopg (127.0.0.1)",
            "open files limit (ulimit -n)": _nofile(),
            "other settings": "Airflow's defaults",
        }
        env = {
            **self.env,
            "AIRFLOW__TRIGGERER__CAPACITY": str(capacity),
            "AIRFLOW__TRIGGERER__MAX_TRIGGER_TO_SELECT_PER_LOOP": str(select_limit(n)),
        }
        argv = [str(self.dep.bin / "airflow"), "triggerer", "--capacity", str(capacity)]
        return argv, env

    def held(self, n_distinct: int) -> bool:
        return self.probe()["all_seen_at"] is not None or n_distinct == 0

    def checks(self) -> int:
        return self.probed_checks()


class SlotlessAirflowTriggerer(OnAirflow):
    name = "slotless"

    def __init__(self, work: Path, dep: Deployment, push: bool = True) -> None:
        # push: its native file checks' directories watched by inotify (its default);
        # without, polled at the interval as Airflow's FileTrigger polls (inotify turned
        # off with SLOTLESS_INOTIFY_POLL_FSTYPES=*, as for a network filesystem).
        super().__init__(work, dep, push)
        self.port = free_port()

    def command(self, n: int) -> tuple[list[str], dict[str, str]]:
        capacity = n + 1000
        self.settings = {
            "command": f"slotless airflow-triggerer --capacity {capacity} "
            "--metrics-port P (defaults otherwise: --interval 1)",
            "[triggerer] max_trigger_to_select_per_loop": select_limit(n),
            "[database] sql_alchemy_conn": "postgresql+psycopg (127.0.0.1)",
            "open files limit (ulimit -n)": _nofile(),
        }
        env = {
            **self.env,
            "AIRFLOW__TRIGGERER__MAX_TRIGGER_TO_SELECT_PER_LOOP": str(select_limit(n)),
        }
        if not self.push:
            env[POLL_FSTYPES_ENV] = "*"
            self.settings["inotify"] = f"off ({POLL_FSTYPES_ENV}=*): polled at the interval"
        argv = [str(self.dep.bin / "slotless"), "airflow-triggerer", "--capacity", str(capacity)]
        argv += ["--metrics-port", str(self.port), "--metrics-host", "127.0.0.1"]
        return argv, env

    def metric(self, name: str) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def held(self, n_distinct: int) -> bool:
        # Every distinct path checked once (its native check looks paths up by name in a
        # listing, not by glob: its own count), every row loaded (W3's 1,000 rows on 600
        # paths could see every path before the last rows are taken).
        if n_distinct == 0:
            return True
        # And each row's first line written to its task's trigger log, as Airflow's
        # triggerer creates each trigger's log file before its first check: at 100,000,
        # writing those files takes tens of seconds, which would otherwise be counted as
        # idle CPU.
        return (
            self.metric("slotless_airflow_first_checks_total") >= n_distinct
            and self.metric("slotless_airflow_triggers") >= self.n_rows
            and self.metric("slotless_airflow_task_log_lines_total") >= self.n_rows
        )

    def checks(self) -> int:
        return int(self.metric("slotless_airflow_native_checks_total"))


# -- the run --------------------------------------------------------------------------------


def run_triggerer(
    name: str, make: Callable[..., OnAirflow], args: argparse.Namespace, root: Path, log: Any
) -> dict[str, Any]:
    res: dict[str, Any] = {"w1": [], "w2": [], "w3": None}
    log(f"{name}: W1 baseline (no waits)")
    base = loaded(lambda: w1(make(root / f"{name}-w1-0"), 0, 5.0, args.idle_window, 300))
    res["baseline"] = base
    for n in args.w1_sizes:
        log(f"{name}: W1 at {n:,} waits")
        system = make(root / f"{name}-w1-{n}")
        res["w1"].append(w1_row(system, n, base, args, args.hold_limit, log))
    # slotless twice, pushed (its default: inotify) and polled (as Airflow's FileTrigger
    # polls, and as slotless does on a network filesystem); Airflow's only polls.
    modes = (True, False) if name == "slotless" else (False,)
    res.update(w2_and_w3(name, make, args, root, log, modes))
    if name == "slotless" and args.most and args.most not in args.w1_sizes:
        # Last, so a size this machine cannot take in time costs only its own limit.
        log(
            f"{name}: the most held, {args.most:,} waits (limit {args.most_limit:g} s each "
            "to write them and to check them all)"
        )
        system = make(root / f"{name}-w1-{args.most}")
        system.seed_timeout = args.most_limit
        res["w1"].append(w1_row(system, args.most, base, args, args.most_limit, log))
    settings = make(root / "settings")
    settings.command(5000)
    res["settings"] = settings.settings
    headline_into(res, name, args)
    return res


def w1_row(
    system: OnAirflow,
    n: int,
    base: dict[str, Any],
    args: argparse.Namespace,
    limit: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    r = loaded(partial(w1, system, n, 5.0, args.idle_window, limit))
    if "pss_bytes" in r and "pss_bytes" in base:
        r["bytes_per_wait"] = round((r["pss_bytes"] - base["pss_bytes"]) / n)
    log(f"  {r}")
    return r


def headline_into(res: dict[str, Any], name: str, args: argparse.Namespace) -> None:
    """The issue's named figures at the top of each triggerer's object."""
    by_n = {r["n"]: r for r in res["w1"]}
    for n in (5000, 19000):
        res[f"w1_bytes_per_wait_{n}"] = by_n.get(n, {}).get("bytes_per_wait")
    held = [r for r in res["w1"] if "all_held_s" in r and "failed" not in r]
    most = max(held, key=lambda r: r["n"], default=None)
    res["most_held"] = most["n"] if most else 0
    res["most_held_run"] = (
        {k: most.get(k) for k in ("n", "seed_s", "all_held_s", "pss_bytes", "bytes_per_wait")}
        if most
        else None
    )
    tried = [r for r in res["w1"] if "failed" in r]
    if tried:
        res["most_held_failed"] = [{"n": r["n"], "failed": r["failed"]} for r in tried]
    if name == "airflow":
        res["most_held_note"] = (
            "the largest W1 size held in this run; no larger size tried here (the issue "
            "measured Airflow's triggerer dying at 20,000 on the open-files limit)"
        )
    # The headline is each triggerer as deployed: slotless pushed (its default), Airflow
    # polling; slotless polled is kept beside it.
    for r in res["w2"]:
        suffix = "" if r.get("push") or name == "airflow" else "_polling"
        for q in ("p50", "p99"):
            res[f"w2_{q}_s_{r['interval_s']:g}s{suffix}"] = r.get(f"{q}_s")
    w3r = res["w3"] or {}
    res["w3_checks_per_s"] = w3r.get("checks_per_s")
    res["w3_listings_per_s"] = w3r.get("listings_per_s")
    if res.get("w3_push"):
        res["w3_checks_per_s_push"] = res["w3_push"].get("checks_per_s")


def targets(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    s = doc.get("slotless") or {}
    distinct_per_s = args.w3_distinct / 5.0
    out: dict[str, Any] = {
        "slotless_holds_100000": (s.get("most_held") or 0) >= 100_000,
        "w3_checks_per_s_equal_distinct_paths_per_s": None,
    }
    for i in INTERVALS:
        for mode in ("", "_polling"):
            p99 = s.get(f"w2_p99_s_{i:g}s{mode}")
            ok = None if p99 is None else p99 <= i + 0.1
            out[f"w2_p99_s_{i:g}s{mode}_within_interval_plus_0.1"] = ok
    c = s.get("w3_checks_per_s")
    if c is not None:
        # Whole cycles of 5 s counted over a 30 s window: within 5 % of the target.
        out["w3_checks_per_s_equal_distinct_paths_per_s"] = (
            abs(c - distinct_per_s) <= 0.05 * distinct_per_s
        )
    return out


def main(raw: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.vs_airflow --through-airflow",
        description=__doc__.split("\n")[0],
    )
    ap.add_argument("--through-airflow", action="store_true", help="(this mode)")
    ap.add_argument("--w1-sizes", default="5000,19000")
    ap.add_argument("--most", type=int, default=100_000, help="slotless's most held")
    ap.add_argument("--most-limit", type=float, default=900.0, help="seconds to hold --most")
    ap.add_argument("--idle-window", type=float, default=30.0)
    ap.add_argument("--w3-window", type=float, default=30.0)
    ap.add_argument("--hold-limit", type=float, default=600.0)
    ap.add_argument("--fire-limit", type=float, default=180.0)
    ap.add_argument("--only", choices=["airflow", "slotless"], default=None)
    ap.add_argument(
        "--most-only",
        action="store_true",
        help="only slotless's most held (and its empty baseline), merged into the last "
        "result file's slotless section with its own date, command and load",
    )
    ap.add_argument("--w2-n", type=int, default=1000)
    ap.add_argument("--w3-n", type=int, default=1000)
    ap.add_argument("--w3-distinct", type=int, default=600)
    ap.add_argument(
        "--pg",
        default=os.environ.get("SLOTLESS_TEST_PG_DSN", DEFAULT_PG),
        help="a PostgreSQL server's DSN, whose user may create databases (trust auth)",
    )
    args = ap.parse_args(raw)
    args.w1_sizes = [int(x) for x in args.w1_sizes.split(",") if x]

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    began = time.monotonic()
    python = airflow_python(BENCH_VENV, what="the benchmark's Airflow")
    version = subprocess.run(
        [str(python), "-c", "import airflow; print(airflow.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="vs_aft-") as tmp:
        root = Path(tmp)
        dep = Deployment(python, root / "deployment", args.pg)
        doc = result_document(
            NAME,
            raw,
            {
                "w1": {"sizes": args.w1_sizes, "slotless_most": args.most, "interval_s": 5.0},
                "idle_window_s": args.idle_window,
                "w2": {"n": args.w2_n, "intervals_s": list(INTERVALS), "poll_every_s": 0.02},
                "w3": {"n": args.w3_n, "distinct_paths": args.w3_distinct, "interval_s": 5.0},
                "database": "PostgreSQL (a private database per workload, copied from one "
                "migrated template)",
            },
            root,
        )
        doc["command"] = "python -m benchmarks.vs_airflow " + " ".join(raw)
        doc["airflow_version"] = version
        doc["airflow_constraints"] = CONSTRAINTS.name
        makers: dict[str, Callable[..., OnAirflow]] = {
            "airflow": lambda w, push=False: AirflowTriggerer(w, dep),
            "slotless": lambda w, push=True: SlotlessAirflowTriggerer(w, dep, push),
        }
        try:
            log("migrating the template database (airflow db migrate, dags reserialize)")
            doc["deployment_ready_s"] = round(dep.build(), 1)
            if args.most_only:
                most_only(doc, makers["slotless"], args, root, log)
                return
            with calibration.Recording(root) as rec:
                for name, make in makers.items():
                    if args.only and name != args.only:
                        continue
                    doc[name] = run_triggerer(name, make, args, root, log)
                    rec.add(
                        {
                            k: v
                            for k, v in doc[name].items()
                            if k.startswith("w") and isinstance(v, (int, float))
                        }
                    )
            doc.update(rec.fields())
            doc["machine_load"] = rec.load
        finally:
            dep.drop(dep.template)
    doc["w3_distinct_paths_per_s"] = round(args.w3_distinct / 5.0, 1)
    doc["targets"] = targets(doc, args)
    doc["not_run"] = [
        f"W1 at {n:,}: not asked for (--w1-sizes)" for n in (5000, 19000) if n not in args.w1_sizes
    ]
    if args.most < 100_000:
        doc["not_run"].append(f"slotless's most held tried at {args.most:,}, not 100,000 (--most)")
    doc["shared_machine"] = (
        "2 cores shared with other sessions' tests while this ran: see machine_load and calibration"
    )
    doc["run_s"] = round(time.monotonic() - began, 1)
    path = write_json(NAME, doc)
    plot(doc)
    log(f"wrote {path} in {time.monotonic() - began:.0f} s")


def most_only(
    doc: dict[str, Any],
    make: Callable[..., OnAirflow],
    args: argparse.Namespace,
    root: Path,
    log: Callable[[str], None],
) -> None:
    """slotless's most held alone, put into the last result file: its W1 row replaces the
    one at that size (the earlier attempt is kept under ``most_held_earlier``)."""
    path = RESULTS / f"{NAME}.json"
    old = json.loads(path.read_text())
    res = old["slotless"]
    with calibration.Recording(root) as rec:
        log("slotless: W1 baseline (no waits)")
        base = loaded(lambda: w1(make(root / "w1-0"), 0, 5.0, args.idle_window, 300))
        log(f"slotless: the most held, {args.most:,} waits")
        system = make(root / f"w1-{args.most}")
        system.seed_timeout = args.most_limit
        row = w1_row(system, args.most, base, args, args.most_limit, log)
    earlier = [r for r in res["w1"] if r["n"] == args.most]
    if earlier:
        res.setdefault("most_held_earlier", []).extend(earlier)
    row["measured"] = {
        "date": doc["date"],
        "command": doc["command"],
        "git": doc["git"],
        "baseline": base,
        "select_limit": select_limit(args.most),
        **rec.fields(),
        "machine_load": rec.load,
    }
    res["w1"] = [r for r in res["w1"] if r["n"] != args.most] + [row]
    res.pop("most_held_failed", None)
    headline_into(res, "slotless", args)
    old["targets"] = targets(old, args)
    write_json(NAME, old)
    plot(old)
    log(f"merged the most held into {path}")


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
            label=f"{name} (most held {res.get('most_held', 0):,})",
        )
        for r in res["w2"]:
            if "p99_s" not in r:
                continue
            # Three series: Airflow's (polling), slotless pushed, slotless polling.
            series = 0 if name == "airflow" else (1 if r.get("push") else 2)
            label = (
                name if name == "airflow" else f"{name} ({'push' if series == 1 else 'polling'})"
            )
            x = (0 if r["interval_s"] == 1.0 else 1) + (series - 1) * 0.28
            color = "#9ecae1" if series == 2 else colors[name]
            axes[1].bar(x, r["p99_s"], width=0.26, color=color, label=label)
            axes[1].plot([x], [r["p50_s"]], "k_", markersize=10)
        w3r = res.get("w3") or {}
        if "checks_per_s" in w3r:
            axes[2].bar(name, w3r["checks_per_s"], color=colors[name])
    axes[0].set(
        xlabel="deferred task instances held",
        ylabel="KiB PSS per wait",
        title="W1: memory per deferred task",
        xscale="log",
    )
    axes[0].legend(fontsize=8)
    axes[1].set_xticks([0, 1], ["1 s interval", "5 s interval"])
    axes[1].set(
        ylabel="seconds (bar p99, tick p50), log",
        title="W2: file -> task out of DEFERRED",
        yscale="log",
    )
    handles, labels = axes[1].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes[1].legend(unique.values(), unique.keys(), fontsize=8)
    target = doc.get("w3_distinct_paths_per_s")
    if target:
        axes[2].axhline(target, color="k", linestyle="--", label="distinct paths / interval")
        axes[2].legend(fontsize=8)
    axes[2].set(ylabel="checks per second", title="W3: 1,000 tasks on 600 paths (5 s)")
    fig.suptitle(
        "One Airflow deployment (PostgreSQL): airflow triggerer vs slotless airflow-triggerer. "
        + calibration.caption(doc),
        fontsize=8,
    )
    save_figure(fig, NAME)
