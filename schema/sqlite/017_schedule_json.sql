-- slotless schema v16 (SQLite): a DAG's schedule is one JSON value.
--
-- The schedule was five columns (schedule text, timezone, start_date, end_date, catchup)
-- that every reader put back together; it is now `dag.schedule` alone, holding
-- executor.schedules.Schedule.to_json(): {"catchup", "end_date", "schedule",
-- "start_date", "timezone"}. `dag.timezone` stays: it is the DAG's clock, which a DAG
-- without a schedule has too (its start condition's dates). The rows written before are
-- rewritten in that form, then the three columns only the schedule used are dropped.

UPDATE dag
SET schedule = json_object(
        'catchup', json(CASE WHEN catchup <> 0 THEN 'true' ELSE 'false' END),
        'end_date', end_date,
        'schedule', schedule,
        'start_date', start_date,
        'timezone', timezone)
WHERE schedule IS NOT NULL;

ALTER TABLE dag DROP COLUMN start_date;
ALTER TABLE dag DROP COLUMN end_date;
ALTER TABLE dag DROP COLUMN catchup;
