"""The waits page, ``GET /waits``: every distinct condition being checked now, grouped by
what it waits on (its poke hash), and the triggerers' last hour beside it.

Tasks that wait on equal conditions share one check in the triggerer, so a row here is one
check: how many tasks wait on it, since when, how often it is checked (or what pushes it),
its last logged check, its shard and the triggerer leasing it, and the share of its
nearest timeout used (executor/store/waitlist.py reads it, one grouped query, paged). The
sidebar draws each triggerer's samples (triggerer/sampling.py) as small inline SVG charts
rendered by a template partial (templates/_sparkline.html): no chart library, no script
but the live poll's, so the page works offline and a live update is the same template's
blocks again.

Filters are a GET form (``class=``, ``dag=``, ``order=``, ``limit=``), so the URL holds
them; a bad value is a 400 with one line saying which.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from executor.metrics import TRIGGERER_LIVE_AFTER
from executor.store.waitlist import (
    HISTORY,
    MAX_LIMIT,
    ORDERS,
    TriggererHistory,
    WaitFilter,
    WaitGroup,
    WaitList,
)
from triggers import registry
from triggers.base import BaseTrigger

from ..status import shard_ranges
from .keys import LIVE, STORE
from .render import View
from .respond import respond

PATH = "/waits"
DEFAULT_LIMIT = 50
MAX_FILTER = 250  # characters of a class or DAG filter
_CLASSPATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class BadFilter(ValueError):
    """A filter value the page and the API refuse: ``field`` names it, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_filter(query: Mapping[str, str]) -> WaitFilter:
    """The page's and the API's query string as a filter, or :class:`BadFilter`."""
    classpath = query.get("class", "").strip()
    dag_id = query.get("dag", "").strip()
    order = query.get("order", "") or "waiters"
    if len(classpath) > MAX_FILTER or (classpath and not _CLASSPATH.fullmatch(classpath)):
        raise BadFilter("class", "class must be a trigger's dotted class path (module.Class)")
    if len(dag_id) > MAX_FILTER or any(not c.isprintable() for c in dag_id):
        raise BadFilter("dag", f"dag must be a DAG id: printable, at most {MAX_FILTER} characters")
    if order not in ORDERS:
        raise BadFilter("order", f"order must be one of: {', '.join(ORDERS)}")
    text = query.get("limit", "") or str(DEFAULT_LIMIT)
    try:
        limit = int(text)
    except ValueError:
        raise BadFilter("limit", "limit must be a number") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise BadFilter("limit", f"limit must be between 1 and {MAX_LIMIT}")
    return WaitFilter(classpath, dag_id, order, limit)


# -------------------------------------------------------------------- how it is checked


@dataclass(frozen=True, slots=True)
class How:
    """How a condition is checked, as far as the page can tell from its trigger row."""

    interval: float | None  # seconds between polls (None: held, or the class is unknown)
    push: str | None  # what pushes it, in words (None: polled only)
    note: str  # the whole answer, in words


class _NoContext:
    """The page has no triggerer context: a trigger asking for a connection (S3's event
    queue is named by its connection) gets an error, and says it cannot tell."""

    def __getattr__(self, name: str) -> Any:
        raise LookupError(f"no {name} on the web page")


async def how_checked(groups: Iterable[WaitGroup]) -> dict[str, How]:
    """Each shown condition's interval or push source, from its first waiter's trigger row.
    The classes are imported in the registry's import thread, never on the loop."""
    groups = list(groups)
    await registry.resolve({g.classpath for g in groups})
    return {g.poke_hash: _how(g) for g in groups}


def _how(g: WaitGroup) -> How:
    try:
        model = registry.load_trigger(g.classpath, g.kwargs)
        # The check runs at the shortest interval its waiters asked for: the listed ones'.
        interval = min(
            registry.load_trigger(g.classpath, k).poke_interval
            for k in {g.kwargs, *g.listed_kwargs}
        )
    except Exception as exc:  # not allow-listed here, or kwargs this class refuses
        return How(None, None, f"unknown here ({str(exc)[:120]})")
    model = model.model_copy(update={"poke_interval": interval})
    cls = type(model)
    if cls.is_push():
        return How(None, "its own run()", "held: its run() is open for the whole wait")
    every = f"every {model.poke_interval:g} s"
    if cls.push_interest is BaseTrigger.push_interest:
        return How(model.poke_interval, None, every)
    try:
        interest = model.push_interest(_NoContext())
    except Exception:
        interest = None
    if interest is None:
        return How(
            model.poke_interval,
            None,
            f"{every}; pushed instead if its connection names an event source",
        )
    key = interest.key if isinstance(interest.key, tuple) else (interest.key,)
    source = " ".join(str(k) for k in key)
    return How(
        model.poke_interval,
        source,
        f"pushed by {source} (while that source is live, polled as a safety net; "
        f"{every} otherwise)",
    )


