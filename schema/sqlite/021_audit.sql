-- slotless schema v21 (SQLite): the audit list, every write through the web page or the
-- JSON API under the name of the token that made it, refused ones too
-- (executor/store/audit.py). Appended only; one row per write.
CREATE TABLE audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    ts       REAL NOT NULL,
    who      TEXT NOT NULL,                  -- the token's name
    role     TEXT NOT NULL,                  -- its role then: viewer, operator, admin
    via      TEXT NOT NULL CHECK (via IN ('web', 'api', 'cli')),
    action   TEXT NOT NULL,                  -- slotless.roles.NEEDS's name: trigger, pause, ...
    target   TEXT NOT NULL,                  -- dag:ID, run:ID, task:RUN/TASK, pool:NAME, ...
    detail   TEXT NOT NULL,                  -- JSON: the form or body's fields, the result
    outcome  TEXT NOT NULL CHECK (outcome IN ('ok', 'refused'))
);
CREATE INDEX audit_by_time ON audit (ts);
