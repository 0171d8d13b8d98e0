"""What every benchmark shares: metadata, result files, plots, progress, and instruments.

The instruments measure the real code paths without changing them: :class:`ExchangeLog`
wraps :meth:`Exchange.exchange` (one call is one worker transaction: outcomes in, claims out)
and :class:`RssSampler` samples the process's resident memory from a thread.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
import platform
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("slotless", "aiosqlite", "anyio", "pydantic", "rich", "matplotlib", "psutil")

console = Console(stderr=True)


# -- metadata ------------------------------------------------------------------------------


def machine(workdir: Path | None = None) -> dict[str, Any]:
    """The machine the figures come from: they mean little without it."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_model": _cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite_version": sqlite3.sqlite_version,
        "cpu_affinity": sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
    }
    if workdir is not None:
        info["db_filesystem"] = _filesystem(workdir)
    return info


def machine_caption(info: dict[str, Any]) -> str:
    """A figure's line on the machine (``info`` from :func:`machine`)."""
    return f"{info['cpu_count']} CPUs, Python {info['python']}, SQLite {info['sqlite_version']}"


def pin_cpus(cpus: str | None) -> None:
    """Restrict this process (and the processes it starts) to CPUs like "0" or "0,1".

    For diagnosis: on some virtual machines a wake-up from one CPU to another costs tens of
    microseconds, and the executor hands every statement from the event loop to the SQLite
    thread and back; pinning to one CPU shows how much of a figure is that hand-off.
    """
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_revision() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _filesystem(path: Path) -> str | None:
    """The filesystem type holding ``path`` (ext4, tmpfs, ...): SQLite commits depend on it."""
    best: tuple[int, str] | None = None
    resolved = str(path.resolve())
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) > best[0]):
            best = (len(mount), part.fstype)
    return best[1] if best else None


