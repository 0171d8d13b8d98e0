"""Dynamic fan-out into one fan-in: N mapped no-op children on SQLite, end to end.

    python -m benchmarks.fanout [--children 100000] [--slots 8]

The DAG: ``source`` returns ``list(range(N))``; ``child`` expands over it (one instance per
item, returning its item); ``total`` (trigger rule all_done) sums ``ctx.inputs["child"]``.
It runs the way ``slotless run FILE --slots 8 --json`` does (``slotless.cli.main`` in this
process, on a fresh SQLite file). Measured:

- materialize_s: the worker transaction in which ``source`` succeeds, which inserts the N
  child rows (``Exchange.exchange``, timed around the call);
- total_s: the whole ``slotless run`` call, DAG import to summary; tasks/s = (N + 2) / total_s;
- peak_rss_mb: the process's resident memory, sampled every 50 ms (psutil) and checked
  against the kernel's high-water mark (getrusage).

Targets: 100,000 children created in under 5 s, the whole run under 60 s.
Writes benchmarks/results/fanout.json and fanout.png.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from . import calibration, common

NAME = "fanout"
P = TypeVar("P")  # a point of a series, as _thin keeps it
TARGET_MATERIALIZE_S = 5.0
TARGET_TOTAL_S = 60.0

DAG_SOURCE = '''"""Benchmark DAG: one source, {n} mapped children, one all_done fan-in."""
from executor import DAG

N = {n}
dag = DAG("bench_fanout_{n}")


@dag.task
def source(ctx):
    return list(range(N))


@dag.task(expand=source, map_cap=N)  # the default cap (50,000) is below the benchmark's N
def child(ctx):
    return ctx.item


@dag.task(parents=[child], trigger_rule="all_done")
def total(ctx):
    return sum(ctx.inputs["child"])
'''


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--children", type=int, default=100_000, help="fan-out width (default 100000)")
    p.add_argument("--slots", type=int, default=8, help="worker slots (default 8)")
    p.add_argument(
        "--cpus", help='pin to these CPUs, e.g. "0" (default: no pinning; for diagnosis)'
    )
    p.add_argument("--workdir", help="where the DAG file and database go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--results", type=Path, default=common.RESULTS, help="output folder")
    calibration.add_repeats_argument(p)
    return p.parse_args(argv)


def run(folder: Path, n: int, slots: int) -> dict[str, Any]:
    import slotless.cli  # noqa: F401  (imported before the baseline RSS sample)

    folder.mkdir(parents=True, exist_ok=True)

    dag_file = common.write_dag_file(folder, f"fanout_{n}", DAG_SOURCE.format(n=n))
    db = common.fresh_db(folder, f"fanout_{n}")
    log = common.ExchangeLog()
    with common.progress() as bar:
        task = bar.add_task(f"fan-out of {n:,}: tasks done", total=n + 2)
        with (
            common.RssSampler() as rss,
            log.active(),
            common.follow(bar, task, lambda: log.completed),
        ):
            cli_run = common.run_cli(
                ["run", str(dag_file), "--db", db, "--slots", str(slots), "--json"]
            )
    facts = _facts(db.removeprefix("sqlite:///"))
    expected_sum = n * (n - 1) // 2
    if (
        cli_run.returncode != 0
        or facts["children"] != n
        or facts["fan_in_output"] != expected_sum
        or facts["children_succeeded"] != n
    ):
        raise SystemExit(f"benchmark run did not succeed: rc {cli_run.returncode}, {facts}")

    source_tx = next(e for e in log.exchanges if facts["source_row"] in e.row_ids)
    t0 = rss.t0
    done, series = 0, []
    for e in log.exchanges:
        if e.outcomes:
            done += e.outcomes
            series.append((round(e.ended - t0, 4), done))
    return {
        "children": facts["children"],
        "materialize_s": round(source_tx.seconds, 4),
        "total_s": round(cli_run.seconds, 3),
        "tasks_per_s": round((n + 2) / cli_run.seconds, 1),
        "cpu_s": round(cli_run.cpu_s, 2),
        "cpu_us_per_task": round(cli_run.cpu_s / (n + 2) * 1e6, 1),
        "peak_rss_mb": round(rss.peak_mb, 1),
        "peak_rss_getrusage_mb": round(common.peak_rss_getrusage_mb(), 1),
        "start_rss_mb": round(rss.start_mb, 1),
        "run_s_from_store": round(facts["run_ended_at"] - facts["run_created_at"], 3),
        "children_phase_s": round(facts["children_last_end"] - facts["children_first_start"], 3),
        "children_per_s": round(
            n / (facts["children_last_end"] - facts["children_first_start"]), 1
        ),
        "fan_in_s": round(facts["total_ended_at"] - facts["total_started_at"], 4),
        "fan_in_output": facts["fan_in_output"],
        "create_run_s": round(sum(log.create_run_s), 4),
        "db_mb": round(Path(db.removeprefix("sqlite:///")).stat().st_size / 2**20, 1),
        "materialize_started_at_s": round(source_tx.started - t0, 4),
        "transactions": log.summary(),
        "series": {
            "tasks_done": _thin(series, 400),
            "rss_mb": _thin([(round(t - t0, 3), round(r / 2**20, 1)) for t, r in rss.samples], 400),
        },
    }


def _facts(path: str) -> dict[str, Any]:
    """Read what the run left in the store (read-only, after the run)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        one = conn.execute

        def scalar(sql: str, *args: Any) -> Any:
            return one(sql, args).fetchone()[0]

        run_id, created, ended = one("SELECT run_id, created_at, ended_at FROM dag_run").fetchone()
        source_row = scalar(
            "SELECT id FROM task WHERE run_id = ? AND task_id = 'source' AND map_index = -1",
            run_id,
        )
        total = one(
            "SELECT output, started_at, ended_at FROM task"
            " WHERE run_id = ? AND task_id = 'total' AND map_index = -1",
            (run_id,),
        ).fetchone()
        first_start, last_end, children, succeeded = one(
            "SELECT min(started_at), max(ended_at), count(*), sum(state = 'SUCCESS') FROM task"
            " WHERE run_id = ? AND task_id = 'child' AND map_index >= 0",
            (run_id,),
        ).fetchone()
    finally:
        conn.close()
    return {
        "run_created_at": created,
        "run_ended_at": ended,
        "source_row": source_row,
        "children": children,
        "children_succeeded": succeeded,
        "children_first_start": first_start,
        "children_last_end": last_end,
        "fan_in_output": None if total[0] is None else int(total[0]),
        "total_started_at": total[1],
        "total_ended_at": total[2],
    }


