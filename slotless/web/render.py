"""One renderer per view: a page and its live update come from the same Jinja2 template.

A page is a :class:`View`: a template's name and the context it is rendered with, read from
the store in one go (one read transaction, so that everything on it held at one moment).
:func:`page_html` renders the whole page; :func:`live_blocks` renders only the template's
blocks named ``live_*``, from the same context, for the page's live poll (``GET /api/live
+ path``). The page wraps each such block in an element ``data-block="live_..."`` whose
content the script (static/live.js) replaces with the block's new HTML. So a live update
cannot say anything the page itself would not: there is no second renderer to drift.

Templates are compiled once, when the app is made (:func:`environment`), never on the event
loop while serving. Autoescaping is on for every template: a DAG id, a log line or a conf
holding ``<script>`` is shown as text. Jinja2 is the Python ecosystem's default template
library (aiohttp-jinja2, Flask, Airflow's own UI before React all use it), already pinned in
constraints.txt; it gives escaping by default, template inheritance and blocks rendered
alone, which is what the live update is built on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup

from ..status import human_seconds
from .graph import MARK

LIVE_PREFIX = "live_"
# Each state's mark, written beside its name (a run's states and a task's).
MARKS = {**MARK, "QUEUED": "\u2026", "CANCELLED": "\u2298", "PAUSED": "\u23f8"}


@dataclass
class View:
    """A page: its template, its title, what it shows, and whether it goes on refreshing."""

    template: str
    title: str
    ctx: dict[str, Any] = field(default_factory=dict)
    live: bool = False


def when(ts: float | None) -> str:
    """An epoch time as the page shows it (the server's local time), or "-"."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def run_href(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}"


def task_href(run_id: str, task_id: str, map_index: int = -1) -> str:
    base = f"{run_href(run_id)}/tasks/{quote(task_id, safe='')}"
    return base if map_index < 0 else f"{base}/{map_index}"


def dag_href(dag_id: str) -> str:
    return f"/dags/{quote(dag_id, safe='')}"


def with_query(path: str, query: dict[str, Any]) -> str:
    """``path`` with ``query``'s non-empty values as its query string (a shareable URL)."""
    kept = {k: v for k, v in query.items() if v not in (None, "", [])}
    return f"{path}?{urlencode(kept, doseq=True)}" if kept else path


FILTERS: dict[str, Callable[..., Any]] = {
    "when": when,
    "seconds": human_seconds,
    "run_href": run_href,
    "task_href": task_href,
    "dag_href": dag_href,
    "with_query": with_query,
}


@cache
def environment() -> jinja2.Environment:
    """The templates under slotless/web/templates, every one compiled now (not on the loop)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("slotless.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        auto_reload=False,  # no stat() of a template file per render
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    env.globals.update(FILTERS)
    env.globals["marks"] = MARKS
    static = resources.files("slotless.web") / "static"
    # Served inline: the page is one response, works with no internet and no second request.
    env.globals["live_js"] = Markup(f"<script>{(static / 'live.js').read_text()}</script>")
    # The shared macros are globals: a live block is rendered alone (live_blocks), without
    # the imports at the top of its template, so an import there would not reach it.
    macros = env.get_template("_macros.html").module
    env.globals.update({n: getattr(macros, n) for n in dir(macros) if not n.startswith("_")})
    for name in env.list_templates(extensions=["html", "svg"]):
        env.get_template(name)  # compiled and cached (auto_reload off: never re-read)
    return env


def page_html(view: View, chrome: dict[str, Any]) -> str:
    """The whole page: ``view``'s template around ``chrome`` (header, flash, poll URL)."""
    template = environment().get_template(view.template)
    return template.render({**view.ctx, **chrome, "title": view.title, "live": view.live})


def live_blocks(view: View, chrome: dict[str, Any]) -> dict[str, Any]:
    """What the live poll answers: whether the page is still live, and each ``live_*`` block
    rendered again from the same context by the same template."""
    template = environment().get_template(view.template)
    context = template.new_context({**view.ctx, **chrome, "title": view.title, "live": view.live})
    blocks = {
        name: "".join(render(context))
        for name, render in template.blocks.items()
        if name.startswith(LIVE_PREFIX)
    }
    return {"live": view.live, "blocks": blocks}
