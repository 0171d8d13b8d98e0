"""The application's shared state, one key each, so that page modules need not import the app."""

from __future__ import annotations

from aiohttp import web

from executor.store import Store

from .auth import Auth

STORE = web.AppKey("store", Store)
SETTINGS = web.AppKey("settings", dict)
AUTH = web.AppKey("auth", Auth)
PARSE_TIMEOUT = web.AppKey("api_parse_timeout", float)  # the API's limit on a DAG import
LIVE = "/api/live"  # GET LIVE + a page's path: the same page's live blocks, as JSON
NEEDS = web.RequestKey("needs_you_count", int)  # the header's "Needs you" count
