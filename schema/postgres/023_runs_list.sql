-- slotless schema v23 (PostgreSQL): indexes for the runs list, as in
-- schema/sqlite/023_runs_list.sql (see there for what each serves). dag_run_by_created
-- (001) was on created_at alone: it now ends with run_id too, the keyset's tie-break, so
-- that a page's bound (created_at, run_id) is one index range.
DROP INDEX dag_run_by_created;
CREATE INDEX dag_run_by_created ON dag_run (created_at, run_id);
CREATE INDEX dag_run_by_logical_date ON dag_run (logical_date);
