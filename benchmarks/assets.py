"""One asset event and the runs it starts, as the DAGs scheduled on assets grow.

    python -m benchmarks.assets                      # 10,000 DAGs on 1,000 assets, sizes to 100,000
    python -m benchmarks.assets --dags 1000 --sizes 1000 --events 50     # a quick look

On each of ``--backends`` (SQLite, then PostgreSQL: a fresh schema on ``--pg``, dropped
after), in a fresh store, DAGs scheduled on ``--assets`` assets are catalogued in this
process (``record_parse`` with what :func:`executor.catalogue._declared` stores: the rows a
scan writes, without its forkserver), growing to each of ``--sizes``. Half the DAGs are
scheduled on one asset (``schedule=[a]``: every event of it starts one run of each), half on
two (``a & b``: every other event completes them); DAG i's assets are ``i mod M`` and
``(7i + 1) mod M``, so each asset has about ``1.5 * DAGs / M`` consumers, and an event starts
more runs as the DAGs grow. Beside them, from the start, 50 probe assets with 10 consumers each
(``schedule=[p]``; 500 DAGs, not counted in the sizes): an event on one starts 10 runs at
every size, so its cost shows what the DAGs held elsewhere cost an event (target: flat). At
each size, ``--events`` events are sent one by one through the store (``Assets.send_event``,
what the CLI and the API call), each on the next asset in turn, then as many on the probes,
and each is timed from the call to its commit: the event, its queue rows for every consumer,
each consumer's condition and the runs it starts are that one transaction, so its end is
when the runs are visible to a worker (``event_to_runs``). The figures at ``--dags`` are the
headline keys ``event_to_runs_p50_s`` / ``_p99_s`` (target p99 < 100 ms); ``sizes`` holds
each size's figures, ``runs_per_event`` and the probe's (``probe_*``).

Results: benchmarks/results/assets.json (SQLite's figures as the headline keys, each
backend's under its name) and assets.png.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import calibration, common

NAME = "assets"
PER_FILE = 500  # DAGs per catalogued file (the catalogue stores them file by file)
# The probe: assets with a fixed number of consumers whatever the size, so that the cost of
# an event that starts the same runs can be read apart from how many runs an event starts.
PROBES = 50
PROBE_CONSUMERS = 10


def _dags(first: int, last: int, assets: int) -> list[Any]:
    from executor import DAG, Asset

    out = []
    for i in range(first, last):
        a = Asset(f"s3://bench/asset-{i % assets}")
        if i % 2:
            dag = DAG(f"consumer_{i:06d}", schedule=[a])
        else:
            b = Asset(f"s3://bench/asset-{(7 * i + 1) % assets}")
            dag = DAG(f"consumer_{i:06d}", schedule=[a] if a == b else a & b)

        @dag.task(task_id="work")
        def work(ctx: Any) -> int:
            return 1

        out.append(dag)
    return out


def _probe_dags() -> list[Any]:
    """``PROBE_CONSUMERS`` DAGs on each probe asset (``schedule=[p]``: an event starts each)."""
    from executor import DAG, Asset

    out = []
    for j in range(PROBES):
        p = Asset(f"s3://bench/probe-{j}")
        for k in range(PROBE_CONSUMERS):
            dag = DAG(f"probe_{j:03d}_{k:03d}", schedule=[p])

            @dag.task(task_id="work")
            def work(ctx: Any) -> int:
                return 1

            out.append(dag)
    return out


async def _catalogue(store: Any, path: Path, dags: list[Any]) -> None:
    """Catalogue ``dags`` as :func:`executor.catalogue.scan` stores a file declaring them."""
    from executor.catalogue import _declared
    from executor.store.catalogue import DeclaredDag

    path.write_text("# catalogued by benchmarks/assets.py, never imported\n")
    declared = [DeclaredDag(**_declared(d, d.dag_id)) for d in dags]  # type: ignore[arg-type]
    error = await store.catalogue.record_parse(str(path), path.stat().st_mtime, declared, None)
    if error is not None:
        raise RuntimeError(f"{path}: {error}")


async def _grow(store: Any, folder: Path, have: int, want: int, assets: int) -> None:
    """Catalogue DAGs ``have`` to ``want``, ``PER_FILE`` to a file."""
    for start in range(have, want, PER_FILE):
        dags = _dags(start, min(want, start + PER_FILE), assets)
        await _catalogue(store, folder / f"consumers_{start:06d}.py", dags)


async def _measure(store: Any, uris: Sequence[str]) -> dict[str, Any]:
    """One event on each of ``uris`` in turn, each timed from the call to its commit."""
    costs: list[float] = []
    runs = 0
    events = len(uris)
    for uri in uris:
        began = time.perf_counter()
        rec = await store.assets.send_event(uri, None, source="api")
        costs.append(time.perf_counter() - began)
        runs += len(rec.runs)
    costs.sort()
    return {
        "events": events,
        "event_to_runs_p50_s": common.percentile(costs, 50),
        "event_to_runs_p99_s": common.percentile(costs, 99),
        "event_to_runs_max_s": costs[-1],
        "runs_per_event": runs / events,
    }


async def run_once(args: argparse.Namespace, folder: Path, i: int, backend: str) -> dict[str, Any]:
    from executor.store import open_store

    sizes = sorted({*args.sizes, args.dags})
    url = common.fresh_db(folder, f"assets{i}")
    schema = None
    if backend == "postgresql":
        from .postgres import Schema

        # A fresh schema on the shared server, dropped in ``finally`` below.
        schema = Schema(args.pg)
        url = (await schema.__aenter__()).url
    store = await open_store(url)
    out: dict[str, Any] = {"sizes": {}}
    try:
        await _catalogue(store, folder / f"{backend}{i}" / "probes.py", _probe_dags())
        have = 0
        for n in sizes:
            began = time.perf_counter()
            await _grow(store, folder / f"{backend}{i}", have, n, args.assets)
            common.console.print(
                f"{backend}: {n:,} DAGs catalogued ({time.perf_counter() - began:.1f} s)"
            )
            have = n
            main = [f"s3://bench/asset-{(n + k) % args.assets}" for k in range(args.events)]
            probes = [f"s3://bench/probe-{k % PROBES}" for k in range(args.events)]
            figures = await _measure(store, main)
            probe = await _measure(store, probes)
            figures.update({f"probe_{k}": v for k, v in probe.items() if k != "events"})
            out["sizes"][str(n)] = figures
            common.console.print(
                f"  one event: p50 {figures['event_to_runs_p50_s'] * 1000:.1f} ms, "
                f"p99 {figures['event_to_runs_p99_s'] * 1000:.1f} ms, "
                f"{figures['runs_per_event']:.1f} runs each; a probe's event "
                f"({PROBE_CONSUMERS} runs): p50 {probe['event_to_runs_p50_s'] * 1000:.1f} ms, "
                f"p99 {probe['event_to_runs_p99_s'] * 1000:.1f} ms"
            )
    finally:
        await store.close()
        if schema is not None:
            await schema.__aexit__(None, None, None)
    head = out["sizes"][str(args.dags)]
    return {
        "dags": args.dags,
        "assets": args.assets,
        "probe_dags": PROBES * PROBE_CONSUMERS,
        "event_to_runs_p50_s": head["event_to_runs_p50_s"],
        "event_to_runs_p99_s": head["event_to_runs_p99_s"],
        **out,
    }


def run_backends(args: argparse.Namespace, folder: Path, i: int) -> dict[str, Any]:
    """One repeat: every backend in turn, each in its own fresh database."""
    out = {}
    for backend in args.backends:
        (folder / f"{backend}{i}").mkdir(parents=True, exist_ok=True)
        out[backend] = asyncio.run(run_once(args, folder, i, backend))
    return out


def headline(run: dict[str, Any]) -> dict[str, float | None]:
    """One repeat's headline figures, per backend."""
    return {
        f"{backend}_{key}": figures[key]
        for backend, figures in run.items()
        for key in ("event_to_runs_p50_s", "event_to_runs_p99_s")
    }


