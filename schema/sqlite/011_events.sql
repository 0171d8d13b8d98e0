-- slotless schema v11 (SQLite): events, pushed and never polled (executor/store/events.py).
--
-- An event is stored with its name and JSON payload and kept for a retention window (the
-- triggerer holding shard 0 prunes it in batches). A wait for an event is a task DEFERRED
-- on a trigger row whose `event_key` is a hash of the event name and the payload values it
-- matches; triggerers never load such rows (only their timeouts are theirs). The event's
-- writer settles the waits it matches in its own transaction: for each field set its name
-- is waited on (`event_shape`), it computes the key from its payload and looks it up.
-- A wait that begins looks for a matching event already stored in the same transaction
-- that makes it DEFERRED. `event_woke` says which waits each event woke.

ALTER TABLE trigger ADD COLUMN event_key TEXT;
CREATE INDEX trigger_by_event_key ON trigger (event_key) WHERE event_key IS NOT NULL;

CREATE TABLE event (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    name     TEXT NOT NULL,
    payload  TEXT NOT NULL,                  -- JSON, at most 64 KiB
    sent_at  REAL NOT NULL,
    source   TEXT NOT NULL                   -- who sent it: cli:USER, api:TOKEN-NAME, python
);
CREATE INDEX event_by_name ON event (name, sent_at);
CREATE INDEX event_by_time ON event (sent_at);

-- The field sets each event name is waited on with (sorted JSON lists of field names).
CREATE TABLE event_shape (
    name     TEXT NOT NULL,
    fields   TEXT NOT NULL,
    first_at REAL NOT NULL,
    PRIMARY KEY (name, fields)
) WITHOUT ROWID;

CREATE TABLE event_woke (
    event_id INTEGER NOT NULL,
    task_row INTEGER NOT NULL,
    woke_at  REAL NOT NULL,
    PRIMARY KEY (event_id, task_row)
) WITHOUT ROWID;
CREATE INDEX event_woke_by_task ON event_woke (task_row);
