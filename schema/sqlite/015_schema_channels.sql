-- slotless schema v14 (SQLite): nothing to change.
--
-- On PostgreSQL this version scopes NOTIFY channels to their schema. A SQLite database is
-- one file with no LISTEN/NOTIFY: it keeps the version number in step and changes nothing.
SELECT 1;