def plot(doc: dict[str, Any], backends: Sequence[str], results: Path) -> None:
    fig, (cost, flat, runs) = common.subplots(3, width=4.6)
    for b in backends:
        sizes = doc[b]["sizes"]
        xs = [int(s) for s in sizes]
        cost.plot(xs, [sizes[s]["event_to_runs_p50_s"] * 1000 for s in sizes], marker="o",
                  label=f"{b} p50")  # fmt: skip
        cost.plot(xs, [sizes[s]["event_to_runs_p99_s"] * 1000 for s in sizes], marker="x",
                  ls="--", label=f"{b} p99")  # fmt: skip
        flat.plot(xs, [sizes[s]["probe_event_to_runs_p50_s"] * 1000 for s in sizes], marker="o",
                  label=f"{b} p50")  # fmt: skip
        flat.plot(xs, [sizes[s]["probe_event_to_runs_p99_s"] * 1000 for s in sizes], marker="x",
                  ls="--", label=f"{b} p99")  # fmt: skip
        runs.plot(xs, [sizes[s]["runs_per_event"] for s in sizes], marker="o", label=b)
    for ax in (cost, flat):
        ax.axhline(100, color="red", ls="--", lw=1, label="target p99 100 ms")
    cost.set(xscale="log", xlabel="DAGs scheduled on assets", ylabel="ms",
             title=f"one event -> its runs created ({doc['assets']:,} assets)")  # fmt: skip
    flat.set(xscale="log", xlabel="DAGs scheduled on assets", ylabel="ms",
             title=f"an event starting {PROBE_CONSUMERS} runs (probe)")  # fmt: skip
    runs.set(xscale="log", xlabel="DAGs scheduled on assets", ylabel="runs",
             title="runs started per event")  # fmt: skip
    for ax in (cost, flat, runs):
        ax.legend(fontsize=7)
    fig.suptitle(calibration.caption(doc), fontsize=8)
    common.save_figure(fig, NAME, results)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    from .postgres import DEFAULT_DSN

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.assets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dags", type=int, default=10_000, help="the headline size (default 10,000)")
    p.add_argument("--assets", type=int, default=1_000, help="assets (default 1,000)")
    p.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",") if x], default=[1_000, 100_000],
        help="other sizes measured on the way (default 1000,100000; --dags is added)",
    )  # fmt: skip
    p.add_argument("--events", type=int, default=500, help="events timed per size")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--backends", type=lambda s: [x for x in s.split(",") if x],
        default=["sqlite", "postgresql"],
        help="sqlite, postgresql or both (default both, SQLite's figures are the headline keys)",
    )  # fmt: skip
    p.add_argument(
        "--pg", default=os.environ.get("SLOTLESS_TEST_PG_DSN") or DEFAULT_DSN,
        help=f"PostgreSQL server and database, a fresh schema is made in it and dropped after "
             f"(default $SLOTLESS_TEST_PG_DSN or {DEFAULT_DSN})",
    )  # fmt: skip
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--results", type=Path, default=common.RESULTS)
    args = p.parse_args(list(argv))
    unknown = [b for b in args.backends if b not in ("sqlite", "postgresql")]
    if unknown or not args.backends:
        p.error(f"--backends {','.join(unknown)}: say sqlite, postgresql or sqlite,postgresql")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    with common.workdir(args.workdir, args.keep) as workdir, calibration.Recording(workdir) as rec:
        head = common.result_document(NAME, argv, {k: str(v) for k, v in vars(args).items()},
                                      workdir)  # fmt: skip
        every = rec.repeat(args.repeats, lambda i: run_backends(args, workdir, i), headline)
    first = args.backends[0]
    kept = every[rec.kept(f"{first}_event_to_runs_p99_s")]
    doc = {
        **head,
        "note": (
            "measured on a shared 2-core machine (two other helpers' builds and tests ran "
            "meanwhile): see load; the figures are an upper bound of what the code costs"
        ),
        "backends": list(args.backends),
        "backend": first,
        "dags": args.dags,
        "assets": args.assets,
        "probe_dags": PROBES * PROBE_CONSUMERS,
        "event_to_runs_p50_s": kept[first]["event_to_runs_p50_s"],
        "event_to_runs_p99_s": kept[first]["event_to_runs_p99_s"],
        "sizes": kept[first]["sizes"],
        **kept,
        **rec.fields(),
    }
    path = common.write_json(NAME, doc, args.results)
    plot(doc, args.backends, args.results)
    rows = [
        (f"{b}, {n} DAGs: one event p50 / p99 (ms); a probe's",
         f"{s['event_to_runs_p50_s'] * 1000:.1f} / {s['event_to_runs_p99_s'] * 1000:.1f} "
         f"({s['runs_per_event']:.1f} runs each); "
         f"{s['probe_event_to_runs_p50_s'] * 1000:.1f} / "
         f"{s['probe_event_to_runs_p99_s'] * 1000:.1f}")
        for b in args.backends
        for n, s in kept[b]["sizes"].items()
    ]  # fmt: skip
    common.print_table(
        f"assets: {args.dags:,} DAGs on {args.assets:,} assets",
        [
            *rows,
            *calibration.repeat_rows(doc["repeats"]),
            calibration.calibration_row(doc["calibration"]),
            common.load_row(rec.load),
        ],
    )
    common.console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
