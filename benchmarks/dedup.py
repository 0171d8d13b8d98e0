"""De-duplication and batching: checks and S3 requests per cycle, 40% duplicate sensors.

    python -m benchmarks.dedup                     # 2,000 sensors, 40% duplicates
    slotless bench dedup --sensors 10000 --interval 30

The workload of seed 002: ``--sensors`` S3 sensors of which ``--duplicates`` (40%) wait
for the same key as another one, over ``--prefixes`` prefixes of one bucket on moto's
S3 server (its own process, on 127.0.0.1, counting requests). The waits are DEFERRED
rows served by one real Triggerer; after a first cycle, whole cycles are counted:

* dedup off           - each wait carries a distinct salt in its poke context, so equal
                        keys hash apart; checked one key per request (no batching), though
                        equal keys checked at the same moment still share one in-flight
                        listing inside S3KeyTrigger (its SingleFlight);
* dedup on            - equal keys share one check; one request per distinct key;
* dedup on + batching - the built-in S3KeyTrigger: one listing per prefix per cycle.

Results: benchmarks/results/dedup.json and dedup.png.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from triggers.base import BaseTrigger
from triggers.registry import register
from triggers.s3 import S3KeyTrigger

from . import calibration, common
from .capacity import insert_waits

NAME = "dedup"
CONN_ID = "bench_s3"
BUCKET = "dedup-bench"


@register
class UnbatchedS3KeyTrigger(S3KeyTrigger):
    """S3KeyTrigger checked one key at a time (one request per check): no batching."""

    # The base's own classmethod object (is_batched compares it): a class attribute, no field.
    poke_many: ClassVar[Any] = BaseTrigger.__dict__["poke_many"]


@register
class SaltedS3KeyTrigger(UnbatchedS3KeyTrigger):
    """A distinct ``salt`` per wait puts it in the poke context: equal keys hash apart."""

    salt: str = ""


CONFIGS = {
    "off": ("dedup off", SaltedS3KeyTrigger),
    "on": ("dedup on", UnbatchedS3KeyTrigger),
    "on_batched": ("dedup on + batching", S3KeyTrigger),
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="slotless bench dedup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sensors", type=int, default=2000, help="waits (2,000)")
    p.add_argument("--duplicates", type=float, default=0.4, help="share of duplicates (0.4)")
    p.add_argument("--prefixes", type=int, default=10, help="prefixes the keys spread over")
    p.add_argument("--interval", type=float, default=15.0, help="check interval (15 s)")
    p.add_argument("--cycles", type=int, default=3, help="whole cycles counted per config")
    p.add_argument("--seed", type=int, default=2)
    p.add_argument("--results", type=Path, default=common.RESULTS)
    calibration.add_repeats_argument(p)
    return p.parse_args(argv)


def workload(args: argparse.Namespace) -> list[str]:
    """One key per sensor; ``duplicates`` of them repeat another sensor's key."""
    dups = round(args.sensors * args.duplicates)
    distinct = args.sensors - dups
    if dups > distinct:
        raise SystemExit("--duplicates above 0.5: a duplicate must copy a distinct key")
    keys = [f"landing/p{i % args.prefixes:02d}/file-{i:06d}.csv" for i in range(distinct)]
    rng = random.Random(args.seed)
    out = keys + [keys[i] for i in rng.sample(range(distinct), dups)]
    rng.shuffle(out)
    return out


