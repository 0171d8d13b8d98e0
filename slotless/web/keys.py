"""The application's shared state, one key each, so that page modules need not import the app."""

from __future__ import annotations

from aiohttp import web

from executor.store import Store

from .auth import Auth

STORE = web.AppKey("store", Store)
SETTINGS = web.AppKey("settings", dict)
AUTH = web.AppKey("auth", Auth)
LIVE = "/api/live"  # GET LIVE + a page's path: the same page's live blocks, as JSON
NEEDS = "needs_you_count"  # request key: the header's "Needs you" count
