-- slotless schema v20 (SQLite): a run's logical time and its type.
--
-- logical_time: the run's logical instant, ISO 8601 in UTC in one fixed form
-- (`2026-11-26T06:00:00+00:00`, the form of data_interval_start), so that text order is
-- time order on both backends. A schedule's run: its interval's start, time of day
-- included (five hourly runs of one day are five times, where logical_date is one date).
-- A run without an interval (by hand, a start condition): midnight of its logical date on
-- the DAG's clock.
-- timezone: the IANA zone of that clock (the DAG's `timezone`, as the run was created),
-- on which logical_date is the date of logical_time and on which people read it
-- (executor/runnames.py: logical_shown). NULL reads as UTC.
-- run_type: how it started: scheduled | manual | backfill | event.
--
-- All three are nullable, as run_key was in 003: a process of the previous release
-- inserts runs without them during a rolling upgrade; this code always writes them.
ALTER TABLE dag_run ADD COLUMN logical_time TEXT;
ALTER TABLE dag_run ADD COLUMN timezone TEXT;
ALTER TABLE dag_run ADD COLUMN run_type TEXT;

-- Rows written before, best effort (docs/scheduling.md, "Logical time and run type"):
-- * logical_time: the interval's start when the run has one; else its logical date at
--   00:00 UTC, read on UTC (the zone it was meant on is not known for sure).
-- * timezone: for a run with an interval, its DAG's zone if the DAG is still catalogued
--   (its ds was that zone's date), else UTC.
-- * run_type, first match: a `KEY~rerun-N` key is a backfill's rerun; a data interval is a
--   schedule's run (a backfill of old rows reads as scheduled: nothing told them apart);
--   a start event, or a key that is a bare date (a condition's default key) without an
--   interval, is an event's; the rest (`DATE~manual-...`, a person's own key, runs from
--   before run keys) is manual.
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

-- The runs list filtered by type, newest first (`slotless status`, the page): cheap, one
-- more entry per run created. A DAG's runs are found by dag_run_by_date already.
CREATE INDEX dag_run_by_type ON dag_run (run_type, created_at);
