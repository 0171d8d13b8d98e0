"""SQL for every backend: versioned DDL files and named queries, loaded once.

Layout::

    schema/common/queries.sql      statements that read the same on SQLite and PostgreSQL
    schema/<backend>/queries.sql   the dialect-specific rest (a name lives in one place only)
    schema/<backend>/NNN_name.sql  migrations, applied in order by executor.driver.migrate

Each statement sits under a ``-- name: NAME`` line and takes **named** parameters
(``:run_id``). A list parameter is written the PostgreSQL way, ``col = ANY(:ids)``; on
SQLite that becomes ``col IN (SELECT value FROM json_each(:ids))`` and the driver passes
the list as JSON. :func:`queries` gives each backend its statements in its own placeholder
style (``:name`` for sqlite3, ``$n`` for asyncpg) with the parameter names in order, so
Python calls a statement by name with keyword arguments and never sees the dialect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

BACKENDS = ("sqlite", "postgres")

_MIGRATION = re.compile(r"^(\d{3})_(\w+)\.sql$")
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_COMMENT = re.compile(r"--[^\n]*")  # our SQL has no "--" inside a string literal
# ":name", but not the second colon of a PostgreSQL cast ("::bigint") nor a word in a string.
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_ANY = re.compile(r"=\s*ANY\(\s*:(\w+)\s*\)")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@dataclass(frozen=True, slots=True)
class Query:
    """One statement in a backend's placeholder style, and the names it takes in order."""

    name: str
    sql: str
    params: tuple[str, ...]
    lists: frozenset[str]  # parameters passed as a list (``= ANY(:name)``)
    names: frozenset[str]  # ``params`` as a set, to check a call's keywords against


@cache
def migrations(backend: str) -> tuple[Migration, ...]:
    folder = resources.files(__package__) / backend
    found = []
    for entry in folder.iterdir():
        m = _MIGRATION.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    return tuple(sorted(found, key=lambda mig: mig.version))


@cache
def sources(folder: str) -> dict[str, str]:
    """The statements of one file (``common`` or a backend), as written: name -> SQL."""
    text = (resources.files(__package__) / folder / "queries.sql").read_text()
    parts = _NAME.split(text)
    # parts: [preamble, name1, sql1, name2, sql2, ...]
    out: dict[str, str] = {}
    for name, sql in zip(parts[1::2], parts[2::2], strict=True):
        if name in out:
            raise ValueError(f"query {name!r} defined twice in {folder}/queries.sql")
        out[name] = _COMMENT.sub("", sql).strip().rstrip(";").strip()
    return out


@cache
def queries(backend: str) -> dict[str, Query]:
    """Every statement ``backend`` runs: the common ones and its own, compiled for it."""
    if backend not in BACKENDS:
        raise ValueError(f"no SQL for backend {backend!r}")
    common, own = sources("common"), sources(backend)
    both = sorted(set(common) & set(own))
    if both:
        raise ValueError(f"{backend}/queries.sql redefines common queries: {', '.join(both)}")
    return {name: compile_query(name, sql, backend) for name, sql in {**common, **own}.items()}


def compile_query(name: str, sql: str, backend: str) -> Query:
    lists = frozenset(_ANY.findall(sql))
    if backend == "sqlite":
        sql = _ANY.sub(r"IN (SELECT value FROM json_each(:\1))", sql)
        params = tuple(dict.fromkeys(_PARAM.findall(sql)))
        return Query(name, sql, params, lists, frozenset(params))
    order: dict[str, int] = {}

    def number(m: re.Match[str]) -> str:
        return f"${order.setdefault(m.group(1), len(order) + 1)}"

    sql = _PARAM.sub(number, sql)
    return Query(name, sql, tuple(order), lists, frozenset(order))
