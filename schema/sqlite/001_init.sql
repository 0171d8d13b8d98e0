-- slotless schema v1 (SQLite). Times are UNIX epoch seconds (REAL), JSON is TEXT.

CREATE TABLE dag_run (
    run_id            TEXT PRIMARY KEY,
    dag_id            TEXT NOT NULL,
    logical_date      TEXT NOT NULL,          -- ISO date, e.g. 2026-04-25
    state             TEXT NOT NULL,          -- RUNNING, SUCCESS, FAILED
    dag_file          TEXT,                   -- where workers in other processes import the DAG from
    created_at        REAL NOT NULL,
    ended_at          REAL,
    tasks_unfinished  INTEGER NOT NULL,       -- unmapped task rows not yet terminal
    leaves_failed     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX dag_run_by_date ON dag_run (dag_id, logical_date);

-- One row per task instance. A mapped task has one template row (map_index = -1) that
-- aggregates its instances (map_index >= 0); rows of one run and one task are inserted
-- together so siblings sit next to each other in rowid order.
CREATE TABLE task (
    id                INTEGER PRIMARY KEY,
    run_id            TEXT NOT NULL REFERENCES dag_run (run_id),
    task_id           TEXT NOT NULL,
    map_index         INTEGER NOT NULL DEFAULT -1,
    state             TEXT NOT NULL,
    trigger_rule      TEXT NOT NULL,
    priority          INTEGER NOT NULL DEFAULT 0,
    is_leaf           INTEGER NOT NULL DEFAULT 0,
    expand_from       TEXT,                   -- upstream task id whose output list this task maps over
    map_cap           INTEGER,
    attempt           INTEGER NOT NULL DEFAULT 1,
    max_attempts      INTEGER NOT NULL DEFAULT 1,
    -- readiness counters over parents (for a template: over its instances)
    n_parents         INTEGER NOT NULL DEFAULT 0,
    n_done            INTEGER NOT NULL DEFAULT 0,
    n_success         INTEGER NOT NULL DEFAULT 0,
    n_failed          INTEGER NOT NULL DEFAULT 0,
    n_upstream_failed INTEGER NOT NULL DEFAULT 0,
    n_skipped         INTEGER NOT NULL DEFAULT 0,
    ready_at          REAL,                   -- claimable from this time on; NULL when not claimable
    owner             TEXT,                   -- claim token of the worker holding it (RUNNING only)
    heartbeat_at      REAL,
    started_at        REAL,
    ended_at          REAL,
    updated_at        REAL NOT NULL,
    output            TEXT,                   -- JSON
    map_total         INTEGER,
    item              TEXT,                   -- JSON: a mapped instance's element of the upstream list
    next_method       TEXT,                   -- resume point after a deferral
    next_kwargs       TEXT,                   -- JSON
    trigger_id        INTEGER,
    event             TEXT,                   -- JSON payload of the trigger event that woke it
    soft_fail         INTEGER NOT NULL DEFAULT 0,
    wait_started_at   REAL,                   -- when the current sensor wait began
    wait_timeout_at   REAL,                   -- when the current wait gives up
    UNIQUE (run_id, task_id, map_index)
);
CREATE INDEX task_claimable ON task (priority DESC, ready_at, id) WHERE ready_at IS NOT NULL;
CREATE INDEX task_running ON task (heartbeat_at) WHERE state = 'RUNNING' AND owner IS NOT NULL;
CREATE INDEX task_deferred ON task (trigger_id) WHERE state = 'DEFERRED';
CREATE INDEX task_wait_timeout ON task (wait_timeout_at) WHERE state = 'DEFERRED';

-- The DAG's shape, copied per run so that workers never need the DAG file to settle a run.
CREATE TABLE edge (
    run_id   TEXT NOT NULL,
    parent   TEXT NOT NULL,
    child    TEXT NOT NULL,
    PRIMARY KEY (run_id, parent, child)
) WITHOUT ROWID;

-- Every transition and every log line: the audit log, the task log, the benchmarks' raw data.
CREATE TABLE task_event (
    id          INTEGER PRIMARY KEY,
    task_row    INTEGER NOT NULL,
    ts          REAL NOT NULL,
    kind        TEXT NOT NULL,                -- transition, log, check, error
    from_state  TEXT,
    to_state    TEXT,
    attempt     INTEGER,
    message     TEXT NOT NULL
);
CREATE INDEX task_event_by_task ON task_event (task_row, id);

-- Every interval a worker slot was held, and why.
CREATE TABLE slot_usage (
    id          INTEGER PRIMARY KEY,
    worker_id   TEXT NOT NULL,
    slot        INTEGER NOT NULL,
    task_row    INTEGER NOT NULL,
    kind        TEXT NOT NULL,                -- execute, poke, resume
    started_at  REAL NOT NULL,
    ended_at    REAL NOT NULL
);

-- Serialized triggers; filled by deferrals (see the triggerer).
CREATE TABLE trigger (
    -- AUTOINCREMENT: ids never come back after a cleanup, so triggerers can read new rows by id.
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    classpath   TEXT NOT NULL,
    kwargs      TEXT NOT NULL,                -- JSON
    poke_hash   TEXT NOT NULL,
    shard       INTEGER NOT NULL,
    created_at  REAL NOT NULL,
    description TEXT                          -- the trigger's describe(): what the task waits for
);
CREATE INDEX trigger_by_shard ON trigger (shard);

-- Virtual shards (poke_hash mod 64), each leased by at most one live triggerer.
CREATE TABLE shard_lease (
    shard       INTEGER PRIMARY KEY,
    owner       TEXT,
    expires_at  REAL
);
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 63)
INSERT INTO shard_lease (shard) SELECT i FROM n;

-- Live triggerers, so that each can take its fair share of shards.
CREATE TABLE triggerer (
    id          TEXT PRIMARY KEY,
    seen_at     REAL NOT NULL,
    started_at  REAL NOT NULL,
    triggers    INTEGER NOT NULL DEFAULT 0,
    loop_lag_ms REAL
);
