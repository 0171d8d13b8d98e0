"""Answering a GET with a :class:`~.render.View`: the whole page, or, under ``/api/live``,
its live blocks as JSON. Page modules call :func:`respond`; they never build HTML."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web
from markupsafe import Markup

from .assets import CSS
from .keys import AUTH, LIVE, NEEDS, SETTINGS
from .render import View, live_blocks, page_html

NO_STORE = {"Cache-Control": "no-store"}


def polled(request: web.Request) -> bool:
    """Whether this GET is a page's live poll (``/api/live/...``)."""
    return request.path.startswith(LIVE + "/")


def chrome(request: web.Request, *, status: int = 200) -> dict[str, Any]:
    """What every page's header and script need: the database, who may write, the poll URL,
    a message flashed once (then forgotten, with the form it refused)."""
    s = request.app[SETTINGS]
    page_path = request.path.removeprefix(LIVE) if polled(request) else request.path
    # A form in a live block comes back to the page, not to its poll's URL.
    w = replace(request.app[AUTH].writes(request), path=page_path)
    flash = None
    if w.session is not None and not polled(request):
        flash, w.session.flash, w.session.form = w.session.flash, None, {}
    query = f"?{request.query_string}" if request.query_string else ""
    return {
        "db": s["db"],
        "refresh": s["refresh"],
        "poll": LIVE + page_path + query if status == 200 else "",
        "w": w,
        "flash": flash,
        "needs": request.get(NEEDS),
        "css": Markup(CSS),  # our own stylesheet, not user input
    }


def respond(request: web.Request, view: View, status: int = 200) -> web.Response:
    """``view`` as a page, or as its live blocks when the request is the page's poll."""
    c = chrome(request, status=status)
    if polled(request):
        return web.json_response(live_blocks(view, c), status=status, headers=NO_STORE)
    return web.Response(
        text=page_html(view, c), status=status, content_type="text/html", headers=NO_STORE
    )
