"""The pages built on the renderer (:mod:`.render`): each module here adds its own routes,
its handlers reading one view from the store and answering with :func:`.respond.respond`."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

# The api_* modules' /api/v1 routes are registered when they are imported.
from . import (  # noqa: F401
    api_assets,
    api_dags,
    api_logs,
    api_runs,
    api_waits,
    assets_page,
    audit_page,
    dag_page,
    logs_page,
    runs_page,
    trigger_form,
    waits_page,
)

SECTIONS: tuple[Callable[[web.Application], None], ...] = (
    dag_page.add_routes,
    waits_page.add_routes,
    audit_page.add_routes,
    logs_page.add_routes,
    trigger_form.add_routes,
    assets_page.add_routes,
    runs_page.add_routes,
)
