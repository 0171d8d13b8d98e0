-- slotless schema v6 (PostgreSQL): pools and queues (executor/pools.py holds the rules).
--
-- A task names a pool (how many of its kind may run at once, anywhere) and a queue (which
-- workers may run it). `default` is both the default pool, unlimited and never stored, and
-- the default queue, always known. A pool's used slots are not stored: they are the sum of
-- pool_slots over its RUNNING rows, counted by the claim that needs them (task_pool_running
-- keeps that count proportional to the pool's size), so a task leaving RUNNING for any
-- reason (success, retry, deferral, reaping, cancel) frees its slots with nothing to undo.

ALTER TABLE task ADD COLUMN pool TEXT NOT NULL DEFAULT 'default';
ALTER TABLE task ADD COLUMN pool_slots INTEGER NOT NULL DEFAULT 1;
ALTER TABLE task ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';

-- A mapped task's template is RUNNING while its instances run, and holds no slot.
CREATE INDEX task_pool_running ON task (pool)
    WHERE state = 'RUNNING' AND (map_index >= 0 OR expand_from IS NULL);

CREATE TABLE pool (
    name        TEXT PRIMARY KEY,
    slots       INTEGER NOT NULL CHECK (slots >= 0),
    updated_at  DOUBLE PRECISION NOT NULL
);

CREATE TABLE queue (
    name        TEXT PRIMARY KEY,
    created_at  DOUBLE PRECISION NOT NULL
);

-- Which queues each running worker serves, renewed with its heartbeat: what `slotless
-- status` reads to say that nobody serves a queue. A row whose expires_at has passed is a
-- worker that stopped without saying so.
CREATE TABLE queue_worker (
    worker_id   TEXT NOT NULL,
    queue       TEXT NOT NULL,
    slots       INTEGER NOT NULL,
    seen_at     DOUBLE PRECISION NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (worker_id, queue)
);