# ----------------------------------------------------------------------------- charts


@dataclass(frozen=True, slots=True)
class Spark:
    """One small chart: a polyline's points in a ``width`` x ``height`` box, and its scale."""

    label: str
    unit: str
    points: str  # "x,y x,y ..." (empty: no samples)
    end: tuple[str, str]  # the last point (marked: a single sample draws no line)
    last: float | None
    top: float  # the value at the top of the box
    width: int = 160
    height: int = 28


def spark(
    label: str,
    unit: str,
    series: Sequence[tuple[float, float | None]],
    now: float,
    span: float = HISTORY,
    width: int = 160,
    height: int = 28,
) -> Spark:
    """``series`` of (time, value) over the last ``span`` seconds as a polyline; time runs
    left to right over the whole span, so a triggerer that stopped leaves a gap."""
    kept = [(t, v) for t, v in series if v is not None and t >= now - span]
    top = max((v for _, v in kept), default=0.0) or 1.0
    xy = [
        (f"{(t - (now - span)) / span * width:.1f}", f"{height - 1 - v / top * (height - 2):.1f}")
        for t, v in kept
    ]
    points = " ".join(f"{x},{y}" for x, y in xy)
    end = xy[-1] if xy else ("0", "0")
    return Spark(label, unit, points, end, kept[-1][1] if kept else None, top, width, height)


@dataclass(frozen=True, slots=True)
class TriggererCard:
    t: TriggererHistory
    live: bool
    shards: str  # its shards as ranges ("0-15, 32")
    charts: tuple[Spark, ...]


def cards(history: Sequence[TriggererHistory], now: float) -> list[TriggererCard]:
    out = []
    for t in history:
        s = t.samples
        charts = (
            spark("checks/s", "/s", [(p.at, p.checks_per_s) for p in s], now),
            spark("loop lag p99", "ms", [(p.at, p.lag_p99_ms) for p in s], now),
            spark("loop lag max", "ms", [(p.at, p.lag_max_ms) for p in s], now),
            spark("held waits", "", [(p.at, float(p.waits)) for p in s], now),
        )
        live = t.listed and t.seen_at is not None and now - t.seen_at <= TRIGGERER_LIVE_AFTER
        out.append(TriggererCard(t, live, shard_ranges(list(t.shards)), charts))
    return out


# ----------------------------------------------------------------------------- the page


def short_class(classpath: str) -> str:
    return classpath.rpartition(".")[2]


def pretty_kwargs(kwargs: str) -> str:
    try:
        return json.dumps(json.loads(kwargs), indent=1, sort_keys=True)[:4000]
    except ValueError:
        return kwargs[:4000]


# A page's reads are reused this long for the same filters: its grouped query reads every
# wait (~0.2 s of CPU at 100,000 on SQLite), and each viewer's live poll would run it again
# every --refresh seconds. So the database pays one query per filter per FRESH_FOR seconds,
# however many look. The JSON API reads afresh.
FRESH_FOR = 5.0
RECENT_KEPT = 32  # filters remembered (the oldest forgotten first)
Read = tuple[WaitList, list[TriggererHistory], dict[str, How]]
RECENT = web.AppKey("waits_recent", dict)


async def waits(request: web.Request) -> web.Response:
    try:
        f = parse_filter(request.query)
    except BadFilter as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    recent: dict[WaitFilter, tuple[float, Read]] = request.app[RECENT]
    kept = recent.get(f)
    if kept is not None and time.monotonic() - kept[0] < FRESH_FOR:
        listed, history, how = kept[1]
    else:
        listed, history = await request.app[STORE].waitlist.page(f)
        how = await how_checked(listed.groups)
        recent.pop(f, None)
        recent[f] = (time.monotonic(), (listed, history, how))
        while len(recent) > RECENT_KEPT:
            del recent[next(iter(recent))]
    return respond(request, View("waits.html", "waits", page_context(listed, history, how), True))


def page_context(
    listed: WaitList, history: Sequence[TriggererHistory], how: Mapping[str, How]
) -> dict[str, Any]:
    f = listed.filter
    now = listed.now
    return {
        "listed": listed,
        "f": f,
        "how": how,
        "now": now,
        "cards": cards(history, now),
        "classes": sorted({*registry.BUILTINS, *(g.classpath for g in listed.groups)}),
        "orders": ORDERS,
        "max_limit": MAX_LIMIT,
        "short_class": short_class,
        "pretty_kwargs": pretty_kwargs,
    }


def add_routes(app: web.Application) -> None:
    app[RECENT] = {}
    app.router.add_get(PATH, waits)
    app.router.add_get(LIVE + PATH, waits)  # the same page's live blocks, as JSON
