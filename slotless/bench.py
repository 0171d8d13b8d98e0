"""``slotless bench NAME``: a benchmark of the source checkout (benchmarks/NAME.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    bench = sub.add_parser(
        "bench",
        help="run a benchmark (source checkout): JSON and PNG in benchmarks/results/",
        description="Run benchmarks/NAME.py; options after NAME go to the benchmark "
        "(slotless bench NAME --help lists them).",
    )
    bench.add_argument("name", choices=BENCHES)
    bench.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")
    bench.set_defaults(func=cmd_bench)


# Every runnable benchmark module (benchmarks/common.py, calibration.py and airflow_env.py
# are their helpers).
BENCHES = (
    "slots",
    "capacity",
    "dedup",
    "batching",
    "fanout",
    "throughput",
    "schedules",
    "events",
    "push",
    "idle",
    "postgres",
    "chaos",
    "vs_airflow",
    "assets",
    "web",
)


async def cmd_bench(args: argparse.Namespace) -> int:
    """``python -m benchmarks.NAME OPTIONS`` from the checkout this slotless runs from.

    A process of its own: each benchmark runs its own event loops (and subprocesses), and
    Ctrl-C reaches it directly.
    """
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / f"{args.name}.py").is_file():
        raise FileNotFoundError(
            f"slotless bench needs the source checkout: {root / 'benchmarks'} has no "
            f"{args.name}.py (benchmarks are not part of the installed package)"
        )
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        f"benchmarks.{args.name}",
        *args.options,
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
    )
    return await proc.wait()
