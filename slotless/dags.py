"""``slotless dags list | pause | unpause``: the DAG catalogue from the shell."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from executor.catalogue import dags_folder, scan
from executor.store import open_store
from executor.store.viewrows import BrokenFile, DagRow

from .options import db_opt, parse_timeout_opt
from .schedule_shown import schedule_shown

out = Console()


def add_commands(sub: Any) -> None:
    dags = sub.add_parser("dags", help="the DAG catalogue: list DAGs and broken files, pause")
    dags_sub = dags.add_subparsers(required=True, metavar="ACTION")
    dags_list = dags_sub.add_parser(
        "list", help="DAGs (paused, schedule, last run) and broken files with their errors"
    )
    db_opt(dags_list)
    dags_list.add_argument(
        "--dags",
        metavar="DIR",
        help="parse this folder's changed DAG files first (default: $SLOTLESS_DAGS, if set)",
    )
    parse_timeout_opt(dags_list)
    dags_list.add_argument("--json", action="store_true", help="print one JSON object")
    dags_list.set_defaults(func=cmd_dags_list)
    for action, paused in (("pause", True), ("unpause", False)):
        sp = dags_sub.add_parser(action, help=f"{action} a DAG (its runs are not touched)")
        sp.add_argument("dag_id", metavar="DAG")
        db_opt(sp)
        sp.set_defaults(func=cmd_dags_pause, paused=paused)


async def cmd_dags_list(args: argparse.Namespace) -> int:
    folder = dags_folder(args.dags)
    # Without a folder to parse this only reads: a mistyped --db must not leave a new file.
    store = await open_store(args.db, create=folder is not None)
    try:
        if folder is not None:
            await scan(store, folder, timeout=args.parse_timeout, by_hand=True)
        dags = DagRow.all(await store.catalogue.catalogue_dags())
        broken = BrokenFile.all(await store.catalogue.broken_files())
    finally:
        await store.close()
    if args.json:
        print(
            json.dumps(
                {
                    "dags": [
                        {k: getattr(d, k) for k in _DAG_FIELDS}
                        | {"paused": bool(d.paused), **asdict(schedule_shown(d))}
                        for d in dags
                    ],
                    "broken_files": [{"file": b.path, "error": b.parse_error} for b in broken],
                }
            )
        )
        return 0
    table = Table(title=f"{len(dags)} DAGs")
    for col in ("dag", "file", "paused", "schedule", "next run", "last run"):
        table.add_column(col, overflow="fold")
    for d in dags:
        last = d.last_run_state or "-"
        if d.parse_error:
            last += " (file broken, see below)"
        if d.start_error:
            last += f"; cannot start: {d.start_error}"
        shown = schedule_shown(d)
        starts = shown.schedule_words or "-"
        if d.waiting_for:
            starts += f"; when {d.waiting_for}"
        table.add_row(
            d.dag_id,
            d.file,
            "yes" if d.paused else "no",
            starts,
            shown.next_run or "-",
            last,
        )
    out.print(table)
    if broken:
        errors = Table(title=f"{len(broken)} broken DAG files")
        errors.add_column("file")
        errors.add_column("error", overflow="fold")
        for b in broken:
            errors.add_row(b.path, b.parse_error)
        out.print(errors)
    return 0


_DAG_FIELDS = (
    "dag_id", "file", "schedule", "timezone", "next_logical_date", "parse_error", "last_run_state",
    "waiting_for", "start_error",
)  # fmt: skip


async def cmd_dags_pause(args: argparse.Namespace) -> int:
    store = await open_store(args.db, create=False)
    try:
        await store.catalogue.set_paused(args.dag_id, args.paused)
    finally:
        await store.close()
    print(f"{args.dag_id}: {'paused' if args.paused else 'unpaused'}")
    return 0