def _thin(points: list[P], at_most: int) -> list[P]:
    if len(points) <= at_most:
        return points
    step = len(points) / at_most
    picked = [points[int(i * step)] for i in range(at_most)]
    return [*picked, points[-1]]


def plot(doc: dict[str, Any], results: Path) -> Path:
    fig, (ax1, ax2) = common.subplots(2)
    done = doc["series"]["tasks_done"]
    ax1.plot([t for t, _ in done], [n for _, n in done], color="#4c72b0")
    start = doc["materialize_started_at_s"]
    ax1.axvspan(
        start,
        start + doc["materialize_s"],
        color="#dd8452",
        alpha=0.4,
        label=f"children created: {doc['materialize_s']:.2f} s",
    )
    ax1.axvline(doc["total_s"], ls="--", color="grey", lw=1)
    ax1.set_xlabel("seconds since the run started")
    ax1.set_ylabel("tasks done")
    ax1.set_title(
        f"{doc['children']:,} children into one fan-in: {doc['total_s']:.1f} s, "
        f"{doc['tasks_per_s']:,.0f} tasks/s"
    )
    ax1.legend(fontsize=8, loc="upper left")

    rss = doc["series"]["rss_mb"]
    ax2.plot([t for t, _ in rss], [m for _, m in rss], color="#55a868")
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("seconds since the run started")
    ax2.set_ylabel("resident memory, MB")
    ax2.set_title(f"Process memory: peak {doc['peak_rss_mb']:.0f} MB")
    fig.suptitle(
        f"SQLite, {doc['params']['slots']} slots; {common.machine_caption(doc['machine'])}",
        fontsize=9,
    )
    return common.save_figure(fig, NAME, results)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    params = {
        "children": args.children,
        "slots": args.slots,
        "cpus": args.cpus,
        "store": "sqlite",
        "map_cap": args.children,
        "fan_in_trigger_rule": "all_done",
    }
    common.pin_cpus(args.cpus)
    with common.workdir(args.workdir, args.keep) as folder, calibration.Recording(folder) as rec:
        doc = common.result_document(NAME, argv, params, folder)
        runs = rec.repeat(
            args.repeats,
            lambda i: run(folder / f"run{i}", args.children, args.slots),
            lambda f: {k: f[k] for k in ("materialize_s", "total_s", "tasks_per_s", "peak_rss_mb")},
        )
    figures = runs[rec.kept("total_s")]
    doc.update(rec.fields())
    doc.update(
        {
            "children": figures.pop("children"),
            "materialize_s": figures.pop("materialize_s"),
            "total_s": figures.pop("total_s"),
            "tasks_per_s": figures.pop("tasks_per_s"),
            "peak_rss_mb": figures.pop("peak_rss_mb"),
            "targets": {"materialize_s": TARGET_MATERIALIZE_S, "total_s": TARGET_TOTAL_S},
            "machine_load": rec.load,
            **figures,
            **rec.medians(),
        }
    )
    json_path = common.write_json(NAME, doc, args.results)
    png_path = plot(doc, args.results)

    def verdict(value: float, target: float) -> str:
        return "[green]met[/green]" if value < target else "[red]missed[/red]"

    n = doc["children"]
    common.print_table(
        f"fan-out: {n:,} children into one all_done fan-in, SQLite, {args.slots} slots",
        [
            (
                f"children created (one transaction; target < {TARGET_MATERIALIZE_S:g} s)",
                f"{doc['materialize_s']:.3f} s  {verdict(doc['materialize_s'], 5.0)}",
            ),
            (
                f"whole run, slotless run end to end (target < {TARGET_TOTAL_S:g} s)",
                f"{doc['total_s']:.2f} s  {verdict(doc['total_s'], TARGET_TOTAL_S)}",
            ),
            ("tasks/s end to end", f"{doc['tasks_per_s']:,.0f}"),
            ("children/s while they ran", f"{doc['children_per_s']:,.0f}"),
            ("fan-in task (reads every output)", f"{doc['fan_in_s']:.3f} s"),
            (
                "peak RSS (start of run)",
                f"{doc['peak_rss_mb']:.0f} MB ({doc['start_rss_mb']:.0f} MB)",
            ),
            (
                "outcomes per transaction / median transaction",
                f"{doc['transactions'].get('outcomes_per_transaction')} / "
                f"{doc['transactions'].get('transaction_ms_median')} ms",
            ),
            ("database file", f"{doc['db_mb']:.0f} MB"),
            common.load_row(doc["machine_load"]),
        ],
        caption=f"wrote {json_path}, {png_path}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
