"""A task's log on the page: the viewer that streams it, its own page, its download.

* ``GET /runs/{run}/tasks/{task}[/{index}]/log``: the whole log in the viewer
  (templates/log.html around templates/_log_stream.html), which appends new entries as
  they are written while the task runs;
* ``GET .../log.txt``: the whole log as text (``slotless logs``' lines), sent in chunks
  as it is read, never held whole in memory;
* :func:`log_stream`: what templates/_log_stream.html needs, for any page that shows a
  task's log (the task page).

The viewer polls ``GET /api/v1/.../log?since=CURSOR`` (api_logs.py) every
:data:`POLL_EVERY` seconds for the entries after the last one it has, and stops after the
read that finds the task finished. Polling, not server-sent events: a poll is one indexed
read and a short response, so it passes every proxy and load balancer as any GET does,
holds no connection (nothing to close when ``slotless ui`` stops, no idle timeout to
tune), and a page left open in a hidden tab costs nothing (it does not poll). The cost is
at most one read per viewer and interval, and a line shows at most POLL_EVERY after it is
written, plus the read (the worker writes a running task's lines every 0.5 s:
executor/store/loglines.py).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from aiohttp import web

from executor.states import TERMINAL
from executor.store import Store
from executor.store.loglines import LogPage
from executor.store.viewrows import EventRow
from triggers.limits import storable_text

from ..logs import entry_line
from .api import PREFIX
from .keys import LIVE, STORE
from .render import View, task_href
from .respond import polled, respond

# Seconds between two reads of a viewer while its task runs: with the worker's 0.5 s flush,
# a line shows within 0.75 s and a read; at 0.5 s the p99 was 1.07 s on PostgreSQL
# (benchmarks/web.py), past the page's 1 s target.
POLL_EVERY = 0.25
FIRST_PAGE = 2000  # entries drawn with the page; the viewer reads the rest at once
MAX_SHOWN = 20_000  # entries a viewer keeps; older ones leave the view (not the download)
DOWNLOAD_CHUNK = 2000  # entries a read while a download is sent


def add_routes(app: web.Application) -> None:
    for path in ("/runs/{run_id}/tasks/{task_id}", r"/runs/{run_id}/tasks/{task_id}/{index:\d+}"):
        app.router.add_get(path + "/log", log_page)
        app.router.add_get(LIVE + path + "/log", log_page)
        app.router.add_get(path + "/log.txt", log_text)


def log_api(run_id: str, task_id: str, map_index: int = -1) -> str:
    """The JSON API's URL of a task's log (api_logs.py)."""
    base = f"{PREFIX}/runs/{quote(run_id, safe='')}/tasks/{quote(task_id, safe='')}"
    return f"{base}/log" if map_index < 0 else f"{base}/{map_index}/log"


def log_stream(run_id: str, task_id: str, map_index: int, page: LogPage) -> dict[str, Any]:
    """What templates/_log_stream.html draws (as ``log``): ``page``, the entries from the
    start of the log, and where the viewer goes on from."""
    href = task_href(run_id, task_id, map_index)
    return {
        "entries": page.entries,
        "cursor": page.cursor,
        "finished": page.finished,
        "state": page.state,
        "api": log_api(run_id, task_id, map_index),
        "page": href + "/log",
        "download": href + "/log.txt",
        "every_ms": int(POLL_EVERY * 1000),
        "max": MAX_SHOWN,
    }


async def read_log_stream(
    store: Store, run_id: str, task_id: str, map_index: int = -1
) -> dict[str, Any] | None:
    """:func:`log_stream` of a task's log from its start (None: no such task): for a page
    that includes templates/_log_stream.html."""
    page = await store.loglines.after(run_id, task_id, map_index, 0, FIRST_PAGE)
    return None if page is None else log_stream(run_id, task_id, map_index, page)


def _where(request: web.Request) -> tuple[str, str, int]:
    m = request.match_info
    return m["run_id"], m["task_id"], int(m.get("index", -1))


def _name(task_id: str, map_index: int) -> str:
    return task_id if map_index < 0 else f"{task_id}[{map_index}]"


async def _missing(store: Store, run_id: str, task_id: str, map_index: int) -> str:
    if not storable_text(run_id) or await store.views.run_info(run_id) is None:
        return f"There is no run {run_id!r}."
    return f"Run {run_id!r} has no task {_name(task_id, map_index)!r}."


async def log_page(request: web.Request) -> web.Response:
    store = request.app[STORE]
    run_id, task_id, map_index = _where(request)
    # The page's own live poll redraws only the state: one entry read, not the log.
    n = 1 if polled(request) else FIRST_PAGE
    page = None
    if storable_text(run_id) and storable_text(task_id):
        page = await store.loglines.after(run_id, task_id, map_index, 0, n)
    if page is None:
        what = await _missing(store, run_id, task_id, map_index)
        return respond(request, View("not_found.html", "not found", {"what": what}), status=404)
    ctx = {
        "run_id": run_id,
        "task_id": task_id,
        "map_index": map_index,
        "name": _name(task_id, map_index),
        "log": log_stream(run_id, task_id, map_index, page),
    }
    title = f"log of {_name(task_id, map_index)} - {run_id}"
    return respond(request, View("log.html", title, ctx, live=page.state not in TERMINAL))


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


async def log_text(request: web.Request) -> web.StreamResponse:
    """The whole log as text, an attachment, written as it is read (DOWNLOAD_CHUNK entries
    a read, each its own short read)."""
    store = request.app[STORE]
    run_id, task_id, map_index = _where(request)
    chunks = store.loglines.pages(run_id, task_id, map_index, DOWNLOAD_CHUNK)
    first = await anext(chunks, None) if storable_text(run_id) and storable_text(task_id) else None
    if first is None:
        page = None
        if storable_text(run_id) and storable_text(task_id):
            page = await store.loglines.after(run_id, task_id, map_index, 0, 1)
        if page is None:
            what = await _missing(store, run_id, task_id, map_index)
            return web.Response(text=what + "\n", status=404, content_type="text/plain")
    name = _UNSAFE.sub("_", f"{run_id}-{_name(task_id, map_index)}")[:150] + ".log"
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        }
    )
    await response.prepare(request)
    if first is not None:
        await _write(response, first)
        async for chunk in chunks:
            await _write(response, chunk)
    await response.write_eof()
    return response


async def _write(response: web.StreamResponse, entries: list[EventRow]) -> None:
    await response.write("".join(entry_line(e) + "\n" for e in entries).encode())
