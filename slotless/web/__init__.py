"""`slotless ui`: a small web page of runs, their tasks and the tasks' logs, and the DAGs.

aiohttp serving HTML rendered on the server, plus a few lines of plain JavaScript that
update a live page in place from a JSON poll. Bound to 127.0.0.1 unless ``--host`` says
otherwise. Read-only unless started with a token (``--token`` or $SLOTLESS_UI_TOKEN): then
an operator who signs in with it may pause, unpause and trigger DAGs (:mod:`.auth`,
:mod:`.actions`).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import sys
from urllib.parse import urlparse, urlunparse

from aiohttp import web

from executor.store import SchemaTooNew, Store, open_store, resolve_url
from executor.store import UnknownBackend as _UnknownBackend

from .app import make_app

__all__ = ["UiError", "make_app", "open_for_reading", "serve_ui"]


class UiError(ValueError):
    """The page cannot start: the database cannot be opened or the port is taken."""


def sqlite_path(url: str) -> str | None:
    """The file behind a SQLite URL (as the store reads it), or None for other backends."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        return url[len("sqlite:///") :] if url.startswith("sqlite:///") else parsed.path
    if parsed.scheme in ("", "file"):
        return parsed.path or url
    return None


def safe_url(url: str) -> str:
    """The URL without a password, for showing on the page."""
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
    return urlunparse(parsed._replace(netloc=netloc))


async def open_for_reading(url: str | None) -> Store:
    """Open an existing store; any failure is one :class:`UiError` line naming the database."""
    url = resolve_url(url)
    path = sqlite_path(url)
    if path and path != ":memory:" and not os.path.exists(path):
        raise UiError(
            f"cannot open database {url}: {path} does not exist "
            "(a worker, `slotless run` or `slotless up` creates it)"
        )
    try:
        return await open_store(url)
    except (_UnknownBackend, SchemaTooNew):
        raise
    except Exception as exc:
        raise UiError(f"cannot open database {url}: {exc}") from None


async def serve_ui(args: argparse.Namespace) -> int:
    store = await open_for_reading(args.db)
    token = getattr(args, "token", None) or os.environ.get("SLOTLESS_UI_TOKEN") or None
    app = make_app(
        store,
        db_label=safe_url(store.url),
        refresh=args.refresh,
        token=token,
        parse_timeout=args.parse_timeout,
    )
    runner = web.AppRunner(app, access_log=None)
    try:
        await runner.setup()
        try:
            await web.TCPSite(runner, args.host, args.port).start()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UiError(
                    f"port {args.port} is already in use on {args.host} (pick another --port)"
                ) from None
            raise UiError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
        host = f"[{args.host}]" if ":" in args.host else args.host
        port = next((a[1] for a in runner.addresses if isinstance(a, tuple)), args.port)
        print(
            f"slotless ui: http://{host}:{port}/ "
            f"({'writes for a signed-in operator' if token else 'read-only'}, "
            f"{safe_url(store.url)}; "
            "Ctrl-C stops it)",
            file=sys.stderr,
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
        await store.close()
    return 0
