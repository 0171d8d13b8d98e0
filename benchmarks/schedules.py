"""Scheduling at scale, by section: how long the catalogue takes to parse a DAG folder.

    python -m benchmarks.schedules                       # every section built: parse
    python -m benchmarks.schedules --sections parse --files 1000
    slotless bench schedules --files 5000

Sections (``--sections``, comma-separated; each writes its own keys):

* ``parse`` - ``--files`` DAG files (each a chain of 3 to 5 tasks on a cron schedule) in a
  fresh folder, catalogued into a fresh SQLite store by :func:`executor.catalogue.scan`:
  cold (every file parsed), warm (nothing changed: no file parsed), then after
  ``--changed`` files are touched (exactly those parsed again). Keys ``parse_files``,
  ``parse_cold_s``, ``parse_warm_s``, ``parse_changed_s``, ``parse_changed_files``.

Results: benchmarks/results/schedules.json and schedules.png. The JSON is merged key by key
with the one already there, so a run of one section keeps the figures of the others; the
head (machine, versions, commit) is the latest run's, and ``runs`` says when and by which
command each section's figures were made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import common

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
        dags = len(await store.catalogue_dags())
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
    p.add_argument("--workdir", help="where DAG files and the database go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--results", type=Path, default=common.RESULTS)
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown or not args.sections:
        p.error(
            f"unknown section(s) {', '.join(unknown) or '(none)'}; built: {', '.join(SECTIONS)}"
        )
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


def plot(doc: dict[str, Any], results: Path) -> Path:
    drawn = [s for s in SECTIONS.values() if s.first_key in doc]
    fig, axes = common.subplots(len(drawn))
    for section, ax in zip(drawn, axes if len(drawn) > 1 else [axes], strict=True):
        section.plot(ax, doc)
    fig.suptitle(f"slotless scheduling ({common.machine_caption(doc['machine'])})")
    return common.save_figure(fig, NAME, results)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    figures: dict[str, Any] = {}
    with common.workdir(args.workdir, args.keep) as workdir, common.MachineLoad() as load:
        head = common.result_document(NAME, argv, {}, workdir)
        for name in args.sections:
            figures[name] = SECTIONS[name].run(args, workdir)
    runs = {
        name: {"date": head["date"], "command": head["command"], "machine_load": load.summary}
        for name in args.sections
    }
    params = {name: SECTIONS[name].params(args) for name in args.sections}
    new = {**head, "params": params, "runs": runs}
    for keys in figures.values():
        new.update(keys)
    doc = merged(args.results / f"{NAME}.json", new)
    png = plot(doc, args.results)
    path = common.write_json(NAME, doc, args.results)
    rows = [
        (k, f"{v:,}" if isinstance(v, int) else f"{v:g}")
        for f in figures.values()
        for k, v in f.items()
    ]
    common.print_table(
        f"schedules: {', '.join(args.sections)}", [*rows, common.load_row(load.summary)]
    )
    common.console.print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
