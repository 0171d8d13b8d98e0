"""Versioned schema files: applied on open and recorded, an older database migrated, a
failed migration rolled back whole, a newer database refused."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import date
from pathlib import Path

import pytest
from support.helpers import sql

import schema
from executor import DAG
from executor.driver.sqlite import _statements
from executor.store import SchemaTooNew, open_store

REAL = schema.migrations("sqlite")


def versions(db_path: Path) -> list[tuple[int, str]]:
    return [
        (r["version"], r["name"])
        for r in sql(db_path, "SELECT version, name FROM schema_version ORDER BY version")
    ]


def columns(db_path: Path, table: str) -> list[str]:
    return [r["name"] for r in sql(db_path, f"PRAGMA table_info({table})")]


def only_first_migration(db_path: Path) -> None:
    """A database as the first released slotless left it: migration 1 only, with a run."""
    first = REAL[0]
    assert first.version == 1
    conn = sqlite3.connect(db_path)
    with conn:
        for statement in _statements(first.sql):
            conn.execute(statement)
        conn.execute(
            "CREATE TABLE schema_version"
            " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        conn.execute("INSERT INTO schema_version VALUES (1, ?, 0)", (first.name,))
        conn.execute(
            "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at,"
            " tasks_unfinished) VALUES ('old:run', 'old', '2025-01-01', 'SUCCESS', 0, 0)"
        )
    conn.close()


def test_migration_files_are_numbered_from_one_without_gaps() -> None:
    assert [m.version for m in REAL] == list(range(1, len(REAL) + 1))
    assert len(set(schema.queries("sqlite"))) == len(schema.queries("sqlite"))


async def test_fresh_database_gets_every_migration_and_wal(db_path: Path, db_url: str) -> None:
    store = await open_store(db_url)
    await store.close()
    assert versions(db_path) == [(m.version, m.name) for m in REAL]
    assert sql(db_path, "PRAGMA journal_mode")[0]["journal_mode"] == "wal"
    # opening again applies nothing twice
    store = await open_store(db_url)
    await store.close()
    assert versions(db_path) == [(m.version, m.name) for m in REAL]


async def test_older_database_is_migrated(db_path: Path, db_url: str, monkeypatch) -> None:
    """Only migration 1 applied, and this slotless knows more: the rest is applied in order,
    recorded in schema_version, and the data already there survives."""
    extra = schema.Migration(
        REAL[-1].version + 1,
        "test_added_column",
        "-- a later migration, as a future release would ship it\n"
        "ALTER TABLE dag_run ADD COLUMN test_note TEXT;\n"
        "CREATE INDEX dag_run_test_note ON dag_run (test_note);\n",
    )
    monkeypatch.setattr(schema, "migrations", lambda backend: (*REAL, extra))
    only_first_migration(db_path)
    assert versions(db_path) == [(1, REAL[0].name)]

    store = await open_store(db_url)
    try:
        assert (await store.views.run_info("old:run") or {})["state"] == "SUCCESS"
        dag = DAG("after_upgrade")
        dag.task(lambda ctx: None, task_id="t")
        run_id = await store.runs.create_run(dag, date(2026, 1, 1))  # the new schema works
    finally:
        await store.close()
    assert versions(db_path) == [(m.version, m.name) for m in (*REAL, extra)]
    assert "test_note" in columns(db_path, "dag_run")
    assert {r["run_id"] for r in sql(db_path, "SELECT run_id FROM dag_run")} == {
        "old:run",
        run_id,
    }


async def test_failed_migration_leaves_nothing_half_written(
    db_path: Path, db_url: str, monkeypatch
) -> None:
    bad = schema.Migration(
        REAL[-1].version + 1,
        "test_broken",
        "CREATE TABLE test_half (x INTEGER);\n"
        "ALTER TABLE dag_run ADD COLUMN test_half TEXT;\n"
        "ALTER TABLE no_such_table ADD COLUMN y TEXT;\n",
    )
    monkeypatch.setattr(schema, "migrations", lambda backend: (*REAL, bad))
    only_first_migration(db_path)
    before = sql(db_path, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        await open_store(db_url)
    # all or nothing: not even the real migrations after 1 are recorded or applied
    assert versions(db_path) == [(1, REAL[0].name)]
    assert sql(db_path, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == before
    assert "test_half" not in columns(db_path, "dag_run")


async def test_newer_database_is_refused(db_path: Path, db_url: str) -> None:
    store = await open_store(db_url)
    await store.close()
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("INSERT INTO schema_version VALUES (999, 'future', 0)")
    conn.close()
    with pytest.raises(SchemaTooNew) as err:
        await open_store(db_url)
    message = str(err.value)
    assert "schema version 999" in message
    assert f"newer than the {REAL[-1].version} this slotless knows" in message
    assert "\n" not in message
    assert [v for v, _ in versions(db_path)] == [m.version for m in REAL] + [999]


async def test_racing_openers_of_a_new_file_migrate_it_once(tmp_path: Path) -> None:
    """Processes that open one new file at once (a worker and a triggerer started together)
    all succeed, and the migrations are applied once. The race is short and rare (switching
    a new file to WAL used to fail with "database is locked"): try it many times."""
    for i in range(40):
        db_path = tmp_path / f"race{i}.db"
        opened = await asyncio.gather(
            *[open_store(f"sqlite:///{db_path}") for _ in range(4)], return_exceptions=True
        )
        for s in opened:
            if not isinstance(s, BaseException):
                await s.close()
        errors = [s for s in opened if isinstance(s, BaseException)]
        assert not errors, f"round {i}: {errors!r}"
        assert versions(db_path) == [(m.version, m.name) for m in REAL]
