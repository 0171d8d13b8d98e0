-- slotless schema v22 (PostgreSQL): a DAG's runs in the order they were created.
--
-- A DAG's page (slotless/web/dag_page.py) shows its runs newest first and pages back
-- through all of them by keyset, (created_at, run_id) < the last one shown
-- (grid_runs_before in schema/common/grid.sql). Without this index that read every run of
-- the DAG and sorted them at each page; with it, a page reads the runs it shows and one
-- more. The DAGs list's newest run of each DAG (catalogue_dags) is found by it too.
CREATE INDEX dag_run_by_dag_created ON dag_run (dag_id, created_at, run_id);
