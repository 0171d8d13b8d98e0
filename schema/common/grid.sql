-- A DAG's own page (slotless/web/dag_page.py, the API's /dags/{dag_id}/grid and
-- /calendar; executor/store/grid.py): its runs as the grid's columns, read by keyset on
-- (created_at, run_id) through dag_run_by_dag_created (022), then the task rows of only
-- those runs (through the task table's unique (run_id, task_id, map_index)); its calendar
-- as one grouped read of a year of logical dates (dag_run_by_date, which holds the state
-- too since 022). Nothing here writes.

-- name: grid_dag
-- One catalogued DAG as the DAGs list reads it (catalogue_dags), with what its page adds:
-- its shape (the grid's task order), max_active_runs and when its file was parsed.
SELECT d.dag_id, d.file, d.schedule, d.timezone, d.paused, d.next_logical_date,
       d.parse_error, d.file_mtime, d.parsed_at, d.start_error, d.shape, d.max_active_runs,
       (SELECT r.state FROM dag_run r WHERE r.dag_id = d.dag_id
        ORDER BY r.created_at DESC LIMIT 1) AS last_run_state,
       (SELECT s.logical_date FROM start_wait s
        WHERE s.dag_id = d.dag_id AND s.kind = 'schedule') AS armed_logical_date,
       (SELECT s.interval_end FROM start_wait s
        WHERE s.dag_id = d.dag_id AND s.kind = 'schedule') AS armed_due,
       (SELECT g.description FROM start_wait s JOIN trigger g ON g.id = s.trigger_id
        WHERE s.dag_id = d.dag_id AND s.kind = 'condition') AS waiting_for
FROM dag d WHERE d.dag_id = :dag_id;

-- name: grid_runs_newest
-- The :n newest runs of :dag_id by creation, newest first.
SELECT run_id, logical_date, state, created_at, ended_at, logical_time, timezone,
       data_interval_end FROM dag_run
WHERE dag_id = :dag_id
ORDER BY created_at DESC, run_id DESC
LIMIT :n;

-- name: grid_runs_before
-- The :n runs of :dag_id created just before the key (:before_at, :before_id), newest
-- first: one page further back. A row value, so that both backends read the index from
-- the key on, with no sort.
SELECT run_id, logical_date, state, created_at, ended_at, logical_time, timezone,
       data_interval_end FROM dag_run
WHERE dag_id = :dag_id AND (created_at, run_id) < (:before_at, :before_id)
ORDER BY created_at DESC, run_id DESC
LIMIT :n;

-- name: grid_runs_after
-- The :n runs of :dag_id created just after the key (:after_at, :after_id), oldest first:
-- where the page of newer runs starts.
SELECT run_id, created_at FROM dag_run
WHERE dag_id = :dag_id AND (created_at, run_id) > (:after_at, :after_id)
ORDER BY created_at, run_id
LIMIT :n;

-- name: grid_task_rows
-- One row per task of each run of :run_ids: an unmapped task's row, or a mapped task's
-- own row (map_index -1; map_total: its instances, NULL until it expanded).
SELECT run_id, task_id, state, attempt, max_attempts, started_at, ended_at, map_total,
       expand_from, id
FROM task
WHERE run_id = ANY(:run_ids) AND map_index = -1;

-- name: grid_mapped_counts
-- The instances of the mapped tasks of :run_ids, by run, task and state: a mapped cell's
-- counts, and the span from its first start to its last end.
SELECT run_id, task_id, state, count(*) AS n, min(started_at) AS started_at,
       max(ended_at) AS ended_at
FROM task
WHERE run_id = ANY(:run_ids) AND map_index >= 0
GROUP BY run_id, task_id, state;

-- name: grid_instances
-- An expanded mapped task's instances in :run_ids, its first :n map indexes.
SELECT run_id, map_index, state, attempt, max_attempts, started_at, ended_at
FROM task
WHERE run_id = ANY(:run_ids) AND task_id = :task_id AND map_index >= 0 AND map_index < :n;

-- name: grid_dag_has_runs
SELECT 1 AS found FROM dag_run WHERE dag_id = :dag_id LIMIT 1;

-- name: grid_calendar
-- :dag_id's runs by logical date (a date on the DAG's clock, 'YYYY-MM-DD') and state, from
-- :since to :until (inclusive): the calendar's days. A range of dag_run_by_date, read alone.
SELECT logical_date AS day, state, count(*) AS n FROM dag_run
WHERE dag_id = :dag_id AND logical_date >= :since AND logical_date <= :until
GROUP BY logical_date, state;

-- name: task_durations
-- One task of a DAG over its :n newest runs (newest first), found from one of its runs:
-- the task page's durations chart. By dag_run (dag_id, created_at, run_id) (022), then
-- each run's task row by its unique (run_id, task_id, map_index).
SELECT r.run_id, r.logical_date, r.logical_time, r.timezone, r.data_interval_end,
       t.state, t.started_at, t.ended_at
FROM dag_run r
JOIN task t ON t.run_id = r.run_id AND t.task_id = :task_id AND t.map_index = :map_index
WHERE r.dag_id = (SELECT dag_id FROM dag_run WHERE run_id = :run_id)
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT :n;
