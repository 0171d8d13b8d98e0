"""Opening a database, translated: what went wrong as one line an operator can act on.

A backend's ``open`` runs its connect inside :func:`translating`: any error comes out as
:class:`CannotOpen`, whose text names the URL without its password and says what to do;
its migration inside :func:`migrating`, where only a read-only database is translated;
the command line prints that line and exits 2, with no traceback. A database that opens
but refuses writes (a read-only file, a PostgreSQL standby) is :class:`ReadOnly`, found
by :meth:`check_writes` of a backend for the commands that write (worker, triggerer,
``run``, ``up``): read-only commands (``status``, ``logs``) still work on it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .db import SchemaTooNew

_SECRET_KEYS = ("password", "passfile", "sslpassword")


class CannotOpen(Exception):
    """The database at a URL cannot be opened; the text says which URL, and what to do."""


class ReadOnly(CannotOpen):
    """The database opened, but refuses writes."""


def redact(url: str) -> str:
    """``url`` without its password (in the authority or as a query parameter); any other
    URL as it was given (``sqlite:////abs.db`` keeps its four slashes)."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(k.lower() in _SECRET_KEYS for k, _ in pairs):
        query = urlencode(
            [(k, "***" if k.lower() in _SECRET_KEYS else v) for k, v in pairs], safe="*"
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _password(url: str) -> str | None:
    return urlsplit(url).password


def _scrub(text: str, url: str) -> str:
    """An error's text with the URL's password taken out, should a driver have quoted it."""
    secret = _password(url)
    return text.replace(secret, "***") if secret else text


@contextmanager
def translating(url: str, backend: str) -> Iterator[None]:
    """Turn what goes wrong while opening ``url`` into one :class:`CannotOpen` line."""
    try:
        yield
    except (SchemaTooNew, CannotOpen):
        raise
    except Exception as exc:
        raise CannotOpen(_line(url, backend, exc)) from exc


def _line(url: str, backend: str, exc: Exception) -> str:
    shown = redact(url)
    why = _scrub(str(exc).strip() or type(exc).__name__, url)
    fix = (
        _sqlite_fix(why) if backend == "sqlite" else _postgres_fix(exc, url)
    ) or "check the URL (--db or $SLOTLESS_DB)"
    return f"cannot open database {shown}: {why}; {fix}"


def _sqlite_fix(why: str) -> str | None:
    text = why.lower()
    if "not a database" in text:
        return "pass the path of a slotless database (a SQLite file)"
    if "readonly" in text or "read-only" in text:
        return read_only_fix("sqlite")
    if "unable to open" in text:
        return "check that the file and its folder exist and are writable, or pass another --db"
    return None


def _postgres_fix(exc: Exception, url: str) -> str | None:
    sqlstate = getattr(exc, "sqlstate", None) or ""
    parts = urlsplit(url)
    if sqlstate == "3D000":  # invalid_catalog_name: no such database
        name = parts.path.lstrip("/") or "?"
        return f"create it (createdb {name}) or name an existing database in the URL"
    if sqlstate.startswith("28"):  # invalid authorization: role, password, pg_hba.conf
        return "check the user and password in the URL, and the server's pg_hba.conf"
    if sqlstate == "25006":
        return read_only_fix("postgresql")
    if isinstance(exc, OSError | TimeoutError):
        where = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
        return f"is PostgreSQL running and reachable at {where}?"
    return None


def read_only_fix(backend: str) -> str:
    if backend == "sqlite":
        return (
            "make the file, its -wal and -shm files and its folder writable by this user, "
            "or pass another --db"
        )
    return "point --db at the primary server, not a standby or a read-only database"


def read_only(url: str, backend: str, why: str) -> ReadOnly:
    return ReadOnly(
        f"database {redact(url)} is read-only ({_scrub(why, url)}); {read_only_fix(backend)}"
    )


def missing_folder(url: str, path: str) -> CannotOpen | None:
    """A SQLite path whose folder does not exist: SQLite's own error does not name it."""
    if path == ":memory:" or path.startswith("file:"):
        return None
    folder = Path(path).expanduser().absolute().parent
    if folder.is_dir():
        return None
    return CannotOpen(
        f"cannot open database {redact(url)}: its folder {folder} does not exist; "
        "create it or pass another --db"
    )


def is_read_only(exc: BaseException) -> bool:
    """The database refuses writes: SQLite's SQLITE_READONLY, PostgreSQL's 25006
    (read_only_sql_transaction: a standby, default_transaction_read_only)."""
    return is_sqlite_read_only(exc) or getattr(exc, "sqlstate", None) == "25006"


@contextmanager
def migrating(url: str, backend: str) -> Iterator[None]:
    """A migration that fails because the database is read-only says so in one line;
    any other failure of a migration is raised as it is (a bug in a migration)."""
    try:
        yield
    except Exception as exc:
        if is_read_only(exc):
            raise read_only(url, backend, str(exc)) from exc
        raise


def is_sqlite_read_only(exc: BaseException) -> bool:
    """SQLite's SQLITE_READONLY family ("attempt to write a readonly database")."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith("SQLITE_READONLY") or "readonly database" in str(exc)
