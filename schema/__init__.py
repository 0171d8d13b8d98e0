"""SQL for every backend: versioned DDL files and named queries, loaded once.

Each backend has a folder: ``NNN_name.sql`` files are migrations applied in order, and
``queries.sql`` holds every statement the code runs, each under a ``-- name: NAME`` line.
Parameters are positional and numbered (``?1`` on SQLite, ``$1`` on PostgreSQL) in the same
order on both backends, so Python code calls a query by name without knowing the dialect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_MIGRATION = re.compile(r"^(\d{3})_(\w+)\.sql$")
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


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
def queries(backend: str) -> dict[str, str]:
    text = (resources.files(__package__) / backend / "queries.sql").read_text()
    parts = _NAME.split(text)
    # parts: [preamble, name1, sql1, name2, sql2, ...]
    out: dict[str, str] = {}
    for name, sql in zip(parts[1::2], parts[2::2], strict=True):
        if name in out:
            raise ValueError(f"query {name!r} defined twice in {backend}/queries.sql")
        out[name] = sql.strip().rstrip(";")
    return out
