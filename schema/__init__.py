"""SQL for every backend: versioned DDL files and named queries, loaded once.

Layout::

    schema/common/*.sql            statements that read the same on SQLite and PostgreSQL,
                                   one file per subject (a name defined once across them)
    schema/<backend>/queries.sql   the dialect-specific rest (a name lives in one place only)
    schema/<backend>/NNN_name.sql  migrations, applied in order by executor.driver.migrate

Each statement sits under a ``-- name: NAME`` line and takes **named** parameters
(``:run_id``). :func:`queries` gives each backend its statements in its own placeholder
style (``:name`` for sqlite3, ``$n`` for asyncpg) with the parameter names in order, so
Python calls a statement by name with keyword arguments and never sees the dialect.

A common statement is written the PostgreSQL way where the difference is mechanical, and
:func:`compile_query` translates it for SQLite:

* a list parameter, ``col = ANY(:ids)``: ``col IN (SELECT value FROM json_each(:ids))``,
  the driver passing the list as JSON;
* a cast, ``:n::integer``: dropped (SQLite types a value by what it holds);
* a row lock, ``FOR UPDATE [OF t] [SKIP LOCKED]`` or ``FOR SHARE``: dropped (a write
  transaction holds the whole file's lock).

and for PostgreSQL, SQLite's planner hints: ``INDEXED BY index`` is dropped and a
``CROSS JOIN ... ON`` (SQLite: keep this join order) is a plain ``JOIN``.

Two spellings neither dialect has: ``json_at(:param, key)`` and ``json_at(:param, key,
'field')`` read a JSON object parameter's entry for ``key`` (a column), or that entry's
``field``, as SQL (``json_extract`` on SQLite, ``->``/``->>`` on PostgreSQL); and
``{{part}}`` stands for a piece each backend writes under ``-- part: NAME`` in its own
file, for what no rewrite can say (a data-modifying CTE PostgreSQL has and SQLite lacks).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

BACKENDS = ("sqlite", "postgres")

_MIGRATION = re.compile(r"^(\d{3})_(\w+)\.sql$")
_SECTION = re.compile(r"^--\s*(name|part):\s*(\w+)\s*$", re.MULTILINE)
_COMMENT = re.compile(r"--[^\n]*")  # our SQL has no "--" inside a string literal
# ":name", but not the second colon of a PostgreSQL cast ("::bigint") nor a word in a string.
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_ANY = re.compile(r"=\s*ANY\(\s*:(\w+)(?:::\w+\[\])?\s*\)")
_CAST = re.compile(r"::[A-Za-z_]\w*(?:\[\])?")
_LOCK = re.compile(r"\s+FOR\s+(?:UPDATE(?:\s+OF\s+\w+)?(?:\s+SKIP\s+LOCKED)?|SHARE)\b")
_INDEXED_BY = re.compile(r"\s+INDEXED\s+BY\s+\w+")
_CROSS_JOIN = re.compile(r"\bCROSS\s+JOIN\b")
# json_at(:param, key) or json_at(:param, key, 'field'): key a column or an expression
# without commas or parentheses (``id``, ``t.id``).
_JSON_AT = re.compile(r"json_at\(\s*:(\w+)\s*,\s*([\w.]+)\s*(?:,\s*'(\w+)'\s*)?\)")
_PART = re.compile(r"\{\{(\w+)\}\}")


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
def _sections(folder: str) -> dict[str, dict[str, str]]:
    """A folder's statements as written (comments dropped): kind ("name", "part") -> name ->
    SQL. A backend's are in its queries.sql; common ones in every common/*.sql, one file per
    subject (queries.sql, history.sql, ...), a name defined in one file only."""
    files = sorted(
        (f for f in (resources.files(__package__) / folder).iterdir() if f.name.endswith(".sql"))
        if folder == "common"
        else [resources.files(__package__) / folder / "queries.sql"],
        key=lambda f: f.name,
    )
    out: dict[str, dict[str, str]] = {"name": {}, "part": {}}
    for file in files:
        pieces = _SECTION.split(file.read_text())
        # pieces: [preamble, kind1, name1, sql1, kind2, name2, sql2, ...]
        for kind, name, sql in zip(pieces[1::3], pieces[2::3], pieces[3::3], strict=True):
            if name in out[kind]:
                raise ValueError(f"{kind} {name!r} defined twice in {folder}/ ({file.name})")
            out[kind][name] = _COMMENT.sub("", sql).strip().rstrip(";").strip()
    return out


def sources(folder: str) -> dict[str, str]:
    """The statements of one file (``common`` or a backend), as written: name -> SQL."""
    return _sections(folder)["name"]


def parts(backend: str) -> dict[str, str]:
    """A backend's pieces of common statements (``{{name}}`` in them): name -> SQL."""
    return _sections(backend)["part"]


@cache
def queries(backend: str) -> dict[str, Query]:
    """Every statement ``backend`` runs: the common ones and its own, compiled for it."""
    if backend not in BACKENDS:
        raise ValueError(f"no SQL for backend {backend!r}")
    common, own = sources("common"), sources(backend)
    both = sorted(set(common) & set(own))
    if both:
        raise ValueError(f"{backend}/queries.sql redefines common queries: {', '.join(both)}")
    pieces = parts(backend)
    return {
        name: compile_query(name, sql, backend, pieces) for name, sql in {**common, **own}.items()
    }


def compile_query(
    name: str, sql: str, backend: str, pieces: Mapping[str, str] | None = None
) -> Query:
    """``sql`` for ``backend``: its parts filled in, the rewrites above, its placeholders."""
    sql = _PART.sub(lambda m: _part(name, m.group(1), pieces or {}), sql)
    lists = frozenset(_ANY.findall(sql))
    if backend == "sqlite":
        sql = _JSON_AT.sub(_json_at_sqlite, sql)
        sql = _ANY.sub(r"IN (SELECT value FROM json_each(:\1))", sql)
        sql = _LOCK.sub("", _CAST.sub("", sql))
        params = tuple(dict.fromkeys(_PARAM.findall(sql)))
        return Query(name, sql, params, lists, frozenset(params))
    sql = _JSON_AT.sub(_json_at_postgres, sql)
    sql = _CROSS_JOIN.sub("JOIN", _INDEXED_BY.sub("", sql))
    order: dict[str, int] = {}

    def number(m: re.Match[str]) -> str:
        return f"${order.setdefault(m.group(1), len(order) + 1)}"

    sql = _PARAM.sub(number, sql)
    return Query(name, sql, tuple(order), lists, frozenset(order))


def _part(name: str, part: str, pieces: Mapping[str, str]) -> str:
    if part not in pieces:
        raise ValueError(f"query {name!r} uses part {part!r}, which this backend lacks")
    return pieces[part]


def _json_at_sqlite(m: re.Match[str]) -> str:
    param, key, field = m.groups()
    path = f"'$.\"' || {key} || '\"" + (f".{field}'" if field else "'")
    return f"json_extract(:{param}, {path})"


def _json_at_postgres(m: re.Match[str]) -> str:
    # jsonb: the parameter is parsed once per statement and each entry found by key, so a
    # batch of 10,000 rows costs no more per row than one.
    param, key, field = m.groups()
    if field:
        return f"(:{param}::jsonb -> {key}::text ->> '{field}')"
    return f"(:{param}::jsonb ->> {key}::text)"
