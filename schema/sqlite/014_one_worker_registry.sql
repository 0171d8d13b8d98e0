-- slotless schema v13 (SQLite): one registry of workers.
--
-- The liveness row of 009 (worker) and the queue registry of 006 (queue_worker) described
-- the same processes with two heartbeats and two expiries. Now the worker row alone says
-- when a worker was last seen and until when it counts as live (expires_at, its own
-- stale_after ahead); worker_queue only lists what it serves. So a worker found dead by its
-- liveness lock, or reaped after its TTL, stops counting for its queues in the same
-- transaction that takes back its attempts. The rows of queue_worker are not carried over:
-- each worker writes its queues with every heartbeat, from its start.

ALTER TABLE worker ADD COLUMN expires_at REAL;

CREATE TABLE worker_queue (
    worker_id   TEXT NOT NULL,
    queue       TEXT NOT NULL,
    slots       INTEGER NOT NULL,
    PRIMARY KEY (worker_id, queue)
);
CREATE INDEX worker_queue_queue ON worker_queue (queue);

DROP TABLE queue_worker;
