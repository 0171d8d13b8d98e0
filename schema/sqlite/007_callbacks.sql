-- slotless schema v7 (SQLite): callbacks and notifications (executor/notifications.py).
--
-- `hooks` says which events of a task (or a run) have a callback or a notify= target, as a
-- bit mask (executor.notifications.HOOK_BITS), so that the transition that causes an event
-- writes its `callback` row in the same transaction, and a task without hooks costs nothing.
-- A `callback` row is claimed by a worker like a task (owner, heartbeat, lease), runs its
-- handlers in a worker slot, and is retried with backoff; it never changes a task's state.

ALTER TABLE task ADD COLUMN hooks INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dag_run ADD COLUMN hooks INTEGER NOT NULL DEFAULT 0;

CREATE TABLE callback (
    id            INTEGER PRIMARY KEY,
    run_id        TEXT NOT NULL,
    task_row      INTEGER,                    -- NULL for a run's own events
    task_id       TEXT,
    event         TEXT NOT NULL,              -- on_failure, on_retry, ..., late, deadline_missed
    attempt       INTEGER,                    -- the task's attempt the event is about
    message       TEXT,                       -- the error, or what happened, in one text
    context       TEXT,                       -- JSON object: what the recorder adds
    dedup_key     TEXT UNIQUE,                -- NULL, or one event ever (a replayed fire)
    state         TEXT NOT NULL DEFAULT 'PENDING',  -- PENDING | RUNNING | DONE | FAILED
    tries         INTEGER NOT NULL DEFAULT 0,
    delivered     TEXT NOT NULL DEFAULT '[]', -- JSON list: handlers already done (not re-run)
    ready_at      REAL,                       -- claimable from (NULL once ended)
    owner         TEXT,
    heartbeat_at  REAL,
    created_at    REAL NOT NULL,
    ended_at      REAL,
    last_error    TEXT
);
CREATE INDEX callback_claimable ON callback (ready_at) WHERE ready_at IS NOT NULL;
CREATE INDEX callback_running ON callback (heartbeat_at) WHERE state = 'RUNNING';
CREATE INDEX callback_by_run ON callback (run_id);
CREATE INDEX callback_unfinished_by_task ON callback (task_row, id)
    WHERE state IN ('PENDING', 'RUNNING');
