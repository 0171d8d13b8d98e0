"""``GET /audit``: the audit list on the page, newest first: who (a token's name and its
role then) did what, to what, through the page or the API, and whether it was done or
refused. Filtered by ``?since=`` (epoch seconds) and ``?limit=`` (1-1000), as
``GET /api/v1/audit`` is.

It needs a signed-in session of any role (``audit`` in :data:`slotless.roles.NEEDS`), unlike
the rest of the page, which anyone who can reach it may read: the list names every token
that wrote and what each tried. Without a token configured nobody can sign in, and it is
refused (403) saying so; not signed in, it sends to the sign-in form and back.
"""

from __future__ import annotations

import json
import math
from urllib.parse import quote

from aiohttp import web

from executor.store.audit import MAX_LIST

from .actions import record_pending
from .keys import AUTH, LIVE, STORE
from .render import View
from .respond import respond

DEFAULT_LIMIT = 100


def add_routes(app: web.Application) -> None:
    app.router.add_get("/audit", audit_page)
    app.router.add_get(LIVE + "/audit", audit_page)
    # The rows of the page writes no handler records itself (the trigger form's).
    app.on_response_prepare.append(record_pending)


async def audit_page(request: web.Request) -> web.StreamResponse:
    w = request.app[AUTH].writes(request)
    if not w.enabled:
        refused = View("audit.html", "audit", {"refused": (
            "The audit list needs a signed-in token: start slotless ui with --token "
            "NAME:ROLE:SECRET (or $SLOTLESS_UI_TOKEN)."), "rows": []})  # fmt: skip
        return respond(request, refused, status=403)
    if not w.can("audit"):
        raise web.HTTPSeeOther(f"/login?back={quote('/audit', safe='')}")
    since_text = request.query.get("since", "")
    limit_text = request.query.get("limit", "")
    try:
        since = float(since_text) if since_text else 0.0
        limit = int(limit_text) if limit_text else DEFAULT_LIMIT
    except ValueError:
        since, limit = math.nan, 0
    if not math.isfinite(since) or not 1 <= limit <= MAX_LIST:
        bad = View("audit.html", "audit", {"refused": (
            f"since must be a time in epoch seconds and limit a number from 1 to {MAX_LIST}"),
            "rows": []})  # fmt: skip
        return respond(request, bad, status=400)
    rows = await request.app[STORE].audit.since(since, limit)
    shown = [
        {
            "ts": r.ts, "who": r.who, "role": r.role, "via": r.via, "action": r.action,
            "target": r.target, "outcome": r.outcome,
            "detail": json.dumps(r.detail, sort_keys=True, ensure_ascii=False)[:500],
        }
        for r in rows
    ]  # fmt: skip
    ctx = {"rows": shown, "since": since_text, "limit": limit, "refused": ""}
    return respond(request, View("audit.html", "audit", ctx, live=True))
