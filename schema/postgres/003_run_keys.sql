-- slotless schema v3 (PostgreSQL): run keys and a run's conf, as in
-- schema/sqlite/003_run_keys.sql (see there for what the key means). run_key stays
-- nullable, as on SQLite: a process of the previous release inserts runs without one
-- during a rolling upgrade, and NULLs never conflict in the unique index.

ALTER TABLE dag_run ADD COLUMN run_key TEXT;
ALTER TABLE dag_run ADD COLUMN conf TEXT;
UPDATE dag_run SET run_key = run_id;
CREATE UNIQUE INDEX dag_run_by_key ON dag_run (dag_id, run_key);
