"""``slotless events send | list``: push an event into the store, and see what events woke.

``send`` stores one event and, in the same transaction, settles every wait it matches
(:mod:`executor.store.events`): no triggerer or worker needs to run for the waits to end.
The payload is ``--payload JSON``, ``--payload -`` (stdin) or ``--payload-file PATH`` (a
large one does not fit in argv). A bad name, a payload that is not JSON, nested over 64
deep, holding text that is not valid Unicode or over 64 KiB is one error line naming the
field and exit status 2, with nothing stored. ``list`` shows the newest events (of one
name), each with the waits it woke; an unknown name is an error (exit 2).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from datetime import UTC, datetime
from typing import Any

from executor.store import open_store
from executor.store.events import StoredEvent, UnknownEvent
from triggers.events import EventError
from triggers.limits import MAX_DEPTH, MAX_SERIALIZED_BYTES

from .options import db_opt

PAYLOAD_SHOWN = 120  # characters of a payload shown per line by `list`
# What `send` reads of a payload file or stdin: a payload's whitespace is not counted
# against its 64 KiB (it is stored compact), but a file of gigabytes is not read whole.
MAX_READ = 16 * 1024 * 1024


def add_commands(sub: Any) -> None:
    """``events send`` and ``events list``, on the ``slotless`` parser's subparsers."""
    events = sub.add_parser("events", help="send an event (it wakes the waits it matches); list")
    actions = events.add_subparsers(required=True, metavar="ACTION")
    send = actions.add_parser("send", help="store an event and wake the waits it matches")
    send.add_argument("name", metavar="NAME")
    given = send.add_mutually_exclusive_group()
    given.add_argument(
        "--payload", default="{}", metavar="JSON",
        help="its payload (default {}); - reads it from stdin",
    )  # fmt: skip
    given.add_argument(
        "--payload-file", metavar="PATH", help="read its payload from a file (a large one)"
    )
    send.add_argument("--json", action="store_true", help="print one JSON object")
    db_opt(send)
    send.set_defaults(func=send_command)
    listing = actions.add_parser("list", help="recent events and the waits each woke")
    listing.add_argument("name", nargs="?", metavar="NAME")
    listing.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    listing.add_argument("--json", action="store_true", help="print one JSON list")
    db_opt(listing)
    listing.set_defaults(func=list_command)


def _payload(args: argparse.Namespace) -> Any:
    """The payload given, parsed; :class:`EventError` (one line) if it is not JSON. Its
    limits (depth, text, size) are the store's to check, as for every way in."""
    if args.payload_file is not None:
        where = "--payload-file"
        try:
            with open(args.payload_file, "rb") as f:
                text = f.read(MAX_READ + 1)
        except OSError as exc:
            raise EventError(f"{where}: cannot read {args.payload_file}: {exc.strerror}",
                             "payload") from None  # fmt: skip
    elif args.payload == "-":
        where = "--payload -"
        text = sys.stdin.buffer.read(MAX_READ + 1)
    else:
        where, text = "--payload", args.payload.encode("utf-8", "surrogateescape")
    if len(text) > MAX_READ:
        raise EventError(f"{where} is over {MAX_READ} bytes; the limit of a payload is "
                         f"{MAX_SERIALIZED_BYTES // 1024} KiB", "payload")  # fmt: skip
    try:
        return json.loads(text)
    except RecursionError:
        raise EventError(f"{where} nests too deep: at most {MAX_DEPTH} levels",
                         "payload") from None  # fmt: skip
    except ValueError as exc:
        raise EventError(f"{where} is not JSON: {str(exc)[:200]}", "payload") from None


async def send_command(args: argparse.Namespace) -> int:
    payload = _payload(args)
    store = await open_store(args.db)
    try:
        sent = await store.events.send_event(args.name, payload, source=f"cli:{getpass.getuser()}")
        woke = await store.events.get_event(sent.id)
    finally:
        await store.close()
    if args.json:
        print(json.dumps(_as_json(woke)))
        return 0
    waits = ", ".join(_wake(w) for w in woke.woke)
    print(
        f"event {sent.name} #{sent.id} stored; "
        + (
            f"woke {len(woke.woke)}: {waits}"
            if woke.woke
            else "it woke no wait (yet: a wait that begins within its lookback will see it)"
        )
    )
    return 0


async def list_command(args: argparse.Namespace) -> int:
    store = await open_store(args.db, create=False)
    try:
        events = await store.events.list_events(args.name, limit=max(1, args.limit))
    except UnknownEvent as exc:
        print(f"slotless: error: {exc}", file=sys.stderr)
        return 2
    finally:
        await store.close()
    if args.json:
        print(json.dumps([_as_json(e) for e in events]))
        return 0
    if not events:
        print("no events stored" + (f" named {args.name}" if args.name else ""))
    for e in events:
        payload = json.dumps(e.payload, separators=(",", ":"))
        if len(payload) > PAYLOAD_SHOWN:
            payload = payload[: PAYLOAD_SHOWN - 1] + "…"
        print(f"#{e.id}  {_when(e.sent_at)}  {e.name}  from {e.source}  {payload}")
        print("    woke: " + (", ".join(_wake(w) for w in e.woke) if e.woke else "nothing"))
    return 0


def _wake(w: Any) -> str:
    index = f"[{w.map_index}]" if w.map_index >= 0 else ""
    return f"{w.run_id}/{w.task_id}{index} ({w.state})"


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _as_json(e: StoredEvent) -> dict[str, Any]:
    return {
        "id": e.id,
        "name": e.name,
        "payload": e.payload,
        "sent_at": e.sent_at,
        "source": e.source,
        "woke": [
            {
                "run_id": w.run_id,
                "task_id": w.task_id,
                "map_index": w.map_index,
                "state": w.state,
                "woke_at": w.woke_at,
            }
            for w in e.woke
        ],
    }
