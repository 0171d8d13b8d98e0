"""`slotless status`: its JSON checked against the store's rows, and the view for people
telling waiting (DEFERRED, SENSING) from sick (RETRYING), with what each task waits for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.helpers import cli, cli_env, ops, sql
from support.ops import settle_ops_run, write_ops_dag

from executor.store import Store, open_store


@pytest.fixture
async def ops_run(store: Store, tmp_path: Path) -> tuple[str, Path]:
    dag_path, inbox = write_ops_dag(tmp_path)
    return await settle_ops_run(store, dag_path), inbox


def status_json(db_url: str, *extra: str) -> dict:
    done = cli("status", "--db", db_url, "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_the_json_matches_the_store(store: Store, db_url: str, db_path: Path, ops_run):
    run_id, inbox = ops_run
    await ops(store).lease_shards("trig-a", 15.0, 15.0)
    await ops(store).triggerer_beat("trig-a", 2, 3.5)

    data = status_json(db_url)
    now = data["now"]

    runs = sql(db_path, "SELECT state, count(*) AS n FROM dag_run GROUP BY state")
    assert data["runs_by_state"] == {r["state"]: r["n"] for r in runs} == {"RUNNING": 1}
    instances = {
        r["state"]: r["n"]
        for r in sql(
            db_path,
            "SELECT state, count(*) AS n FROM task WHERE run_id = ?"
            " AND NOT (map_index = -1 AND map_total IS NOT NULL) GROUP BY state",
            run_id,
        )
    }
    assert [r["run_id"] for r in data["runs"]] == [run_id]
    assert data["runs"][0]["tasks"] == instances
    assert data["tasks_by_state"] == instances
    assert instances["SUCCESS"] == 4  # extract and the three instances of shard

    # DEFERRED: both sensors, waiting for the description the worker stored, sharing a check.
    rows = {
        r["task_id"]: r
        for r in sql(
            db_path,
            "SELECT t.*, g.description, g.poke_hash, g.shard, g.classpath FROM task t"
            " JOIN trigger g ON g.id = t.trigger_id WHERE t.state = 'DEFERRED'",
        )
    }
    deferred = data["waiting"]["DEFERRED"]
    assert deferred["count"] == len(rows) == 2
    assert {t["task_id"] for t in deferred["tasks"]} == set(rows)
    for t in deferred["tasks"]:
        row = rows[t["task_id"]]
        assert row["description"] == f"file://{inbox}/ready.flag"
        assert t["waits_for"] == row["description"]
        assert t["trigger"] == {
            "id": row["trigger_id"],
            "classpath": "triggers.files.FileTrigger",
            "poke_hash": row["poke_hash"],
            "shard": row["shard"],
            "description": row["description"],
        }
        assert t["since"] == row["wait_started_at"]
        assert t["for_seconds"] == pytest.approx(now - row["wait_started_at"], abs=0.002)
        assert t["timeout_at"] == row["wait_timeout_at"]
        span = row["wait_timeout_at"] - row["wait_started_at"]
        assert t["timeout_used"] == pytest.approx((now - row["wait_started_at"]) / span, abs=1e-4)
        assert t["checked_by"] == "trig-a"
        assert t["resumes_at"] is None  # a sensor: the triggerer finishes it
        assert (t["attempt"], t["max_attempts"]) == (row["attempt"], row["max_attempts"])
    assert len({t["trigger"]["poke_hash"] for t in deferred["tasks"]}) == 1

    # SENSING: the reschedule-mode sensor, its next check, what it checks.
    (sensing,) = data["waiting"]["SENSING"]["tasks"]
    (row,) = sql(db_path, "SELECT * FROM task WHERE state = 'SENSING'")
    assert sensing["task_id"] == row["task_id"] == "poll_marker"
    assert sensing["waits_for"] == f"file://{inbox}/marker"
    assert sensing["next_check_at"] == row["ready_at"]
    assert sensing["since"] == row["wait_started_at"]
    assert sensing["timeout_at"] == row["wait_timeout_at"]

    # RETRYING: how long it has been retrying, when the next attempt is due, why it failed.
    (retrying,) = data["waiting"]["RETRYING"]["tasks"]
    (row,) = sql(db_path, "SELECT * FROM task WHERE state = 'RETRYING'")
    (first,) = sql(
        db_path,
        "SELECT min(ts) AS ts FROM task_event WHERE task_row = ? AND to_state = 'RETRYING'",
        row["id"],
    )
    assert retrying["task_id"] == "flaky"
    assert (retrying["attempt"], retrying["max_attempts"]) == (2, 4)
    assert retrying["waits_for"] == "attempt 2 of 4"
    assert retrying["next_attempt_at"] == row["ready_at"]
    assert retrying["since"] == first["ts"]
    assert "RuntimeError: upstream API answered 503" in retrying["last_error"]

    # Triggerers: the shards it leases, its heartbeat, what it holds, its loop lag.
    leased = sql(db_path, "SELECT shard FROM shard_lease WHERE owner = 'trig-a' ORDER BY shard")
    (beat,) = sql(db_path, "SELECT * FROM triggerer")
    (trig,) = data["triggerers"]
    assert trig["id"] == "trig-a"
    assert trig["shards"] == [r["shard"] for r in leased] == list(range(64))
    assert trig["shard_count"] == 64
    assert trig["triggers"] == 2
    assert trig["loop_lag_ms"] == 3.5
    assert trig["heartbeat_age_seconds"] == pytest.approx(now - beat["seen_at"], abs=0.002)
    assert trig["stale"] is False
    assert data["shards"] == {"total": 64, "unowned": 0}


async def test_the_json_keeps_its_keys_in_their_order(db_url: str, ops_run) -> None:
    """The JSON is the typed view's fields (slotless/views.py): the keys, and their order,
    that scripts reading ``status --json`` and /api/status were given before it was typed."""
    data = status_json(db_url)
    assert list(data) == [
        "now", "runs_by_state", "runs", "attention", "tasks_by_state", "waiting",
        "triggerers", "shards", "pools", "queues", "held_back",
    ]  # fmt: skip
    assert list(data["runs"][0]) == [
        "run_id", "dag_id", "logical_date", "state", "created_at", "ended_at", "tasks", "reason",
        "logical_time", "logical_shown", "run_type",  # added after: at the end
    ]  # fmt: skip
    head = ["run_id", "task_id", "map_index", "state", "attempt", "max_attempts", "since"]
    waits = {state: data["waiting"][state]["tasks"][0] for state in data["waiting"]}
    assert list(waits["DEFERRED"]) == [
        *head, "timeout_at", "timeout_used", "waits_for", "trigger", "checked_by", "resumes_at",
        "for_seconds",
    ]  # fmt: skip
    assert list(waits["SENSING"]) == [
        *head, "timeout_at", "timeout_used", "waits_for", "last_check", "next_check_at",
        "for_seconds",
    ]  # fmt: skip
    assert list(waits["RETRYING"]) == [
        *head, "waits_for", "next_attempt_at", "last_error", "for_seconds",
    ]  # fmt: skip
    assert list(data["waiting"]["DEFERRED"]) == ["count", "oldest_seconds", "tasks"]
    assert list(data["pools"][0]) == ["name", "slots", "used", "ready"]
    assert list(data["queues"][0]) == ["name", "declared", "workers", "slots", "ready", "served"]


async def test_limit_keeps_the_longest_waits_and_the_full_counts(store: Store, db_url, ops_run):
    data = status_json(db_url, "--limit", "1")
    deferred = data["waiting"]["DEFERRED"]
    assert deferred["count"] == 2
    assert [t["task_id"] for t in deferred["tasks"]] == ["wait_for_file"]  # waiting longest


async def test_the_view_for_people_tells_waiting_from_sick(store: Store, db_url: str, ops_run):
    run_id, inbox = ops_run
    done = cli("status", "--db", db_url, env=cli_env(COLUMNS="250"))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for heading in ("DEFERRED: waiting in the triggerer", "SENSING: reschedule-mode", "RETRYING:"):
        assert heading in text
    assert run_id in text
    assert f"file://{inbox}/ready.flag" in text
    assert "upstream API answered 503" in text
    assert "attempt 2 of 4 in" in text
    # No triggerer holds the shards: say that the waits are not being checked.
    assert "64 of 64 shards have no live triggerer" in text
    assert "nobody (shard not leased)" in text


async def test_an_empty_database(db_url: str) -> None:
    await (await open_store(db_url)).close()  # a database with the schema and no run
    data = status_json(db_url)
    assert data["runs"] == [] and data["runs_by_state"] == {} and data["triggerers"] == []
    assert all(
        w == {"count": 0, "oldest_seconds": None, "tasks": []} for w in data["waiting"].values()
    )
    done = cli("status", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert "runs: none" in done.stdout


def test_a_missing_database_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    for args in (("status",), ("logs", "some-run", "some-task")):
        done = cli(*args, "--db", f"sqlite:///{missing}")
        assert done.returncode == 2
        assert f"no database at {missing}" in done.stderr
        assert not missing.exists()
