-- slotless schema v8 (SQLite): nothing. PostgreSQL announces runs' state changes here
-- (NOTIFY slotless_runs); SQLite has no notifications, so waits on another DAG's run keep
-- being polled. The file exists so that both backends keep the same version numbers.
SELECT 1;