async def run_config(
    name: str, cls: type[S3KeyTrigger], keys: list[str], args: argparse.Namespace, moto: Any
) -> dict[str, Any]:
    from executor.store import open_store
    from triggerer.service import Triggerer

    def make(i: int, key: str) -> BaseTrigger:
        fields: dict[str, Any] = {
            "bucket": BUCKET,
            "key": key,
            "conn_id": CONN_ID,
            "poke_interval": args.interval,
        }
        if cls is SaltedS3KeyTrigger:
            fields["salt"] = f"w{i}"
        return cls(**fields)

    with tempfile.TemporaryDirectory(prefix="slotless-dedup-") as tmp:
        db = Path(tmp) / "dedup.db"
        store = await open_store(f"sqlite:///{db}")  # creates the schema
        insert_waits(db, [make(i, k) for i, k in enumerate(keys)], run_id="dedup", prefix="s")
        triggerer = Triggerer(store.views)
        runner = asyncio.create_task(triggerer.run())
        try:
            while triggerer.table.subscriptions < len(keys):
                await asyncio.sleep(0.05)
            distinct = len(triggerer.table)
            while triggerer.checks_done < distinct:  # the first cycle, at load
                await asyncio.sleep(0.05)
            # Count from half an interval past a grid instant: checks fall due on the grid.
            iv = args.interval
            await asyncio.sleep((int(time.time() / iv) + 1) * iv + iv / 2 - time.time())
            moto.reset()
            checks0, cpu0, srv0 = triggerer.checks_done, time.process_time(), moto.cpu()
            await asyncio.sleep(args.cycles * iv)
            checks = triggerer.checks_done - checks0
            cpu, srv = time.process_time() - cpu0, moto.cpu() - srv0
            requests = moto.counts()
        finally:
            triggerer.stop()
            await runner
            await store.close()
    n = args.cycles
    total = sum(requests.values())
    return {
        "label": CONFIGS[name][0],
        "trigger_class": cls.classpath(),
        "sensors": len(keys),
        "distinct_checks": distinct,
        "checks_per_cycle": round(checks / n, 2),
        "s3_requests_per_cycle": round(total / n, 2),
        "s3_requests_by_operation": {k: round(v / n, 2) for k, v in requests.items()},
        "triggerer_cpu_s_per_cycle": round(cpu / n, 4),
        "server_cpu_s_per_cycle": round(srv / n, 4),
        "checks_failed": triggerer.checks_failed,
        "cycles": n,
    }


