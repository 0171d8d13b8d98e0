-- The runs list and a run's Gantt chart (executor/store/runlist.py): read-only.
--
-- The list is newest first by (created_at, run_id), paged by keyset: a page's bound is the
-- (created_at, run_id) of the row it continues from, a row value compared as one (an index
-- range), so page 2,000 costs what page 1 does. :at/:id bound the page (older: below
-- them; newer: above them; the first page passes a bound above every run). Every filter
-- is a parameter, none is spliced in:
--   :states    the states asked for (every run state when none is asked for)
--   :any_type  1: no run type asked for; else :types, the types asked for (a run written
--              by a release before 020 has no type: it is found only with no type asked)
--   :from_day, :to_day  the logical date's range, inclusive ('' and '9999-12-31' when open)
--   :pattern   LIKE pattern over the run id and the run key, lower case, its wildcards
--              escaped with '\' ('%' when no text is asked for)
-- :n is a page's size plus one: the extra row says whether there is a further page.
--
-- Three pairs (older, newer), one per index that finds the runs (023), chosen by
-- executor/store/runlist.py from what is asked, because a planner cannot tell from one
-- statement which filter is the selective one: the date range is always there (open when
-- not asked for), and SQLite (no statistics) and a PostgreSQL generic plan (a prepared
-- statement run often) both took it for a narrow range and sorted every run, 150-250 ms at
-- 100,000 runs, where the walk newest first reads a page's rows and stops:
--   runs_*       walk every run newest first (dag_run_by_created), the rest checked per row
--   runs_*_dag   walk one DAG's runs newest first (dag_run_by_dag_created)
--   runs_*_dags  several DAGs' runs (the same index, each DAG's found, then sorted: a
--                list parameter is not one value to either planner)
--   runs_*_days  a short closed range of logical dates (dag_run_by_logical_date), sorted
-- INDEXED BY says which to SQLite (PostgreSQL does not read it: schema/__init__.py drops
-- it); the date compared as (logical_date || '') keeps either planner off the date index
-- where the walk is meant.

-- name: runs_older
SELECT r.run_id, r.dag_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_start,
       r.data_interval_end, r.run_type, r.run_key, r.state, r.created_at, r.ended_at
