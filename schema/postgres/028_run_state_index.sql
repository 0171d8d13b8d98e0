-- slotless schema v28 (PostgreSQL): runs by state, and a DAG's runs by logical time.
--
-- The run list's counts (ops_run_states), the tasks of its unfinished runs
-- (ops_live_task_states) and the runs needing attention start from a run's state. Without
-- an index on it, SQLite joined every task row (1,000,000: 650 ms) to find the tasks of
-- the 20 runs still going, and read every run for the few PAUSED ones (70 ms); the run
-- list's page took 0.9 s at 100,000 runs (benchmarks/web.py), ~16 ms with it.
CREATE INDEX dag_run_by_run_state ON dag_run (state, created_at);

-- The DAGs page's squares: each DAG's newest runs by logical time, found by walking this
-- index per DAG (dags_page_runs) rather than ranking every run (275 ms at 100,000 runs).
CREATE INDEX dag_run_by_dag_logical_time ON dag_run (dag_id, logical_time, created_at, run_id);
