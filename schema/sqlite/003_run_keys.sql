-- slotless schema v3 (SQLite): run keys and a run's conf.
--
-- A run is created at most once per (dag_id, run_key): the unique index below is what a
-- schedule or a start condition relies on, so that two triggerers, a takeover or a
-- replayed event insert nothing the second time (`insert_run` is ON CONFLICT DO NOTHING).
-- The key of a schedule's run is its logical date; a manual run's key adds a random part
-- unless the person gives one (`slotless trigger --run-key`). Runs created before this
-- migration keep their run_id as their key, which no other run can have.
-- run_key is nullable: a process of the previous release inserts runs without one during
-- a rolling upgrade (NULLs never conflict in the unique index); this code always writes one.

ALTER TABLE dag_run ADD COLUMN run_key TEXT;
ALTER TABLE dag_run ADD COLUMN conf TEXT;                -- JSON object, as triggered; NULL: none
UPDATE dag_run SET run_key = run_id;
CREATE UNIQUE INDEX dag_run_by_key ON dag_run (dag_id, run_key);
