-- slotless schema v5 (SQLite): waits released by an operator, for the triggerers.
--
-- A triggerer holds each wait in memory until a full reload (every minute) finds its row
-- gone. A cancel or a clear that ends DEFERRED waits writes them here too, in its own
-- transaction; the triggerers read new rows on their next incremental load (every second,
-- at once on PostgreSQL's NOTIFY) and drop those waits. Rows older than an hour are pruned
-- by the triggerers' orphan sweep. A row a triggerer misses (PostgreSQL commits ids out of
-- order) is dropped by its next full reload, as before.

CREATE TABLE wait_release (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_row     INTEGER NOT NULL,
    trigger_id   INTEGER NOT NULL,
    released_at  REAL NOT NULL
);
