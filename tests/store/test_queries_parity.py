"""Both backends define every named query, with the same parameters in the same order.

The code calls queries by name without knowing the dialect, so a query added to one
backend's queries.sql and forgotten in the other would fail only when that path runs on
that backend. These checks catch it at once: names, parameter counts, and (PostgreSQL)
that every statement prepares against the migrated schema with the same parameter count.
"""

from __future__ import annotations

import re

import pytest
from support import pg

import schema
from executor.store import open_store

pg_server, pg_url = pg.pg_server, pg.pg_url  # fixtures

_COMMENT = re.compile(r"--[^\n]*")


def params(sql: str, marker: str) -> set[int]:
    body = _COMMENT.sub("", sql)
    return {int(n) for n in re.findall(re.escape(marker) + r"(\d+)", body)}


def test_both_backends_define_the_same_queries() -> None:
    sqlite, postgres = schema.queries("sqlite"), schema.queries("postgres")
    missing = sorted(set(sqlite) - set(postgres))
    extra = sorted(set(postgres) - set(sqlite))
    assert not missing, f"in schema/sqlite/queries.sql but not in postgres: {missing}"
    assert not extra, f"in schema/postgres/queries.sql but not in sqlite: {extra}"


@pytest.mark.parametrize("name", sorted(schema.queries("sqlite")))
def test_parameters_are_numbered_alike(name: str) -> None:
    lite = params(schema.queries("sqlite")[name], "?")
    pg = params(schema.queries("postgres").get(name, ""), "$")
    assert lite == set(range(1, len(lite) + 1)), f"sqlite {name}: parameters {sorted(lite)}"
    assert pg == lite, f"{name}: sqlite uses ?{sorted(lite)}, postgres ${sorted(pg)}"


def test_both_backends_have_the_same_migrations() -> None:
    assert [m.version for m in schema.migrations("sqlite")] == [
        m.version for m in schema.migrations("postgres")
    ]


async def test_every_postgres_query_prepares_against_the_schema(pg_url: str) -> None:
    import asyncpg

    store = await open_store(pg_url)  # migrates the fresh schema
    await store.close()
    conn = await asyncpg.connect(pg_url)
    problems = []
    try:
        for name, sql in schema.queries("postgres").items():
            try:
                stmt = await conn.prepare(sql)
            except asyncpg.PostgresError as exc:
                problems.append(f"{name}: {exc}")
                continue
            expected = len(params(schema.queries("sqlite").get(name, ""), "?"))
            if len(stmt.get_parameters()) != expected:
                problems.append(f"{name}: {len(stmt.get_parameters())} parameters, not {expected}")
    finally:
        await conn.close()
    assert not problems, "\n".join(problems)
