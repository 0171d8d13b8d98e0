-- slotless schema v4 (SQLite): runs started by the triggerer.
--
-- A schedule or a start condition is a wait without a task: a `start_wait` row pointing at
-- a trigger row, held by the triggerer like any task's wait (same shards, same dedup).
-- When its trigger fires, the triggerer creates the run (once per (dag_id, run_key), see
-- 003) and re-arms the wait on the next trigger row in the same transaction; the re-arm
-- is a compare-and-set on `trigger_id`, so a replayed fire or a takeover re-arms once.
-- A run is created without importing the DAG file: the catalogue stores each DAG's shape
-- (its tasks and edges, as JSON) when it parses the file.

ALTER TABLE dag ADD COLUMN shape TEXT;                   -- JSON: what a run of it inserts
ALTER TABLE dag ADD COLUMN start_date TEXT;              -- ISO 8601, UTC
ALTER TABLE dag ADD COLUMN end_date TEXT;                -- ISO 8601, UTC
ALTER TABLE dag ADD COLUMN catchup INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dag ADD COLUMN max_active_runs INTEGER NOT NULL DEFAULT 16;
ALTER TABLE dag ADD COLUMN start_when TEXT;              -- JSON [classpath, kwargs]: the condition
ALTER TABLE dag ADD COLUMN start_error TEXT;             -- its start wait's last failure, one line
ALTER TABLE dag ADD COLUMN start_error_at REAL;

-- QUEUED: created over max_active_runs, its tasks not yet claimable; started when a run of
-- its DAG ends. data_interval_*: the schedule's interval (ISO 8601, UTC; NULL for a run
-- started by hand on a date); start_event: the payload of the condition that started it.
ALTER TABLE dag_run ADD COLUMN data_interval_start TEXT;
ALTER TABLE dag_run ADD COLUMN data_interval_end TEXT;
ALTER TABLE dag_run ADD COLUMN start_event TEXT;
ALTER TABLE dag_run ADD COLUMN max_active INTEGER;      -- the limit it was queued under
CREATE INDEX dag_run_by_state ON dag_run (dag_id, state);

-- Not checked before this time (a re-armed condition waits its interval before the next check).
ALTER TABLE trigger ADD COLUMN not_before REAL;

CREATE TABLE start_wait (
    id            INTEGER PRIMARY KEY,
    dag_id        TEXT NOT NULL,
    kind          TEXT NOT NULL,              -- schedule | condition
    trigger_id    INTEGER NOT NULL,
    logical_date  TEXT NOT NULL,              -- schedule: the interval's start (UTC); condition: the date it was rendered for
    interval_end  TEXT,                       -- schedule: the interval's end (UTC): when it is due
    armed_at      REAL NOT NULL,
    UNIQUE (dag_id, kind)
);
CREATE INDEX start_wait_by_trigger ON start_wait (trigger_id);
