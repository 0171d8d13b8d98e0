"""The store, in parts by job, and opening it from a URL. ``sqlite:///path.db`` (or a bare
path) is the embedded default.

Each part is built over the same driver (a :class:`Database` and a clock): a process
holds the parts it uses; :class:`Store` holds them all, for callers that use several.
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlparse

from ..driver.db import Database, Row, SchemaTooNew, Tx
from .assets import Assets
from .audit import Audit
from .callbacks import Callbacks
from .catalogue import Catalogue
from .control import Runs
from .events import Events
from .exchange import Exchange
from .grid import Grids
from .inspecting import Views
from .loglines import LogLines
from .part import Clock
from .people import Answers
from .pools import Pools
from .runlist import RunList
from .waitlist import Waitlist

DEFAULT_DB = "sqlite:///slotless.db"

__all__ = [
    "DEFAULT_DB",
    "Answers",
    "Audit",
    "Callbacks",
    "Catalogue",
    "Database",
    "Events",
    "Exchange",
    "LogLines",
    "Pools",
    "Row",
    "Runs",
    "SchemaTooNew",
    "Store",
    "Tx",
    "Views",
    "open_store",
    "resolve_url",
]


class Store:
    """Every part of the store over one driver, for callers that use several (the CLI, the
    web server, the worker). A caller that needs one part takes that part."""

    def __init__(self, db: Database, clock: Clock = time.time) -> None:
        self.db = db
        self.clock = clock
        self.exchange = Exchange(db, clock)
        self.runs = Runs(db, clock)
        self.catalogue = Catalogue(db, clock)
        self.events = Events(db, clock)
        self.answers = Answers(db, clock)
        self.pools = Pools(db, clock)
        self.callbacks = Callbacks(db, clock)
        self.views = Views(db, clock)
        self.grids = Grids(db, clock)  # a DAG's page: its grid and calendar
        self.waitlist = Waitlist(db, clock)  # the waits page: conditions grouped by poke hash
        self.loglines = LogLines(db, clock)  # a task's log after a cursor; running lines
        self.assets = Assets(db, clock)  # asset events from outside, the assets listed
        self.audit = Audit(db, clock)
        self.runlist = RunList(db, clock)  # the runs list and a run's Gantt chart

    @property
    def url(self) -> str:
        return self.db.url

    async def close(self) -> None:
        await self.db.close()


class UnknownBackend(ValueError):
    """The database URL names a scheme slotless has no backend for."""


def resolve_url(url: str | None) -> str:
    return url or os.environ.get("SLOTLESS_DB") or DEFAULT_DB


async def open_database(url: str | None = None, *, create: bool = True) -> Database:
    """Open (and migrate) the database at ``url``; ``create=False`` refuses a missing file,
    so that a mistyped path in a read-only command does not leave an empty database."""
    url = resolve_url(url)
    parsed = urlparse(url)
    if parsed.scheme in ("", "file", "sqlite"):
        from ..driver.sqlite import SqliteDatabase

        # sqlite:///rel.db is relative, sqlite:////abs.db absolute, sqlite:///:memory: in memory
        if url.startswith("sqlite:///"):
            path = url[len("sqlite:///") :] or ":memory:"
        else:
            path = parsed.path or url
        if not create and path != ":memory:" and not os.path.exists(path):
            raise FileNotFoundError(f"no database at {path} (pass --db or set SLOTLESS_DB)")
        return await SqliteDatabase.open(url, path)
    if parsed.scheme in ("postgresql", "postgres"):
        from ..driver.postgres import PostgresDatabase

        return await PostgresDatabase.open(url)
    raise UnknownBackend(
        f"unknown database URL scheme {parsed.scheme!r} in {url!r}; "
        "use sqlite:///PATH or postgresql://USER@HOST/DB"
    )


async def open_store(url: str | None = None, *, create: bool = True, **kwargs: object) -> Store:
    db = await open_database(url, create=create)
    # A backend with its own clock (PostgreSQL: the server's) times everything the store
    # writes, so that leases and heartbeats are judged on one timeline across hosts.
    if "clock" not in kwargs and hasattr(db, "clock"):
        kwargs["clock"] = db.clock
    return Store(db, **kwargs)  # type: ignore[arg-type]
