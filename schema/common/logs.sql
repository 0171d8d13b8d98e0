-- A task's log read after a cursor (executor/store/loglines.py): the web page's streaming
-- viewer, its download, and GET /api/v1/runs/{run}/tasks/{task}/log. Written by the worker
-- (its lines as they come: append_log_line, and with each outcome) and by transitions.

-- name: log_task
-- The task row a log belongs to, and whether it can still grow.
SELECT id, state FROM task WHERE run_id = :run_id AND task_id = :task_id AND map_index = :map_index;

-- name: log_after
-- At most :n entries after the cursor :since (an id: two lines in the same millisecond are
-- still two ids), oldest first, by the index task_event_by_task (task_row, id). `settled`
-- (PostgreSQL): written by a transaction older than every one still running. An id is
-- taken at INSERT, not at COMMIT, so a row of a newer transaction could have a lower id
-- still to commit below it: the reader stops before the first row not settled, and a
-- cursor never moves past a row that may yet appear below it.
SELECT id, ts, kind, from_state, to_state, attempt, message, {{log_settled}} AS settled
FROM task_event
WHERE task_row = :task_row AND id > :since
ORDER BY id
LIMIT :n;

-- name: append_log_line
-- One line a running attempt wrote, flushed by its worker while the attempt goes on.
INSERT INTO task_event (task_row, ts, kind, from_state, to_state, attempt, message)
VALUES (:task_row, :ts, 'log', NULL, NULL, :attempt, :message);
