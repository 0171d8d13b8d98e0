-- Named values between tasks (ctx.push / ctx.pull) and what setup/teardown tasks read:
-- executor/store/values.py, executor/statemachine.py (a teardown's rule), the clear.

-- name: insert_task_values
-- A succeeded attempt's values, in the transaction of its SUCCESS. A value already there
-- (the same report recorded twice cannot move the row twice, but be sure) is replaced.
INSERT INTO task_value (task_row, key, value) VALUES (:task_row, :key, :value)
ON CONFLICT (task_row, key) DO UPDATE SET value = excluded.value;

-- name: delete_task_values
-- Cleared tasks forget their values with their outputs.
DELETE FROM task_value WHERE task_row = ANY(:ids);

-- name: delete_instance_values
-- A cleared mapped task's instances go (they expand again): their values first.
DELETE FROM task_value
WHERE task_row IN (SELECT id FROM task
                   WHERE run_id = :run_id AND task_id = ANY(:task_ids) AND map_index >= 0);

-- name: published
-- What ended tasks left for their downstream: each row of the tasks (a mapped task's
-- template and its instances) with its output, and one line per named value (none: one
-- line with a NULL key). Found by task's unique (run_id, task_id, map_index) index.
SELECT t.task_id, t.map_index, t.expand_from, t.state, t.output, v.key, v.value
FROM task t LEFT JOIN task_value v ON v.task_row = t.id
WHERE t.run_id = :run_id AND t.task_id = ANY(:task_ids)
ORDER BY t.task_id, t.map_index, v.key;

-- name: setup_parents
-- A teardown's parents that are setups, and how each ended: read once, when all of its
-- parents have ended (executor/rules.py, all_done_setup_success).
SELECT p.task_id, p.state
FROM edge e JOIN task p ON p.run_id = e.run_id AND p.task_id = e.parent AND p.map_index = -1
WHERE e.run_id = :run_id AND e.child = :task_id AND p.role = 'setup';

-- name: run_roles
-- The setups and teardowns of a run (a clear brings them back with the tasks it clears).
SELECT task_id, role FROM task WHERE run_id = :run_id AND map_index = -1 AND role IS NOT NULL;
