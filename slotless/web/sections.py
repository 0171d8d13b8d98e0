"""The pages built on the renderer (:mod:`.render`): each module here adds its own routes,
its handlers reading one view from the store and answering with :func:`.respond.respond`."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from . import api_runs, runs_page  # noqa: F401  (api_runs: its API routes, by importing it)

SECTIONS: tuple[Callable[[web.Application], None], ...] = (runs_page.add_routes,)
