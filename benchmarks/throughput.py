"""Executor throughput: no-op tasks end to end, and the cost of one completion vs fan-in.

    python -m benchmarks.throughput [--chain 1000] [--flat 10000] [--slots 8] [--repeat 3]

1. End to end, the way ``slotless run FILE --slots 8 --json`` does it: a generated DAG file
   of no-op tasks is run by ``slotless.cli.main`` in this process (DAG import, store open,
   run creation, worker pool and triggerer sidecar, summary), timed from call to return;
   once as a chain of ``--chain`` tasks and once as a flat DAG of ``--flat`` independent
   tasks, each ``--repeat`` times on a fresh SQLite file; the headline is the median.
   The same runs are then timed once more through the real ``slotless`` executable in a
   subprocess (interpreter start-up included) unless ``--no-subprocess``.
2. Completion cost vs fan-in: N parents into one child (N in ``--parents``). All parents are
   claimed, then completed one transaction each (``Store.complete``, the worker's
   transaction without the claim), ``--samples`` per N, interleaved across the N; the
   figure is the mean time of one completion. The child's readiness is a counter bumped
   in that transaction, so it must stay flat in N.

Writes benchmarks/results/throughput.json and throughput.png.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from . import calibration, common

NAME = "throughput"
TARGET_TASKS_PER_S = 2000

DAG_SOURCE = '''"""Benchmark DAG: {n} no-op tasks, {shape}."""
from executor import DAG

dag = DAG("bench_{shape}_{n}")


def noop(ctx):
    return None


previous = None
for i in range({n}):
    parents = [previous] if {chain} and previous is not None else []
    previous = dag.task(noop, task_id=f"t{{i:05d}}", parents=parents)
'''


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--chain", type=int, default=1000, help="tasks in the chain (default 1000)")
    p.add_argument("--flat", type=int, default=10_000, help="tasks in the flat DAG (default 10000)")
    p.add_argument("--slots", type=int, default=8, help="worker slots (default 8)")
    p.add_argument(
        "--isolation",
        choices=["thread", "process"],
        default=None,
        help="how each task runs (default: slotless run's own default)",
    )
    p.add_argument("--repeat", type=int, default=3, help="in-process runs per shape (default 3)")
    p.add_argument(
        "--parents",
        default="10,100,1000,10000",
        help="fan-in widths for the completion cost, comma-separated (default 10,100,1000,10000)",
    )
    p.add_argument(
        "--no-subprocess",
        dest="subprocess",
        action="store_false",
        help="skip the runs through the slotless executable",
    )
    p.add_argument(
        "--cpus", help='pin to these CPUs, e.g. "0" (default: no pinning; for diagnosis)'
    )
    p.add_argument("--workdir", help="where DAG files and databases go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--results", type=Path, default=common.RESULTS, help="output folder")
    p.add_argument(
        "--samples",
        type=int,
        default=1000,
        help="timed completions per fan-in width (default 1000)",
    )
    args = p.parse_args(argv)
    args.parents = [int(x) for x in args.parents.split(",") if x.strip()]
    return args


# -- end to end ----------------------------------------------------------------------------


def end_to_end(
    folder: Path,
    shape: str,
    n: int,
    slots: int,
    repeat: int,
    subprocess: bool,
    bar: Any,
    isolation: str | None = None,
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    how = ["--isolation", isolation] if isolation else []
    task = bar.add_task(f"{shape} of {n}: {repeat} run(s)", total=n * repeat)
    for r in range(repeat):
        # A fresh file per run, so that each run imports its DAG as `slotless run` would.
        dag_file = common.write_dag_file(
            folder, f"{shape}_{n}_{r}", DAG_SOURCE.format(n=n, shape=shape, chain=shape == "chain")
        )
        db = common.fresh_db(folder, f"{shape}_{n}_{r}")
        log = common.ExchangeLog()
        done_before = r * n

        def done_so_far(log: common.ExchangeLog = log, before: int = done_before) -> int:
            return before + log.completed

        with log.active(), common.follow(bar, task, done_so_far):
            run = common.run_cli(
                ["run", str(dag_file), "--db", db, "--slots", str(slots), *how, "--json"]
            )
        _check(run, n)
        runs.append(
            {
                "seconds": round(run.seconds, 4),
                "tasks_per_s": round(n / run.seconds, 1),
                "cpu_s": round(run.cpu_s, 3),
                "cpu_us_per_task": round(run.cpu_s / n * 1e6, 1),
                "create_run_s": round(sum(log.create_run_s), 4),
                **log.summary(),
            }
        )
    out: dict[str, Any] = {
        "tasks": n,
        "runs": runs,
        "tasks_per_s_median": round(statistics.median(x["tasks_per_s"] for x in runs), 1),
    }
    if subprocess:
        dag_file = common.write_dag_file(
            folder, f"{shape}_{n}_cli", DAG_SOURCE.format(n=n, shape=shape, chain=shape == "chain")
        )
        db = common.fresh_db(folder, f"{shape}_{n}_cli")
        sub = bar.add_task(f"{shape} of {n}: slotless subprocess", total=1)
        run = common.run_cli_subprocess(
            ["run", str(dag_file), "--db", db, "--slots", str(slots), *how, "--json"]
        )
        bar.update(sub, completed=1)
        _check(run, n)
        out["subprocess"] = {
            "command": " ".join(run.argv),
            "seconds": round(run.seconds, 4),
            "tasks_per_s": round(n / run.seconds, 1),
            "cpu_s": round(run.cpu_s, 3),
        }
    return out


def _check(run: common.CliRun, n: int) -> None:
    tasks = (run.result or {}).get("tasks", {})
    if run.returncode != 0 or (run.result or {}).get("state") != "SUCCESS" or len(tasks) != n:
        raise SystemExit(f"benchmark run did not succeed: {run.argv} -> rc {run.returncode}")


# -- completion cost vs fan-in ---------------------------------------------------------------


async def completion_costs(
    folder: Path, widths: Sequence[int], samples: int, bar: Any
) -> list[dict[str, Any]]:
    """Time one completion (``Store.complete`` of one parent) for each fan-in width.

    Every width has its runs in one store (enough runs of a narrow fan-in to give
    ``samples`` parents), all parents are claimed, then single completions are timed
    round-robin across the widths in shuffled order. Interleaving matters here: how long
    a hand-off to the SQLite thread takes depends on whether the two threads share a CPU,
    which changes every few hundred milliseconds, so timing the widths one after the
    other would compare scheduler moods rather than widths.
    """
    from executor import DAG
    from executor.outcomes import Outcome, Succeeded
    from executor.store import open_store

    def noop(ctx: Any) -> None:
        return None

    store = await open_store(common.fresh_db(folder, "fanin"))
    pending: dict[int, deque[tuple[Outcome, bool]]] = {}
    runs: dict[int, list[str]] = {}
    try:
        for n in widths:
            dag = DAG(f"fanin_{n}")
            parents = [dag.task(noop, task_id=f"p{i:05d}") for i in range(n)]
            dag.task(noop, task_id="child", parents=parents)
            pending[n], runs[n] = deque(), []
            for r in range(-(-samples // n)):
                run_id = await store.runs.create_run(dag, date(2026, 1, 1), run_id=f"fanin_{n}_{r}")
                runs[n].append(run_id)
                rows = await store.exchange.exchange([], "bench", n)  # exactly this run's parents
                assert len(rows) == n and {row.run_id for row in rows} == {run_id}
                for i, row in enumerate(rows):
                    outcome = Succeeded(
                        row_id=row.id,
                        owner="bench",
                        attempt=row.attempt,
                        max_attempts=row.max_attempts,
                        output_json="null",
                        run_id=run_id,
                    )
                    pending[n].append((outcome, i == n - 1))  # the last one readies the child
        total = sum(len(q) for q in pending.values())
        task = bar.add_task(f"fan-in {'/'.join(map(str, widths))}: completions", total=total)
        times: dict[int, list[float]] = {n: [] for n in widths}
        ready: dict[int, list[float]] = {n: [] for n in widths}
        order, rng, done = list(widths), random.Random(0), 0

        async def complete(n: int, sample: bool = True) -> None:
            outcome, readies_child = pending[n].popleft()
            t0 = time.perf_counter()
            await store.exchange.exchange([outcome], "", 0)
            elapsed = time.perf_counter() - t0
            if sample:
                times[n].append(elapsed)
            if readies_child:
                ready[n].append(elapsed)

        for _ in range(samples):
            rng.shuffle(order)
            for n in order:
                await complete(n)
            done += len(order)
            bar.update(task, completed=done)
        for n in widths:  # the rest of the wide fan-ins: in batches, untimed, but the last
            q = pending[n]
            while len(q) > 1:
                batch = [q.popleft()[0] for _ in range(min(1000, len(q) - 1))]
                await store.exchange.exchange(batch, "", 0)
                done += len(batch)
                bar.update(task, completed=done)
            if q:
                await complete(n, sample=False)
                done += 1
        bar.update(task, completed=total)
        for n in widths:
            for run_id in runs[n]:
                child = next(
                    t for t in await store.views.run_tasks(run_id) if t["task_id"] == "child"
                )
                assert child["n_done"] == n and child["ready_at"] is not None, dict(child)
    finally:
        await store.close()
    out = []
    for n in widths:
        ordered = sorted(times[n])
        out.append(
            {
                "parents": n,
                "runs": len(runs[n]),
                "samples": len(ordered),
                "mean_us": round(statistics.fmean(ordered) * 1e6, 1),
                "median_us": round(common.percentile(ordered, 50) * 1e6, 1),
                "p99_us": round(common.percentile(ordered, 99) * 1e6, 1),
                # the completions that made a child ready (the counter reached n)
                "child_ready_us": round(statistics.fmean(ready[n]) * 1e6, 1),
            }
        )
    return out


# -- report --------------------------------------------------------------------------------


def plot(doc: dict[str, Any], results: Path) -> Path:
    fig, (ax1, ax2) = common.subplots(2)
    shapes = [("chain", doc["chain"]), ("flat", doc["flat"])]
    labels = [f"{s}\n{d['tasks']:,} tasks" for s, d in shapes]
    xs = range(len(shapes))
    medians = [d["tasks_per_s_median"] for _, d in shapes]
    lows = [
        m - min(r["tasks_per_s"] for r in d["runs"])
        for m, (_, d) in zip(medians, shapes, strict=True)
    ]
    highs = [
        max(r["tasks_per_s"] for r in d["runs"]) - m
        for m, (_, d) in zip(medians, shapes, strict=True)
    ]
    width = 0.38
    ax1.bar(
        [x - width / 2 for x in xs],
        medians,
        width,
        yerr=[lows, highs],
        capsize=4,
        label="in process (median, min-max)",
        color="#4c72b0",
    )
    if all("subprocess" in d for _, d in shapes):
        sub = [d["subprocess"]["tasks_per_s"] for _, d in shapes]
        ax1.bar(
            [x + width / 2 for x in xs], sub, width, label="slotless subprocess", color="#dd8452"
        )
    ax1.axhline(TARGET_TASKS_PER_S, ls="--", color="grey", lw=1)
    ax1.text(
        0.99,
        TARGET_TASKS_PER_S,
        f"target {TARGET_TASKS_PER_S:,}/s",
        transform=ax1.get_yaxis_transform(),  # x in axes fraction, y in tasks/s
        ha="right",
        va="bottom",
        color="grey",
        fontsize=8,
    )
    ax1.set_xticks(list(xs), labels)
    ax1.set_ylabel("no-op tasks / s, end to end")
    ax1.set_title(f"Throughput, SQLite, {doc['params']['slots']} slots")
    ax1.legend(fontsize=8, loc="upper left")

    fanin = doc["completion_cost"]
    ns = [c["parents"] for c in fanin]
    # (child_ready_us stays in the JSON only: for the wide fan-ins it is a single sample)
    for key, label, style in (
        ("mean_us", "mean", {"marker": "o"}),
        ("median_us", "median", {"marker": "o"}),
        ("p99_us", "p99", {"marker": ".", "ls": "--", "alpha": 0.5}),
    ):
        ax2.plot(ns, [c[key] for c in fanin], label=label, **style)
    ax2.set_xscale("log")
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("parents of one child (fan-in)")
    ax2.set_ylabel("µs per completion transaction")
    ax2.set_title("Cost of one completion vs fan-in")
    ax2.legend(fontsize=8)
    fig.suptitle(calibration.caption(doc), fontsize=9)
    return common.save_figure(fig, NAME, results)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    params = {
        "chain": args.chain,
        "flat": args.flat,
        "slots": args.slots,
        "isolation": args.isolation or "default",
        "cpus": args.cpus,
        "repeat": args.repeat,
        "parents": args.parents,
        "samples": args.samples,
        "subprocess": args.subprocess,
        "store": "sqlite",
        "task": "no-op (returns None)",
    }
    common.pin_cpus(args.cpus)
    with common.workdir(args.workdir, args.keep) as folder, calibration.Recording(folder) as rec:
        doc = common.result_document(NAME, argv, params, folder)
        with common.progress() as bar:
            chain, flat = (
                end_to_end(
                    folder,
                    shape,
                    n,
                    args.slots,
                    args.repeat,
                    args.subprocess,
                    bar,
                    args.isolation,
                )
                for shape, n in (("chain", args.chain), ("flat", args.flat))
            )
            fanin = asyncio.run(completion_costs(folder, args.parents, args.samples, bar))
    for flat_run, chain_run in zip(flat["runs"], chain["runs"], strict=True):
        rec.add(
            {
                "tasks_per_s_flat": flat_run["tasks_per_s"],
                "tasks_per_s_chain": chain_run["tasks_per_s"],
            }
        )
    doc.update(
        {
            "tasks_per_s_flat": flat["tasks_per_s_median"],
            "tasks_per_s_chain": chain["tasks_per_s_median"],
            "completion_cost_us_by_parents": {str(c["parents"]): c["mean_us"] for c in fanin},
            "target_tasks_per_s": TARGET_TASKS_PER_S,
            "machine_load": rec.load,
            **rec.fields(),
            "chain": chain,
            "flat": flat,
            "completion_cost": fanin,
        }
    )
    json_path = common.write_json(NAME, doc, args.results)
    png_path = plot(doc, args.results)

    rows = [
        (
            f"flat, {args.flat:,} tasks: tasks/s (median of {args.repeat})",
            f"{flat['tasks_per_s_median']:,.0f}",
        ),
        (
            f"chain, {args.chain:,} tasks: tasks/s (median of {args.repeat})",
            f"{chain['tasks_per_s_median']:,.0f}",
        ),
    ]
    for shape, d in (("flat", flat), ("chain", chain)):
        if "subprocess" in d:
            rows.append(
                (
                    f"{shape}: tasks/s through the slotless executable",
                    f"{d['subprocess']['tasks_per_s']:,.0f}",
                )
            )
        last = d["runs"][-1]
        rows.append(
            (
                f"{shape}: outcomes per transaction / median transaction",
                f"{last['outcomes_per_transaction']} / {last['transaction_ms_median']} ms",
            )
        )
        cpu = statistics.median(r["cpu_us_per_task"] for r in d["runs"])
        rows.append((f"{shape}: CPU per task, all threads (median)", f"{cpu:,.0f} µs"))
    for c in fanin:
        rows.append(
            (
                f"one completion, {c['parents']:,} parents: mean (median, p99)",
                f"{c['mean_us']:,.0f} µs ({c['median_us']:,.0f}, {c['p99_us']:,.0f})",
            )
        )
    rows += calibration.repeat_rows(doc["repeats"], "{:,.0f}")
    rows.append(calibration.calibration_row(doc["calibration"]))
    rows.append(common.load_row(doc["machine_load"]))
    common.print_table(
        f"throughput: SQLite, {args.slots} slots, {args.isolation or 'default'} isolation",
        rows,
        caption=f"target {TARGET_TASKS_PER_S:,} tasks/s; wrote {_rel(json_path)}, {_rel(png_path)}",
    )
    return 0


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
