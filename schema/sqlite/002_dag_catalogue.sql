-- slotless schema v2 (SQLite): the DAG catalogue, filled by executor/catalogue.py.
--
-- Two tables, because a file and a DAG are different things: a file that fails to import
-- declares no dag_id, yet must be listed with its error. `dag_file` has one row per file
-- of a scanned folder (its mtime as last parsed, and its error); `dag` has one row per
-- declared DAG, pointing at the file that declares it. When a file that parsed before
-- breaks, its DAGs keep their rows (and their `paused` flag) with `parse_error` set.

CREATE TABLE dag_file (
    path         TEXT PRIMARY KEY,            -- absolute, resolved
    mtime        REAL,                        -- as last parsed; NULL: parse again next scan
    parsed_at    REAL NOT NULL,
    parse_error  TEXT                         -- one line; NULL when the last parse succeeded
);

CREATE TABLE dag (
    dag_id             TEXT PRIMARY KEY,
    file               TEXT NOT NULL REFERENCES dag_file (path),
    schedule           TEXT,                  -- as declared; nothing interprets it yet
    timezone           TEXT NOT NULL DEFAULT 'UTC',
    paused             INTEGER NOT NULL DEFAULT 0,
    next_logical_date  TEXT,                  -- not computed yet
    parse_error        TEXT,                  -- its file's error, while the file is broken
    file_mtime         REAL,                  -- the file's mtime when it last declared this DAG
    parsed_at          REAL NOT NULL
);
CREATE INDEX dag_by_file ON dag (file);
