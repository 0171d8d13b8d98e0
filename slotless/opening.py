"""Opening the store at a command's start, and what a start error looks like.

Every command goes through :func:`slotless.cli.main`, which turns any error it knows
(:func:`refusal`) into one line, ``slotless: error: ...``, and exit status 2: a bad DAG
file, a database that cannot be opened (the driver names its URL without the password and
says what to do: :mod:`executor.driver.opening`), a database lost in the middle of a
short command. A command that writes opens its store with :func:`open_writable`, so that a
read-only database is refused at once rather than met at the first write (a triggerer
would retry it for ever).
"""

from __future__ import annotations

import argparse
import sqlite3

from executor.dag import DagError
from executor.driver.faults import is_transient
from executor.driver.opening import CannotOpen, redact
from executor.loader import DagImportError
from executor.store import SchemaTooNew, Store, open_store, resolve_url
from executor.store import UnknownBackend as _UnknownBackend
from executor.store.catalogue import UnknownDag

USER_ERRORS = (
    CannotOpen,
    DagImportError,
    DagError,
    UnknownDag,
    _UnknownBackend,
    SchemaTooNew,
    sqlite3.DatabaseError,
    ValueError,
    OSError,  # a missing file, a database server that does not answer
)


async def open_writable(url: str | None) -> Store:
    """The store of a command that writes (worker, triggerer, run, up), refused with
    :class:`~executor.driver.opening.ReadOnly` if the database takes no writes."""
    store = await open_store(url)
    try:
        await store.db.check_writes()
    except BaseException:
        await store.close()
        raise
    return store


def refusal(exc: BaseException, args: argparse.Namespace | None = None) -> str | None:
    """The one line that says what went wrong and what to do, or None: a bug, whose
    traceback is worth more than a line."""
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    if is_transient(exc):  # the database went away in the middle of a command
        url = redact(resolve_url(getattr(args, "db", None)))
        return (
            f"database {url} unavailable ({type(exc).__name__}: {exc}); try again once it is back"
        )
    return None