async def main_async(args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    from triggers.checking import CheckContext
    from triggers.s3 import _link

    from .batching import MotoProcess, s3_conn_uri

    keys = workload(args)
    out: dict[str, Any] = {}
    task = bar.add_task("configurations", total=len(CONFIGS))
    with MotoProcess() as moto:
        os.environ["SLOTLESS_CONN_" + CONN_ID.upper()] = s3_conn_uri(moto.endpoint)
        setup = CheckContext()
        try:
            await (await _link(setup, CONN_ID)).client.create_bucket(Bucket=BUCKET)
        finally:
            await setup.aclose()
        for name, (label, cls) in CONFIGS.items():
            bar.update(task, description=label)
            out[name] = await run_config(name, cls, keys, args, moto)
            bar.advance(task)
    return out


def plot(doc: dict[str, Any], results: Path) -> Path:
    fig, (ax_checks, ax_req) = common.subplots(2)
    configs = doc["configs"]
    labels = [c["label"] for c in configs.values()]
    colors = ["tab:red", "tab:orange", "tab:green"]
    sensors = doc["params"]["sensors"]
    for ax, key, title in (
        (ax_checks, "checks_per_cycle", "checks per cycle"),
        (ax_req, "s3_requests_per_cycle", "S3 requests per cycle (log scale)"),
    ):
        values = [c[key] for c in configs.values()]
        bars = ax.bar(labels, values, color=colors[: len(values)])
        for b, v in zip(bars, values, strict=True):
            ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom")
        ax.axhline(sensors, color="grey", ls=":", lw=1, label=f"{sensors:,} sensors")
        ax.set(title=title)
        ax.legend()
    ax_req.set_yscale("log")
    ax_req.axhline(sensors / 100, color="red", ls="--", lw=1, label="1% of one per sensor")
    ax_req.legend()
    p = doc["params"]
    fig.suptitle(
        f"{sensors:,} S3 sensors, {p['duplicates']:.0%} duplicates, {p['prefixes']} prefixes "
        f"(moto server on 127.0.0.1)\n{calibration.caption(doc)}",
        fontsize=9,
    )
    return common.save_figure(fig, NAME, results)


def headline(configs: dict[str, Any]) -> dict[str, float | None]:
    """One run's headline figures: checks and S3 requests per cycle of each configuration."""
    out: dict[str, float | None] = {}
    for name, c in configs.items():
        out[f"checks_per_cycle_{name}"] = c["checks_per_cycle"]
        out[f"s3_requests_per_cycle_{name}"] = c["s3_requests_per_cycle"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    params = {
        "sensors": args.sensors,
        "duplicates": args.duplicates,
        "prefixes": args.prefixes,
        "interval": args.interval,
        "cycles": args.cycles,
        "seed": args.seed,
        "store": "sqlite",
        "s3_server": "moto (its own process, 127.0.0.1)",
    }
    with calibration.Recording(Path(tempfile.gettempdir())) as rec:
        doc = common.result_document(NAME, argv, params, Path(tempfile.gettempdir()))
        doc["command"] = "slotless bench dedup" + "".join(f" {a}" for a in argv)
        with common.progress() as bar:
            runs = rec.repeat(args.repeats, lambda i: asyncio.run(main_async(args, bar)), headline)
    configs = runs[rec.kept("s3_requests_per_cycle_on_batched")]
    doc["machine_load"] = rec.load
    doc.update(rec.fields())
    doc["configs"] = configs
    off, on, batched = configs["off"], configs["on"], configs["on_batched"]
    doc["summary"] = {
        "distinct_conditions": on["distinct_checks"],
        "checks_cut_by_dedup": round(1 - on["checks_per_cycle"] / off["checks_per_cycle"], 4),
        "target_checks_cut": args.duplicates,
        "checks_per_cycle_equal_distinct": on["checks_per_cycle"] == on["distinct_checks"]
        and batched["checks_per_cycle"] == batched["distinct_checks"],
        "batched_requests_over_one_per_sensor": round(
            batched["s3_requests_per_cycle"] / args.sensors, 6
        ),
        "target_requests_under_1_percent": batched["s3_requests_per_cycle"] < args.sensors / 100,
        "dedup_off_requests_shared_in_flight": round(
            off["checks_per_cycle"] - off["s3_requests_per_cycle"], 2
        ),
    }
    png = plot(doc, args.results)
    path = common.write_json(NAME, doc, args.results)
    _table(doc)
    common.console.print(f"wrote {path} and {png}")
    return 0


def _table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    p = doc["params"]
    t = Table(
        title=f"{p['sensors']:,} S3 sensors, {p['duplicates']:.0%} duplicates, "
        f"{p['prefixes']} prefixes, checked every {p['interval']:g} s"
    )
    for col in (
        "configuration",
        "distinct checks",
        "checks/cycle",
        "S3 requests/cycle",
        "CPU/cycle",
    ):
        t.add_column(col, justify="right")
    for c in doc["configs"].values():
        t.add_row(
            c["label"],
            f"{c['distinct_checks']:,}",
            f"{c['checks_per_cycle']:,.0f}",
            f"{c['s3_requests_per_cycle']:,.0f}",
            f"{1000 * c['triggerer_cpu_s_per_cycle']:.0f} ms",
        )
    console = Console()
    console.print(t)
    s = doc["summary"]
    console.print(
        f"dedup cuts checks per cycle by {100 * s['checks_cut_by_dedup']:.1f}% "
        f"(target {100 * s['target_checks_cut']:.0f}%); batching: "
        f"{100 * s['batched_requests_over_one_per_sensor']:.2f}% of one request per sensor "
        f"(target < 1%: {s['target_requests_under_1_percent']})"
    )
    for name, value in calibration.repeat_rows(doc["repeats"]):
        console.print(f"{name}: {value}")
    console.print(" ".join(calibration.calibration_row(doc["calibration"])))
    console.print(f"machine: {common.load_row(doc['machine_load'])[1]}")


if __name__ == "__main__":
    sys.exit(main())
