"""``slotless pools set|list|delete`` and ``slotless queues add|list|delete``.

Each prints one line (or one JSON object with ``--json``); a refused operation (a bad name,
negative slots, a pool still named by unfinished tasks or, without ``--force``, by
catalogued DAGs, an unknown pool) is one error line and exit status 2, with nothing
changed. The rules are in :mod:`executor.pools`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from executor.store import open_store

from .options import db_opt


def add_commands(sub: Any) -> None:
    """The two commands, on the ``slotless`` parser's subparsers."""
    pools = sub.add_parser("pools", help="pools: how many tasks of a kind run at once")
    pools_sub = pools.add_subparsers(required=True, metavar="ACTION")
    pset = pools_sub.add_parser("set", help="create a pool or change its size")
    pset.add_argument("name", metavar="NAME")
    pset.add_argument("slots", metavar="SLOTS", help="a whole number >= 0")
    plist = pools_sub.add_parser("list", help="every pool: slots, slots in use, tasks ready")
    pdel = pools_sub.add_parser(
        "delete", help="delete a pool no unfinished task and no catalogued DAG names"
    )
    pdel.add_argument("name", metavar="NAME")
    pdel.add_argument(
        "--force", action="store_true", help="delete it though catalogued DAGs name it"
    )
    queues = sub.add_parser("queues", help="queues: which workers run which tasks")
    queues_sub = queues.add_subparsers(required=True, metavar="ACTION")
    qadd = queues_sub.add_parser("add", help="declare a queue (default always exists)")
    qadd.add_argument("name", metavar="NAME")
    qlist = queues_sub.add_parser("list", help="every queue: live workers, slots, tasks ready")
    qdel = queues_sub.add_parser(
        "delete", help="delete a queue no unfinished task and no catalogued DAG names"
    )
    qdel.add_argument("name", metavar="NAME")
    qdel.add_argument(
        "--force", action="store_true", help="delete it though catalogued DAGs name it"
    )
    for action, sp in (
        ("pools set", pset), ("pools list", plist), ("pools delete", pdel),
        ("queues add", qadd), ("queues list", qlist), ("queues delete", qdel),
    ):  # fmt: skip
        sp.add_argument("--json", action="store_true", help="print one JSON object")
        db_opt(sp)
        sp.set_defaults(func=pools_command, action=action)


async def pools_command(args: argparse.Namespace) -> int:
    action: str = args.action
    listing = action.endswith("list")
    store = await open_store(args.db, create=not listing)
    try:
        result: dict[str, Any]
        if action == "pools set":
            slots = await store.pools.set_pool(args.name, args.slots)
            result = {"pool": args.name, "slots": slots}
            line = f"pool {args.name}: {slots} slots"
        elif action == "pools delete":
            await store.pools.delete_pool(args.name, force=args.force)
            result = {"pool": args.name, "deleted": True}
            line = f"pool {args.name}: deleted"
        elif action == "queues add":
            new = await store.pools.add_queue(args.name)
            result = {"queue": args.name, "added": new}
            line = f"queue {args.name}: {'added' if new else 'already declared'}"
        elif action == "queues delete":
            await store.pools.delete_queue(args.name, force=args.force)
            result = {"queue": args.name, "deleted": True}
            line = f"queue {args.name}: deleted"
        elif action == "pools list":
            pools = await store.pools.pools()
            result = {
                "pools": [
                    {"name": p.name, "slots": p.slots, "used": p.used, "ready": p.ready}
                    for p in pools
                ]
            }
            line = "\n".join(
                f"{p.name}: {p.used}/{'unlimited' if p.slots is None else p.slots} used, "
                f"{p.ready} ready"
                for p in pools
            )
        else:
            queues = await store.pools.queues()
            result = {
                "queues": [
                    {"name": q.name, "declared": q.declared, "workers": q.workers,
                     "slots": q.slots, "ready": q.ready}
                    for q in queues
                ]
            }  # fmt: skip
            line = "\n".join(
                f"{q.name}: {q.workers} live worker(s), {q.slots} slots, {q.ready} ready"
                + ("" if q.declared else " (not declared: slotless queues add)")
                + ("" if q.workers or not q.ready else "; no live worker serves it")
                for q in queues
            )
    finally:
        await store.close()
    print(json.dumps(result) if args.json else line)
    return 0
