-- slotless schema v23 (SQLite): indexes for the runs list (`GET /runs`, `GET /api/v1/runs`,
-- executor/store/runlist.py, schema/common/runs.sql).
--
-- The list is newest first, paged by keyset on (created_at, run_id): each page is an index
-- walk that stops after a page's rows, however deep the page, instead of a sort of every
-- run. dag_run_by_created serves the list with no DAG asked for; dag_run_by_dag_created
-- (022, the DAG page's) serves a DAG's runs, the common filter, in the same order without
-- a sort; dag_run_by_logical_date finds a short range of logical dates without a walk of
-- every run newer than it (a backfill's old dates are created late).
-- A state, a run type, a date range and a text are checked on the runs walked: a page of
-- them is found within a few hundred runs unless they are rare. dag_run_by_created holds
-- the columns those checks read, so that SQLite checks them in the index and reads a
-- run's row only when it matches (a walk of 100,000 runs finding none: 30-45 ms, not
-- 110 ms); it is not the table twice over: no conf, no dag_file, no timing columns.
CREATE INDEX dag_run_by_created
    ON dag_run (created_at, run_id, state, run_type, logical_date, run_key);
CREATE INDEX dag_run_by_logical_date ON dag_run (logical_date);
