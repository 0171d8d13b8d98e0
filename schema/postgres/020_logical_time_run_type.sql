-- slotless schema v20 (PostgreSQL): a run's logical time, its clock and its type, as in
-- schema/sqlite/020_logical_time_run_type.sql (see there for what each column holds and
-- how the rows written before are filled). All three nullable: a process of the previous
-- release inserts runs without them during a rolling upgrade.
ALTER TABLE dag_run ADD COLUMN logical_time TEXT;
ALTER TABLE dag_run ADD COLUMN timezone TEXT;
ALTER TABLE dag_run ADD COLUMN run_type TEXT;

UPDATE dag_run SET
    logical_time = COALESCE(data_interval_start, logical_date || 'T00:00:00+00:00'),
    timezone = CASE
        WHEN data_interval_start IS NULL THEN 'UTC'
        ELSE COALESCE((SELECT d.timezone FROM dag d WHERE d.dag_id = dag_run.dag_id), 'UTC')
    END,
    run_type = CASE
        WHEN run_key LIKE '%~rerun-%' THEN 'backfill'
        WHEN data_interval_start IS NOT NULL THEN 'scheduled'
        WHEN start_event IS NOT NULL OR run_key LIKE '____-__-__' THEN 'event'
        ELSE 'manual'
    END;

-- The runs list filtered by type, newest first: one more entry per run created.
CREATE INDEX dag_run_by_type ON dag_run (run_type, created_at);
