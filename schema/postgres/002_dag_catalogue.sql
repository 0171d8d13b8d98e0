-- slotless schema v2 (PostgreSQL): the DAG catalogue, the same tables as
-- schema/sqlite/002_dag_catalogue.sql (see there for why a file and a DAG are two rows).

CREATE TABLE dag_file (
    path         TEXT PRIMARY KEY,
    mtime        DOUBLE PRECISION,
    parsed_at    DOUBLE PRECISION NOT NULL,
    parse_error  TEXT
);

CREATE TABLE dag (
    dag_id             TEXT PRIMARY KEY,
    file               TEXT NOT NULL REFERENCES dag_file (path),
    schedule           TEXT,
    timezone           TEXT NOT NULL DEFAULT 'UTC',
    paused             INTEGER NOT NULL DEFAULT 0,
    next_logical_date  TEXT,
    parse_error        TEXT,
    file_mtime         DOUBLE PRECISION,
    parsed_at          DOUBLE PRECISION NOT NULL
);
CREATE INDEX dag_by_file ON dag (file);
