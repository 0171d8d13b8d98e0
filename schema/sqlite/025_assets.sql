-- slotless schema v25 (SQLite): assets and the runs their events start (docs/scheduling.md,
-- "Assets").
--
-- asset: every URI a DAG names (an outlet, a schedule, a watcher) or an event was sent for.
-- asset_event: one row per update. dedup_key makes a replay (an API request retried with
-- its Idempotency-Key, a watcher's fire written twice) insert nothing the second time;
-- NULL for a task's success, which its compare-and-set already makes once.
-- asset_consumer: which DAGs are scheduled on which URIs, filled when the DAG is
-- catalogued; the event's writer finds the DAGs to look at through its index on uri.
-- asset_producer: which tasks declare a URI as an outlet (the page's lineage only).
-- asset_queue: the events a consumer has not consumed yet, one row per (DAG, event),
-- inserted in the event's transaction and deleted by the run that consumes them. A queue
-- rather than a cursor of the last event id: on PostgreSQL ids are handed out before
-- commit, so a smaller id may commit after a larger one was consumed and a cursor would
-- skip it for good.
-- dag.asset_schedule: the DAG's condition as JSON (executor/assets.py).
CREATE TABLE asset (
    uri         TEXT PRIMARY KEY,
    name        TEXT,
    watchers    TEXT,                          -- JSON [[classpath, kwargs], ...]
    created_at  REAL NOT NULL
);

CREATE TABLE asset_event (
    id          INTEGER PRIMARY KEY,
    uri         TEXT NOT NULL,
    ts          REAL NOT NULL,
    source      TEXT NOT NULL,                 -- task | cli | api | watcher
    run_id      TEXT,                          -- source task's run (source = task)
    task_id     TEXT,
    extra       TEXT,                          -- JSON object, at most 64 KiB
    dedup_key   TEXT
);
CREATE INDEX asset_event_by_uri ON asset_event (uri, id);
CREATE UNIQUE INDEX asset_event_by_dedup ON asset_event (dedup_key) WHERE dedup_key IS NOT NULL;

CREATE TABLE asset_consumer (
    dag_id      TEXT NOT NULL,
    uri         TEXT NOT NULL,
    PRIMARY KEY (dag_id, uri)
);
CREATE INDEX asset_consumer_by_uri ON asset_consumer (uri, dag_id);

CREATE TABLE asset_producer (
    dag_id      TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    uri         TEXT NOT NULL,
    PRIMARY KEY (dag_id, task_id, uri)
);
CREATE INDEX asset_producer_by_uri ON asset_producer (uri);

CREATE TABLE asset_queue (
    dag_id      TEXT NOT NULL,
    event_id    INTEGER NOT NULL,
    uri         TEXT NOT NULL,
    PRIMARY KEY (dag_id, event_id)
);

ALTER TABLE dag ADD COLUMN asset_schedule TEXT;
-- dag.asset_watchers: JSON [[uri, classpath, kwargs], ...]: the watchers of the assets the
-- DAG names, armed as its start waits (kind `watch:N:URI`) when its schedule is.
ALTER TABLE dag ADD COLUMN asset_watchers TEXT;