def result_document(
    name: str, argv: Sequence[str], params: dict[str, Any], workdir: Path
) -> dict[str, Any]:
    """The common head of a result file; each benchmark adds its figures."""
    return {
        "benchmark": name,
        "command": "python -m benchmarks." + name + "".join(" " + shlex.quote(a) for a in argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(workdir),
        "versions": versions(),
        "git": git_revision(),
        "params": params,
    }


def write_json(name: str, doc: dict[str, Any], results: Path = RESULTS) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    return path


# -- plots ---------------------------------------------------------------------------------


def subplots(ncols: int, width: float = 6.0, height: float = 4.2) -> tuple[Any, Any]:
    """A row of matplotlib axes on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), constrained_layout=True)
    return fig, axes


def save_figure(fig: Any, name: str, results: Path = RESULTS) -> Path:
    import matplotlib.pyplot as plt

    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- console -------------------------------------------------------------------------------


def progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def print_table(title: str, rows: Sequence[tuple[str, str]], caption: str | None = None) -> None:
    table = Table(title=title, caption=caption)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, value)
    out = Console()
    if not out.is_terminal:
        out = Console(width=120)  # a log file or a pipe: do not wrap at 80 columns
    out.print(table)


def load_row(load: dict[str, Any]) -> tuple[str, str]:
    """A table row saying whether other processes competed for the CPUs meanwhile."""
    busy = load.get("other_processes_cpus_busy") or 0.0
    text = f"{busy:.2f} CPUs (load avg {load['load_average_1m_at_start']:.2f} at start)"
    if busy > 0.2:
        text = f"[yellow]{text}: figures perturbed[/yellow]"
    return ("other processes busy meanwhile", text)


@contextlib.contextmanager
def follow(
    bar: Progress, task: TaskID, count: Callable[[], int], every: float = 0.2
) -> Iterator[None]:
    """Move a progress bar from a thread, so the measured event loop does no drawing."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(every):
            bar.update(task, completed=count())

    thread = threading.Thread(target=poll, name="bench-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.update(task, completed=count())


# -- instruments ---------------------------------------------------------------------------


@dataclass(slots=True)
class Exchange:
    started: float  # time.perf_counter()
    ended: float
    outcomes: int
    claimed: int
    row_ids: tuple[int, ...]  # the rows whose outcomes this transaction recorded

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class ExchangeLog:
    """Every worker transaction (``Exchange.exchange``) while active, with its duration.

    Patches the class, so it sees the store that ``slotless run`` opens by itself.
    """

    exchanges: list[Exchange] = field(default_factory=list)
    create_run_s: list[float] = field(default_factory=list)
    completed: int = 0

    @contextlib.contextmanager
    def active(self) -> Iterator[ExchangeLog]:
        from executor import store as parts

        exchange, create_run = parts.Exchange.exchange, parts.Runs.create_run
        log = self

        async def timed_exchange(
            self: parts.Exchange, outcomes: Any, owner: str, limit: int, *rest: Any, **kw: Any
        ) -> Any:
            outcomes = list(outcomes)
            t0 = time.perf_counter()
            # rest, kw: the queues, the callbacks list
            claimed = await exchange(self, outcomes, owner, limit, *rest, **kw)
            log.exchanges.append(
                Exchange(
                    t0,
                    time.perf_counter(),
                    len(outcomes),
                    len(claimed),
                    tuple(o.row_id for o in outcomes),
                )
            )
            log.completed += len(outcomes)
            return claimed

        async def timed_create_run(self: parts.Runs, *args: Any, **kwargs: Any) -> str:
            t0 = time.perf_counter()
            try:
                return await create_run(self, *args, **kwargs)
            finally:
                log.create_run_s.append(time.perf_counter() - t0)

        parts.Exchange.exchange = timed_exchange  # type: ignore[method-assign]
        parts.Runs.create_run = timed_create_run  # type: ignore[method-assign]
        try:
            yield self
        finally:
            parts.Exchange.exchange = exchange  # type: ignore[method-assign]
            parts.Runs.create_run = create_run  # type: ignore[method-assign]

    def summary(self) -> dict[str, Any]:
        busy = [e for e in self.exchanges if e.outcomes or e.claimed]
        if not busy:
            return {"transactions": 0}
        secs = sorted(e.seconds for e in busy)
        return {
            "transactions": len(busy),
            "outcomes_per_transaction": round(sum(e.outcomes for e in busy) / len(busy), 2),
            "transaction_ms_median": round(percentile(secs, 50) * 1e3, 3),
            "transaction_ms_p99": round(percentile(secs, 99) * 1e3, 3),
            "transaction_s_total": round(sum(secs), 3),
        }


class RssSampler:
    """Resident set size of this process, sampled from a thread (psutil)."""

    def __init__(self, every: float = 0.05) -> None:
        self._proc = psutil.Process()
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self.t0 = time.perf_counter()
        self.samples: list[tuple[float, int]] = []  # (perf_counter, rss bytes)

    def __enter__(self) -> RssSampler:
        self.t0 = time.perf_counter()
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        self.samples.append((time.perf_counter(), self._proc.memory_info().rss))

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._sample()

    @property
    def peak_mb(self) -> float:
        return max(r for _, r in self.samples) / 2**20

    @property
    def start_mb(self) -> float:
        return self.samples[0][1] / 2**20


class MachineLoad:
    """How busy the rest of the machine was while a benchmark ran.

    Figures from a shared 2-CPU machine are only comparable when nothing else ran: this
    records the load average and the CPU time other processes used meanwhile.
    """

    def __enter__(self) -> MachineLoad:
        self._proc = psutil.Process()
        self._t0 = time.perf_counter()
        self._busy0 = _busy_cpu_seconds()
        self._own0 = _own_cpu_seconds(self._proc)
        self.load_at_start = os.getloadavg()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        busy = _busy_cpu_seconds() - self._busy0
        own = _own_cpu_seconds(self._proc) - self._own0
        self.summary = {
            "load_average_1m_at_start": round(self.load_at_start, 2),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            "wall_s": round(wall, 2),
            "benchmark_cpu_s": round(own, 2),
            "other_processes_cpu_s": round(max(0.0, busy - own), 2),
            "other_processes_cpus_busy": round(max(0.0, busy - own) / wall, 2) if wall else None,
        }


def _busy_cpu_seconds() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own_cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def peak_rss_getrusage_mb() -> float:
    """The kernel's high-water mark for this process (ru_maxrss, KiB on Linux)."""
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


# -- running slotless ----------------------------------------------------------------------


@dataclass(slots=True)
class CliRun:
    argv: list[str]
    returncode: int
    seconds: float
    result: dict[str, Any] | None  # the --json object
    cpu_s: float  # CPU time (user + system) the run used, all threads; less load-sensitive


def run_cli(argv: Sequence[str]) -> CliRun:
    """``slotless ARGV`` in this process (``slotless.cli.main``), timed; stdout captured."""
    from slotless import cli

    buf = io.StringIO()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(list(argv))
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return CliRun(list(argv), rc, seconds, _json_or_none(buf.getvalue()), cpu)


def run_cli_subprocess(argv: Sequence[str]) -> CliRun:
    """``slotless ARGV`` as a new process, timed from spawn to exit (startup included)."""
    exe = Path(sys.executable).with_name("slotless")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "slotless"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cpu0 = _children_cpu_seconds()
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, *argv], capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - t0
    cpu = _children_cpu_seconds() - cpu0
    if proc.returncode not in (0, 1):
        console.print(f"[red]slotless {' '.join(argv)} failed:[/red] {proc.stderr.strip()}")
    return CliRun([*cmd, *argv], proc.returncode, seconds, _json_or_none(proc.stdout), cpu)


def _children_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _json_or_none(text: str) -> dict[str, Any] | None:
    try:
        return json.loads(text)
    except ValueError:
        return None


@contextlib.contextmanager
def workdir(path: str | None, keep: bool) -> Iterator[Path]:
    """Where DAG files and databases go: a fresh temporary folder unless one is named."""
    if path:
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        yield p
        return
    p = Path(tempfile.mkdtemp(prefix="slotless-bench-"))
    try:
        yield p
    finally:
        if keep:
            console.print(f"kept {p}")
        else:
            shutil.rmtree(p, ignore_errors=True)


def fresh_db(folder: Path, name: str) -> str:
    """A URL for a database file that does not exist yet."""
    path = folder / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return f"sqlite:///{path}"


def write_dag_file(folder: Path, name: str, source: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(source)
    return path
