"""``slotless airflow-triggerer``: serve an Airflow 3 deployment's deferred tasks in place of
``airflow triggerer`` (docs/airflow-triggerer.md). Airflow is imported only when the
command runs, and only in an environment that has it."""

from __future__ import annotations

import argparse
from typing import Any

from .options import metrics_opts


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "airflow-triggerer",
        help="serve an Airflow 3 deployment's triggers in place of `airflow triggerer`",
        description=(
            "Run beside Airflow's scheduler, in the deployment's environment (Airflow reads "
            "its own configuration: AIRFLOW_HOME, AIRFLOW__DATABASE__SQL_ALCHEMY_CONN, the "
            "Fernet key). Stop `airflow triggerer` first or let both run: they share the "
            "trigger table as Airflow's triggerers do."
        ),
    )
    p.add_argument(
        "--capacity",
        type=int,
        default=100_000,
        help="most trigger rows this process holds (Airflow's own triggerer: 1,000)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between assignment cycles against Airflow's database (default 1)",
    )
    p.add_argument(
        "--queues",
        default=None,
        help=(
            "comma-separated trigger queues to serve, as `airflow triggerer --queues` "
            "(needs [triggerer] queues_enabled); without it, rows with no queue"
        ),
    )
    metrics_opts(p)
    p.set_defaults(func=_airflow_triggerer)


async def _airflow_triggerer(args: argparse.Namespace) -> int:
    if args.capacity <= 0 or args.interval <= 0:
        raise ValueError("--capacity and --interval must be positive")
    queues = {q.strip() for q in args.queues.split(",") if q.strip()} if args.queues else None
    if args.queues is not None and not queues:
        raise ValueError("--queues names no queue: give one or more, comma-separated")
    from triggerer.airflow.service import serve

    return await serve(
        capacity=args.capacity,
        interval=args.interval,
        queues=queues,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
    )
