-- slotless schema v8 (PostgreSQL): the workers that run now (liveness, issue 16).
--
-- A worker writes its row when it starts and removes it when it stops; its heartbeats
-- keep seen_at fresh. The other workers ask, about once a second, whether each listed
-- worker still holds its liveness lock (executor/store/liveness.py) and take back the
-- attempts of one that does not at once, without waiting for stale_after. A row whose
-- worker stopped heartbeating is dropped by the TTL reap.

CREATE TABLE worker (
    id          TEXT PRIMARY KEY,
    started_at  DOUBLE PRECISION NOT NULL,
    seen_at     DOUBLE PRECISION NOT NULL
);
