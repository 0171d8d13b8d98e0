"""Opening a store from a URL. ``sqlite:///path.db`` (or a bare path) is the embedded default."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from .db import Database, Row, SchemaTooNew, Tx
from .jobs import Store

DEFAULT_DB = "sqlite:///slotless.db"

__all__ = [
    "DEFAULT_DB",
    "Database",
    "Row",
    "SchemaTooNew",
    "Store",
    "Tx",
    "open_store",
    "resolve_url",
]


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
        from .sqlite import SqliteDatabase

        # sqlite:///rel.db is relative, sqlite:////abs.db absolute, sqlite:///:memory: in memory
        if url.startswith("sqlite:///"):
            path = url[len("sqlite:///") :] or ":memory:"
        else:
            path = parsed.path or url
        if not create and path != ":memory:" and not os.path.exists(path):
            raise FileNotFoundError(f"no database at {path} (pass --db or set SLOTLESS_DB)")
        return await SqliteDatabase.open(url, path)
    if parsed.scheme in ("postgresql", "postgres"):
        from .postgres import PostgresDatabase

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
