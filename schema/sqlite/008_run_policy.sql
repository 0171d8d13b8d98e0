-- slotless schema v8 (SQLite): deadlines, dagrun_timeout, a sensor's expected_by, and the
-- run failure policy (executor/runpolicy.py, executor/store/runwaits.py).
--
-- A run carries its DAG's policy, fixed when it is created (a changed DAG file changes the
-- next runs, not this one). Its times are waits without a task, held by the triggerer like
-- start waits (004): a `run_wait` row pointing at a trigger row (a DateTimeTrigger at the
-- moment; runs due at one moment share the check), loaded beside the tasks' waits. The
-- fire deletes its row in the outbox's transaction, so a replayed fire does nothing; a run
-- that ends deletes its waits.

ALTER TABLE dag_run ADD COLUMN on_task_failure TEXT NOT NULL DEFAULT 'continue';
ALTER TABLE dag_run ADD COLUMN deadline_at REAL;         -- when it should have ended (epoch s)
ALTER TABLE dag_run ADD COLUMN timeout_s REAL;           -- dagrun_timeout, from when it runs
ALTER TABLE dag_run ADD COLUMN late_at TEXT;             -- JSON {sensor task_id: epoch s}: expected_by
ALTER TABLE dag_run ADD COLUMN deadline_missed_at REAL;  -- when its deadline passed unfinished
ALTER TABLE dag_run ADD COLUMN state_reason TEXT;        -- why it paused, failed fast, was cancelled

CREATE TABLE run_wait (
    id          INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL,
    kind        TEXT NOT NULL,              -- deadline | timeout | late
    task_id     TEXT NOT NULL DEFAULT '',   -- late: the sensor it is about
    trigger_id  INTEGER NOT NULL,
    due_at      REAL NOT NULL,
    armed_at    REAL NOT NULL,
    UNIQUE (run_id, kind, task_id)
);
CREATE INDEX run_wait_by_trigger ON run_wait (trigger_id);
