"""``slotless assets send | list``: record an asset event from outside; see the assets.

``send URI --extra JSON`` records one event of the asset and, in the same transaction,
starts every DAG scheduled on it whose condition it completes (executor/store/assets.py):
no triggerer or worker needs to run for the run to be created. ``--key KEY`` makes a
retried send record nothing more (the API's Idempotency-Key). A bad URI or an extra that
is not a JSON object (or is over 64 KiB) is one error line and exit status 2, with nothing
recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from executor.assets import AssetError, check_uri, extra_json
from executor.store import open_store

from .options import db_opt

# The longest --key accepted (it is stored, indexed, beside every event sent with one).
MAX_KEY = 200


def add_commands(sub: Any) -> None:
    """``assets send`` and ``assets list``, on the ``slotless`` parser's subparsers."""
    assets = sub.add_parser("assets", help="record an asset event (it starts what it completes)")
    actions = assets.add_subparsers(required=True, metavar="ACTION")
    send = actions.add_parser("send", help="record an event of an asset")
    send.add_argument("uri", metavar="URI")
    send.add_argument("--extra", default=None, metavar="JSON", help="a JSON object kept with it")
    send.add_argument("--key", default=None, help="a replay with the same key records nothing")
    send.add_argument("--json", action="store_true", help="print one JSON object")
    db_opt(send)
    send.set_defaults(func=send_command)
    listing = actions.add_parser("list", help="assets, their last events, producers, consumers")
    listing.add_argument("--json", action="store_true", help="print one JSON list")
    db_opt(listing)
    listing.set_defaults(func=list_command)


def parse_extra(text: str | None) -> str | None:
    """``--extra``'s text as stored, or :class:`AssetError` (one line)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise AssetError(f"--extra is not JSON: {str(exc)[:200]}") from None
    return extra_json(value)


def check_key(key: str | None) -> str | None:
    if key is not None and (not key or len(key) > MAX_KEY or not key.isprintable()):
        raise AssetError(f"a key is 1 to {MAX_KEY} printable characters")
    return key


async def send_command(args: argparse.Namespace) -> int:
    try:
        uri = check_uri(args.uri)
        extra = parse_extra(args.extra)
        key = check_key(args.key)
    except AssetError as exc:
        print(f"slotless: error: {exc}", file=sys.stderr)
        return 2
    store = await open_store(args.db)
    try:
        rec = await store.assets.send_event(
            uri, extra, source="cli", dedup_key=None if key is None else f"cli:{key}"
        )
    finally:
        await store.close()
    if args.json:
        print(json.dumps({"id": rec.id, "uri": rec.uri, "created": rec.created, "runs": rec.runs}))
        return 0
    if not rec.created:
        print(f"asset event {uri} #{rec.id} was recorded before (key {key}): nothing more done")
    else:
        runs = ", ".join(rec.runs)
        did = f"started {runs}" if runs else "it started no run"
        print(f"asset event {uri} #{rec.id} recorded; {did}")
    return 0


async def list_command(args: argparse.Namespace) -> int:
    store = await open_store(args.db, create=False)
    try:
        assets = await store.assets.list_assets()
    finally:
        await store.close()
    if args.json:
        print(json.dumps([as_json(a) for a in assets]))
        return 0
    if not assets:
        print("no assets yet")
    for a in assets:
        last = "never updated" if a.last_ts is None else f"last {_when(a.last_ts)}"
        count = f"{a.events} event" + ("" if a.events == 1 else "s")
        print(f"{a.uri}{f' ({a.name})' if a.name else ''}  {count}, {last}")
        producers = ", ".join(f"{d}.{t}" for d, t in a.producers) or "none"
        print(f"    produced by: {producers}; consumed by: {', '.join(a.consumers) or 'none'}")
    return 0


def as_json(a: Any) -> dict[str, Any]:
    """An asset as the CLI's --json and the API list it."""
    return {
        "uri": a.uri,
        "name": a.name,
        "events": a.events,
        "last_ts": a.last_ts,
        "last_events": a.last_events,
        "producers": [{"dag_id": d, "task_id": t} for d, t in a.producers],
        "consumers": a.consumers,
    }


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
