"""The SQL is written once where the dialects agree, and alike where they do not.

Statements that read the same on both backends live once in schema/common/queries.sql
(the compiler translating casts, row locks, planner hints, JSON look-ups and the
backends' parts); the rest are in each backend's own file. The code calls statements by
name with keyword parameters, so a statement added to one backend's file and forgotten
in the other, or taking other parameters there, would fail only when that path runs on
that backend.
These checks catch it at once, and check that every statement, compiled for each
backend, prepares against the migrated schema.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import fields
from pathlib import Path

import pytest
from support import pg

import schema
from executor.rows import MovedTask
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


def test_both_backends_define_the_same_parts() -> None:
    assert set(schema.parts("sqlite")) == set(schema.parts("postgres"))
    used = {
        part
        for sql in schema.sources("common").values()
        for part in re.findall(r"\{\{(\w+)\}\}", sql)
    }
    assert used == set(schema.parts("sqlite")), "a part no common statement uses, or missing"


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


def compiled(sql: str, backend: str) -> str:
    return " ".join(schema.compile_query("q", sql, backend).sql.split())


@pytest.mark.parametrize(
    ("written", "sqlite", "postgres"),
    [
        (
            "SELECT id FROM task WHERE id = ANY(:ids::bigint[])",
            "SELECT id FROM task WHERE id IN (SELECT value FROM json_each(:ids))",
            "SELECT id FROM task WHERE id = ANY($1::bigint[])",
        ),
        (
            "SELECT (t.id % :n::integer)::integer AS k FROM task t",
            "SELECT (t.id % :n) AS k FROM task t",
            "SELECT (t.id % $1::integer)::integer AS k FROM task t",
        ),
        (
            "SELECT t.id FROM task t ORDER BY t.id LIMIT :n FOR UPDATE OF t SKIP LOCKED",
            "SELECT t.id FROM task t ORDER BY t.id LIMIT :n",
            "SELECT t.id FROM task t ORDER BY t.id LIMIT $1 FOR UPDATE OF t SKIP LOCKED",
        ),
        (
            "SELECT id FROM c WHERE id IN (SELECT id FROM c LIMIT 1 FOR UPDATE SKIP LOCKED)",
            "SELECT id FROM c WHERE id IN (SELECT id FROM c LIMIT 1)",
            "SELECT id FROM c WHERE id IN (SELECT id FROM c LIMIT 1 FOR UPDATE SKIP LOCKED)",
        ),
        (
            "SELECT shard FROM shard_lease WHERE owner = :o FOR SHARE",
            "SELECT shard FROM shard_lease WHERE owner = :o",
            "SELECT shard FROM shard_lease WHERE owner = $1 FOR SHARE",
        ),
        (
            "SELECT id FROM w WHERE id = ANY(:ids) ORDER BY id FOR UPDATE",
            "SELECT id FROM w WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id",
            "SELECT id FROM w WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        ),
        (
            "SELECT 1 FROM trigger g INDEXED BY trigger_person CROSS JOIN task t ON t.x = g.id",
            "SELECT 1 FROM trigger g INDEXED BY trigger_person CROSS JOIN task t ON t.x = g.id",
            "SELECT 1 FROM trigger g JOIN task t ON t.x = g.id",
        ),
        (
            "SELECT json_at(:rows, id, 'event'), json_at(:m, t.id)::float8 FROM task t",
            "SELECT json_extract(:rows, '$.\"' || id || '\".event'),"
            " json_extract(:m, '$.\"' || t.id || '\"') FROM task t",
            "SELECT ($1::jsonb -> id::text ->> 'event'), ($2::jsonb ->> t.id::text)::float8"
            " FROM task t",
        ),
    ],
)
def test_the_compiler_translates_a_common_statement(
    written: str, sqlite: str, postgres: str
) -> None:
    """Each rewrite that lets a statement be written once, on the backend it is for."""
    assert compiled(written, "sqlite") == sqlite
    assert compiled(written, "postgres") == postgres


def test_no_dialect_spelling_reaches_the_other_backend() -> None:
    for name, query in schema.queries("sqlite").items():
        for spelling in ("::", "FOR UPDATE", "FOR SHARE", "json_at(", "{{", "jsonb"):
            assert spelling not in query.sql, f"{name} on SQLite has {spelling!r}"
    for name, query in schema.queries("postgres").items():
        for spelling in ("INDEXED BY", "CROSS JOIN", "json_extract", "json_at(", "{{"):
            assert spelling not in query.sql, f"{name} on PostgreSQL has {spelling!r}"


def test_a_part_a_backend_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="part 'nope'"):
        schema.compile_query("q", "SELECT 1 {{nope}}", "sqlite", {})


@pytest.mark.parametrize("backend", schema.BACKENDS)
def test_cas_returns_every_column_a_moved_task_reads(backend: str) -> None:
    """MovedTask is read from cas's rows by column name: each of its columns must be there."""
    sql = schema.queries(backend)["cas"].sql
    returned = sql[sql.rindex("RETURNING") :]
    wanted = [f.name for f in fields(MovedTask) if f.name != "inputs"]
    missing = [c for c in wanted if not re.search(rf"\b{c}\b", returned)]
    assert not missing, f"cas on {backend} does not return {missing}"


@pytest.mark.parametrize("backend", schema.BACKENDS)
def test_cas_keeps_the_expected_state_out_of_the_plan(backend: str) -> None:
    """A bare `state = :expected` costs SQLite a compile per transition (its partial
    indexes name state) and PostgreSQL a scan of a partial index: see the statement."""
    sql = schema.queries(backend)["cas"].sql
    where = sql[sql.index("WHERE") : sql.index("RETURNING")]
    assert "(state || '') = " in where
    assert not re.search(r"\bstate\s*=\s*[:$+]", where)


@pytest.mark.parametrize("name", sorted(schema.sources("sqlite")))
def test_a_twin_is_not_one_the_compiler_could_write(name: str) -> None:
    """A statement in both backends' files must differ by more than the rewrites: neither
    spelling, compiled for the other backend, is already that backend's."""
    pg_, lite = schema.sources("postgres")[name], schema.sources("sqlite")[name]
    for backend in schema.BACKENDS:
        assert compiled(pg_, backend) != compiled(lite, backend), (
            f"{name} differs only by what compile_query rewrites: write it once in common"
        )
