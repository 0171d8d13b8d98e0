-- slotless schema v22 (PostgreSQL): a DAG's runs in the order they were created, and its
-- runs by date with their states.
--
-- A DAG's page (slotless/web/dag_page.py) shows its runs newest first and pages back
-- through all of them by keyset, (created_at, run_id) < the last one shown
-- (grid_runs_before in schema/common/grid.sql). Without this index that read every run of
-- the DAG and sorted them at each page; with it, a page reads the runs it shows and one
-- more. The DAGs list's newest run of each DAG (catalogue_dags) is found by it too.
CREATE INDEX dag_run_by_dag_created ON dag_run (dag_id, created_at, run_id);

-- The page's calendar counts a year of a DAG's runs by logical date and state
-- (grid_calendar). dag_run_by_date found them but read each run's row for its state: with
-- the state in the index the count reads the index alone, a quarter of the time (13,000
-- runs: 28 ms -> 7 ms on SQLite; PostgreSQL can read it alone once the table's pages
-- are vacuumed). It serves everything the old index served.
DROP INDEX dag_run_by_date;
CREATE INDEX dag_run_by_date ON dag_run (dag_id, logical_date, state);