FROM dag_run r INDEXED BY dag_run_by_created
WHERE (r.created_at, r.run_id) < (:at, :id)
  AND r.state = ANY(:states)
  AND (:any_type = 1 OR r.run_type = ANY(:types))
  AND (r.logical_date || '') >= :from_day AND (r.logical_date || '') <= :to_day
  AND (lower(r.run_id) LIKE :pattern ESCAPE '\'
       OR lower(COALESCE(r.run_key, '')) LIKE :pattern ESCAPE '\')
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT :n;

-- name: runs_newer
SELECT r.run_id, r.dag_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_start,
       r.data_interval_end, r.run_type, r.run_key, r.state, r.created_at, r.ended_at
FROM dag_run r INDEXED BY dag_run_by_created
WHERE (r.created_at, r.run_id) > (:at, :id)
  AND r.state = ANY(:states)
  AND (:any_type = 1 OR r.run_type = ANY(:types))
  AND (r.logical_date || '') >= :from_day AND (r.logical_date || '') <= :to_day
  AND (lower(r.run_id) LIKE :pattern ESCAPE '\'
       OR lower(COALESCE(r.run_key, '')) LIKE :pattern ESCAPE '\')
ORDER BY r.created_at, r.run_id
LIMIT :n;

-- name: runs_older_dag
SELECT r.run_id, r.dag_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_start,
       r.data_interval_end, r.run_type, r.run_key, r.state, r.created_at, r.ended_at
FROM dag_run r INDEXED BY dag_run_by_dag_created
WHERE r.dag_id = :dag
  AND (r.created_at, r.run_id) < (:at, :id)
  AND r.state = ANY(:states)
  AND (:any_type = 1 OR r.run_type = ANY(:types))
  AND (r.logical_date || '') >= :from_day AND (r.logical_date || '') <= :to_day
  AND (lower(r.run_id) LIKE :pattern ESCAPE '\'
       OR lower(COALESCE(r.run_key, '')) LIKE :pattern ESCAPE '\')
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT :n;

-- name: runs_older_dags
SELECT r.run_id, r.dag_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_start,
       r.data_interval_end, r.run_type, r.run_key, r.state, r.created_at, r.ended_at
FROM dag_run r INDEXED BY dag_run_by_dag_created
WHERE r.dag_id = ANY(:dags)
  AND (r.created_at, r.run_id) < (:at, :id)
  AND r.state = ANY(:states)
  AND (:any_type = 1 OR r.run_type = ANY(:types))
  AND (r.logical_date || '') >= :from_day AND (r.logical_date || '') <= :to_day
  AND (lower(r.run_id) LIKE :pattern ESCAPE '\'
       OR lower(COALESCE(r.run_key, '')) LIKE :pattern ESCAPE '\')
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT :n;

-- name: runs_newer_dag
SELECT r.run_id, r.dag_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_start,
       r.data_interval_end, r.run_type, r.run_key, r.state, r.created_at, r.ended_at
FROM dag_run r INDEXED BY dag_run_by_dag_created
WHERE r.dag_id = :dag
  AND (r.created_at, r.run_id) > (:at, :id)
  AND r.state = ANY(:states)
  AND (:any_type = 1 OR r.run_type = ANY(:types))
  AND (r.logical_date || '') >= :from_day AND (r.logical_date || '') <= :to_day
  AND (lower(r.run_id) LIKE :pattern ESCAPE '\'
       OR lower(COALESCE(r.run_key, '')) LIKE :pattern ESCAPE '\')
ORDER BY r.created_at, r.run_id
LIMIT :n;

-- name: runs_newer_dags
SELECT r.run_id, r.dag_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_start,
       r.data_interval_end, r.run_type, r.run_key, r.state, r.created_at, r.ended_at
FROM dag_run r INDEXED BY dag_run_by_dag_created
WHERE r.dag_id = ANY(:dags)
  AND (r.created_at, r.run_id) > (:at, :id)
  AND r.state = ANY(:states)
  AND (:any_type = 1 OR r.run_type = ANY(:types))
  AND (r.logical_date || '') >= :from_day AND (r.logical_date || '') <= :to_day
  AND (lower(r.run_id) LIKE :pattern ESCAPE '\'
       OR lower(COALESCE(r.run_key, '')) LIKE :pattern ESCAPE '\')
ORDER BY r.created_at, r.run_id
LIMIT :n;

-- name: runs_older_days
SELECT r.run_id, r.dag_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_start,
       r.data_interval_end, r.run_type, r.run_key, r.state, r.created_at, r.ended_at
FROM dag_run r INDEXED BY dag_run_by_logical_date
WHERE (r.created_at, r.run_id) < (:at, :id)
  AND r.state = ANY(:states)
  AND (:any_type = 1 OR r.run_type = ANY(:types))
  AND r.logical_date >= :from_day AND r.logical_date <= :to_day
  AND (lower(r.run_id) LIKE :pattern ESCAPE '\'
       OR lower(COALESCE(r.run_key, '')) LIKE :pattern ESCAPE '\')
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT :n;

-- name: runs_newer_days
SELECT r.run_id, r.dag_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_start,
       r.data_interval_end, r.run_type, r.run_key, r.state, r.created_at, r.ended_at
FROM dag_run r INDEXED BY dag_run_by_logical_date
WHERE (r.created_at, r.run_id) > (:at, :id)
  AND r.state = ANY(:states)
  AND (:any_type = 1 OR r.run_type = ANY(:types))
  AND r.logical_date >= :from_day AND r.logical_date <= :to_day
  AND (lower(r.run_id) LIKE :pattern ESCAPE '\'
       OR lower(COALESCE(r.run_key, '')) LIKE :pattern ESCAPE '\')
ORDER BY r.created_at, r.run_id
LIMIT :n;

-- name: runs_task_counts
-- The task instances of the runs of one page, by state (an expanded mapped task counts as
-- its instances, as everywhere), with when the first of them started: through the task
-- table's (run_id, task_id, map_index) key, the page's runs' rows only.
SELECT t.run_id, t.state, count(*) AS n, min(t.started_at) AS started_at
FROM task t
WHERE t.run_id = ANY(:run_ids)
  AND NOT (t.map_index = -1 AND t.map_total IS NOT NULL)
GROUP BY t.run_id, t.state;

-- name: gantt_tasks
-- A run's task rows for its Gantt chart: every task's own row, and the first
-- :instances instances of each mapped task (the rest are counted, not drawn).
SELECT t.id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts, t.ready_at,
       t.started_at, t.ended_at, t.map_total
FROM task t
WHERE t.run_id = :run_id AND t.map_index < :instances
ORDER BY t.id;

-- name: gantt_events
-- Every state change of the same rows, in one query for the whole run (not one per task):
-- through the task key, then task_event_by_task (task_row, id) for each row.
SELECT e.task_row, e.ts, e.from_state, e.to_state, e.attempt
FROM task t JOIN task_event e ON e.task_row = t.id
WHERE t.run_id = :run_id AND t.map_index < :instances AND e.kind = 'transition'
ORDER BY e.task_row, e.id;

-- name: runs_dag_ids
-- Every catalogued DAG's id: the runs list's form offers them.
SELECT dag_id FROM dag ORDER BY dag_id;
