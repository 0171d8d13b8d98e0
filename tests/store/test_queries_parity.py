"""The SQL is written once where the dialects agree, and alike where they do not.

Statements that read the same on both backends live once in schema/common/queries.sql;
the rest are in each backend's own file. The code calls statements by name with keyword
parameters, so a statement added to one backend's file and forgotten in the other, or
taking other parameters there, would fail only when that path runs on that backend.
These checks catch it at once, and check that every statement, compiled for each
backend, prepares against the migrated schema.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from support import pg

import schema
from executor.store import open_store

pg_server, pg_url = pg.pg_server, pg.pg_url  # fixtures

NAMES = sorted(schema.queries("sqlite"))


def test_both_backends_define_the_same_dialect_specific_queries() -> None:
    sqlite, postgres = schema.sources("sqlite"), schema.sources("postgres")
    missing = sorted(set(sqlite) - set(postgres))
    extra = sorted(set(postgres) - set(sqlite))
    assert not missing, f"in schema/sqlite/queries.sql but not in postgres: {missing}"
    assert not extra, f"in schema/postgres/queries.sql but not in sqlite: {extra}"
    assert set(schema.queries("sqlite")) == set(schema.queries("postgres"))


def test_a_statement_lives_in_one_place() -> None:
    common = set(schema.sources("common"))
    for backend in schema.BACKENDS:
        assert not common & set(schema.sources(backend)), f"{backend} redefines common queries"


@pytest.mark.parametrize("name", NAMES)
def test_parameters_are_named_alike(name: str) -> None:
    lite, pg_ = schema.queries("sqlite")[name], schema.queries("postgres")[name]
    assert lite.names == pg_.names, (
        f"{name}: sqlite takes {sorted(lite.names)}, postgres {sorted(pg_.names)}"
    )
    assert lite.lists == pg_.lists or name in schema.sources("postgres"), name
    # asyncpg gets $1..$n: every name numbered once, in order of first use
    assert len(pg_.params) == len(pg_.names)


def test_both_backends_have_the_same_migrations() -> None:
    assert [m.version for m in schema.migrations("sqlite")] == [
        m.version for m in schema.migrations("postgres")
    ]


async def test_every_sqlite_query_prepares_against_the_schema(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'x.db'}")  # migrates the new file
    await store.close()
    conn = sqlite3.connect(tmp_path / "x.db")
    problems = []
    try:
        for name, query in schema.queries("sqlite").items():
            try:  # EXPLAIN compiles the statement without running it
                conn.execute("EXPLAIN " + query.sql, dict.fromkeys(query.params))
            except sqlite3.Error as exc:
                problems.append(f"{name}: {exc}")
    finally:
        conn.close()
    assert not problems, "\n".join(problems)


async def test_every_postgres_query_prepares_against_the_schema(pg_url: str) -> None:
    import asyncpg

    store = await open_store(pg_url)  # migrates the fresh schema
    await store.close()
    conn = await asyncpg.connect(pg_url)
    problems = []
    try:
        for name, query in schema.queries("postgres").items():
            try:
                stmt = await conn.prepare(query.sql)
            except asyncpg.PostgresError as exc:
                problems.append(f"{name}: {exc}")
                continue
            if len(stmt.get_parameters()) != len(query.params):
                problems.append(
                    f"{name}: {len(stmt.get_parameters())} parameters, not {len(query.params)}"
                )
    finally:
        await conn.close()
    assert not problems, "\n".join(problems)
