-- Every statement slotless runs on PostgreSQL. Parameters are $N, in the same order as
-- schema/sqlite/queries.sql (tests/test_queries_parity.py checks names and counts). Id
-- lists arrive as one int array parameter (`= ANY($n::bigint[])`); JSON arrives as text.
-- Times are epoch seconds taken from the Database's clock, which follows the server's
-- clock (see executor/store/postgres.py), so leases are judged by the database's clock.
--
-- Plans that must not depend on statistics. Tables are new, or their statistics lag a
-- burst (100,000 sensors deferring at midnight), exactly when load peaks. Two spellings
-- keep the planner on the path whose cost is the size of the answer:
-- * `(state || '') = ...` next to `id = ANY(...)`: a row is looked up by its key, never
--   found by scanning a partial index over every DEFERRED row (O(waits) per statement);
-- * `t.run_id = (e.run_id || '')` in bump_children: children are reached from the edges,
--   never by scanning every task of the run (O(tasks) per finished parent).

-- name: cas
-- The one compare-and-set through which every task state change passes.
-- $1 new state, $2 ready_at, $3 owner, $4 heartbeat_at, $5 attempt delta, $6 now,
-- $7 1 if the new state is terminal, $8 expected state, $9 ids, $10 expected owner or NULL.
-- Under READ COMMITTED a row another transaction holds is waited for, then re-checked
-- against `state = $8`: a racing process changes nothing the second time.
UPDATE task
SET state = $1, ready_at = $2, owner = $3, heartbeat_at = $4, attempt = attempt + $5,
    updated_at = $6,
    started_at = CASE WHEN $1 = 'RUNNING' AND started_at IS NULL THEN $6 ELSE started_at END,
    ended_at = CASE WHEN $7 = 1 THEN $6 ELSE ended_at END
WHERE id = ANY($9::bigint[]) AND (state || '') = $8
  AND ($10::text IS NULL OR owner = $10::text)
-- What callers read: settling a transition, and running a claimed task.
RETURNING id, run_id, task_id, map_index, state, attempt, max_attempts, is_leaf, priority,
          n_parents, expand_from, item, map_total, next_method, next_kwargs, event,
          wait_started_at, owner, started_at;

-- name: insert_event
INSERT INTO task_event (task_row, ts, kind, from_state, to_state, attempt, message)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: insert_slot_usage
INSERT INTO slot_usage (worker_id, slot, task_row, kind, started_at, ended_at)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: insert_run
INSERT INTO dag_run (run_id, dag_id, logical_date, state, dag_file, created_at, tasks_unfinished)
VALUES ($1, $2, $3, 'RUNNING', $4, $5, $6);

-- name: insert_task
INSERT INTO task (run_id, task_id, state, trigger_rule, priority, is_leaf, expand_from, map_cap,
                  max_attempts, n_parents, updated_at)
VALUES ($1, $2, 'PENDING', $3, $4, $5, $6, $7, $8, $9, $10);

-- name: insert_edge
INSERT INTO edge (run_id, parent, child) VALUES ($1, $2, $3);

-- name: insert_instance
-- Instances keep expand_from so that their inputs leave out the list they were cut from.
INSERT INTO task (run_id, task_id, map_index, state, trigger_rule, priority, is_leaf,
                  max_attempts, item, map_total, expand_from, ready_at, updated_at)
VALUES ($1, $2, $3, 'PENDING', 'all_success', $4, 0, $5, $6, $7, $8, $9, $9)
ON CONFLICT DO NOTHING;

-- name: set_expanded
UPDATE task
SET n_parents = $1, n_done = 0, n_success = 0, n_failed = 0, n_upstream_failed = 0,
    n_skipped = 0, map_total = $1
WHERE id = $2;

-- name: run_tasks
SELECT * FROM task WHERE run_id = $1 AND map_index = -1 ORDER BY id;

-- name: run_tasks_done
UPDATE dag_run
SET tasks_unfinished = tasks_unfinished - $1, leaves_failed = leaves_failed + $2
WHERE run_id = $3
RETURNING tasks_unfinished, leaves_failed;

-- name: finish_run
UPDATE dag_run SET state = $1, ended_at = $2 WHERE run_id = $3 AND state = 'RUNNING';

-- name: bump_children
-- A parent ended: count it in each child's counters ($1..$4 are 0/1 by how it ended).
UPDATE task t
SET n_done = t.n_done + 1, n_success = t.n_success + $1, n_failed = t.n_failed + $2,
    n_upstream_failed = t.n_upstream_failed + $3, n_skipped = t.n_skipped + $4
FROM edge e
WHERE e.run_id = $5 AND e.parent = $6
  AND t.run_id = (e.run_id || '') AND t.task_id = e.child AND t.map_index = -1
RETURNING t.*;

-- name: bump_template
-- Instances of a mapped task ended: count them in the template's counters.
UPDATE task
SET n_done = n_done + $1, n_success = n_success + $2, n_failed = n_failed + $3,
    n_upstream_failed = n_upstream_failed + $4, n_skipped = n_skipped + $5
WHERE run_id = $6 AND task_id = $7 AND map_index = -1
RETURNING *;

-- name: mark_ready
UPDATE task SET ready_at = $1
WHERE id = ANY($2::bigint[]) AND state = 'PENDING' AND ready_at IS NULL;

-- name: task_result
SELECT state, output, map_total FROM task WHERE run_id = $1 AND task_id = $2 AND map_index = -1;

-- name: mapped_outputs
SELECT output FROM task WHERE run_id = $1 AND task_id = $2 AND map_index >= 0 ORDER BY map_index;

-- name: claim_candidates
-- Rows another worker is claiming right now are skipped, not waited for; a row whose
-- ready_at was cleared meanwhile is re-checked and dropped. No row is claimed twice.
SELECT id, state FROM task
WHERE ready_at IS NOT NULL AND ready_at <= $1
ORDER BY priority DESC, ready_at, id
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: parent_outputs
-- Outputs of a task's parents; a mapped parent contributes its instances in index order.
-- $3 names a parent to leave out (a mapped instance's source: it gets its item instead).
SELECT task_id, map_index, output, expand_from FROM task
WHERE run_id = $1
  AND task_id IN (SELECT parent FROM edge
                  WHERE run_id = $1 AND child = $2 AND parent IS DISTINCT FROM $3::text)
ORDER BY task_id, map_index;

-- name: set_output
UPDATE task SET output = $1 WHERE id = $2 AND owner = $3;

-- name: ids_by_task_id
SELECT id FROM task
WHERE run_id = $1 AND map_index = -1
  AND task_id IN (SELECT jsonb_array_elements_text($2::text::jsonb));

-- name: heartbeat
UPDATE task SET heartbeat_at = $1
WHERE id = ANY($2::bigint[]) AND state = 'RUNNING' AND owner = $3;

-- name: stale_running
SELECT id, owner, attempt, max_attempts, heartbeat_at FROM task
WHERE state = 'RUNNING' AND owner IS NOT NULL AND heartbeat_at < $1;

-- name: run_info
SELECT * FROM dag_run WHERE run_id = $1;

-- name: run_counts
SELECT state, count(*) AS n FROM task WHERE run_id = $1 AND map_index >= 0 GROUP BY state
UNION ALL
SELECT state, count(*) AS n FROM task WHERE run_id = $1 AND map_index = -1 AND map_total IS NULL
GROUP BY state;

-- name: list_runs
SELECT * FROM dag_run ORDER BY created_at DESC LIMIT $1;

-- name: run_state_counts
SELECT run_id, state, count(*) AS n FROM task
WHERE run_id IN (SELECT run_id FROM dag_run ORDER BY created_at DESC LIMIT $1)
GROUP BY run_id, state;

-- name: task_row
SELECT * FROM task WHERE run_id = $1 AND task_id = $2 AND map_index = $3;

-- name: task_events
SELECT * FROM task_event WHERE task_row = $1 ORDER BY id;

-- name: external_states
-- Cross-DAG questions, all answered at once: $1 is a JSON array of
-- {"q": n, "dag_id": ..., "task_id": ... or null, "logical_date": ...}; the latest run wins.
SELECT (q.value ->> 'q')::integer AS q,
       (SELECT CASE WHEN q.value ->> 'task_id' IS NULL THEN r.state
                    ELSE (SELECT t.state FROM task t
                          WHERE t.run_id = r.run_id AND t.task_id = q.value ->> 'task_id'
                            AND t.map_index = -1) END
        FROM dag_run r
        WHERE r.dag_id = q.value ->> 'dag_id' AND r.logical_date = q.value ->> 'logical_date'
        ORDER BY r.created_at DESC LIMIT 1) AS state,
       (SELECT r.run_id FROM dag_run r
        WHERE r.dag_id = q.value ->> 'dag_id' AND r.logical_date = q.value ->> 'logical_date'
        ORDER BY r.created_at DESC LIMIT 1) AS run_id
FROM jsonb_array_elements($1::text::jsonb) WITH ORDINALITY AS q(value, ord)
ORDER BY q.ord;

-- name: mapped_counts
SELECT task_id, state, count(*) AS n FROM task
WHERE run_id = $1 AND map_index >= 0
GROUP BY task_id, state;

-- name: insert_trigger
-- $6 the trigger's readable description (shown by `slotless status` and the web page).
-- The row's INSERT wakes the triggerers (NOTIFY slotless_triggers, see 001_init.sql).
INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, description)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id;

-- name: set_deferral
-- Only the attempt's owner may defer it; $8 soft_fail.
UPDATE task
SET trigger_id = $1, next_method = $2, next_kwargs = $3,
    wait_started_at = COALESCE(wait_started_at, $4), wait_timeout_at = $5, event = NULL,
    soft_fail = $8
WHERE id = $6 AND owner = $7 AND state = 'RUNNING';

-- name: delete_trigger
DELETE FROM trigger WHERE id = $1;

-- name: set_wait
-- A reschedule-mode sensor's wait: started once, kept across checks.
UPDATE task SET wait_started_at = COALESCE(wait_started_at, $1), wait_timeout_at = $2
WHERE id = $3 AND owner = $4 AND state = 'RUNNING';

-- ---------------------------------------------------------------- the triggerer

-- name: triggerer_beat
INSERT INTO triggerer (id, seen_at, started_at, triggers, loop_lag_ms)
VALUES ($1, $2, $2, $3, $4)
ON CONFLICT (id) DO UPDATE SET seen_at = $2, triggers = $3, loop_lag_ms = $4;

-- name: live_triggerers
SELECT id FROM triggerer WHERE seen_at >= $1 ORDER BY id;

-- name: triggerer_leave
DELETE FROM triggerer WHERE id = $1;

-- name: renew_shards
UPDATE shard_lease SET expires_at = $1 WHERE owner = $2 RETURNING shard;

-- name: free_shards
SELECT shard FROM shard_lease WHERE owner IS NULL OR expires_at < $1 ORDER BY shard;

-- name: take_shard
-- Re-checked under the row lock: of two triggerers racing for a shard, one gets it.
UPDATE shard_lease SET owner = $1, expires_at = $2
WHERE shard = $3 AND (owner IS NULL OR expires_at < $4);

-- name: release_shard
UPDATE shard_lease SET owner = NULL, expires_at = NULL WHERE shard = $1 AND owner = $2;

-- name: release_all_shards
UPDATE shard_lease SET owner = NULL, expires_at = NULL WHERE owner = $1;

-- name: load_triggers
-- The waits of the given shards, from trigger id $2 on (0 for a full reload).
-- Identity ids are handed out at INSERT but become visible at COMMIT, and concurrent
-- workers commit out of order: a row with an id below $2 may appear after a load that
-- moved the cursor past it. So every row is also returned, once, by the first load that
-- sees it: `loaded` marks the rows some load has returned (a triggerer skips rows it holds).
-- (A UNION, not an OR: each half reads an index; an OR made it a scan of every trigger.)
WITH fresh AS (
    UPDATE trigger SET loaded = TRUE
    WHERE NOT loaded AND shard = ANY($1::integer[])
    RETURNING id
), wanted AS (
    SELECT id FROM trigger WHERE shard = ANY($1::integer[]) AND id > $2::bigint
    UNION
    SELECT id FROM fresh
)
SELECT g.id AS trigger_id, g.classpath, g.kwargs, g.poke_hash, g.shard, t.id AS task_row,
       t.next_method, t.wait_timeout_at
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
ORDER BY g.id;

-- name: set_event
UPDATE task SET event = $1 WHERE id = ANY($2::bigint[]) AND (state || '') = 'DEFERRED';

-- name: clear_resume
-- A retry starts the task over: forget the resume point and event of an earlier deferral,
-- and the start of an earlier wait (a sensor's timeout is per attempt).
UPDATE task SET next_method = NULL, next_kwargs = NULL, event = NULL,
                wait_started_at = NULL, wait_timeout_at = NULL
WHERE id = ANY($1::bigint[]);

-- name: set_sensor_output
UPDATE task SET output = $1
WHERE id = ANY($2::bigint[]) AND (state || '') = 'DEFERRED' AND next_method IS NULL;

-- name: deferred_rows
-- Locked, so that the trigger they wait on cannot change before this transaction moves them.
SELECT id, trigger_id, attempt, max_attempts, soft_fail, next_method, wait_started_at FROM task
WHERE id = ANY($1::bigint[]) AND (state || '') = 'DEFERRED'
FOR UPDATE;

-- name: expired_waits
SELECT t.id, t.soft_fail, t.wait_started_at FROM task t JOIN trigger g ON g.id = t.trigger_id
WHERE t.state = 'DEFERRED' AND t.wait_timeout_at < $1
  AND g.shard = ANY($2::integer[]);

-- name: delete_orphan_triggers
DELETE FROM trigger
WHERE shard = ANY($1::integer[])
  AND NOT EXISTS (SELECT 1 FROM task t WHERE t.trigger_id = trigger.id AND t.state = 'DEFERRED');

-- name: max_trigger_id
-- Where the next incremental load starts after a full reload read shard by shard.
SELECT COALESCE(max(id), 0) AS id FROM trigger;

-- name: list_triggerers
SELECT r.*, (SELECT count(*) FROM shard_lease s WHERE s.owner = r.id) AS shards
FROM triggerer r ORDER BY r.id;

-- ---------------------------------------------------------------- operating (read-only)
-- `slotless status`, the metrics endpoints and the web page. Waiting tasks are read
-- through the partial indexes: task_deferred (DEFERRED), task_claimable (SENSING and
-- RETRYING, whose ready_at is set) and task_running (RUNNING).

-- name: ops_run_states
SELECT state, count(*) AS n FROM dag_run GROUP BY state;

-- name: ops_live_task_states
-- Task instances of unfinished runs by state (an expanded mapped task counts as its instances).
SELECT t.state, count(*) AS n
FROM dag_run r JOIN task t ON t.run_id = r.run_id
WHERE r.state = 'RUNNING' AND NOT (t.map_index = -1 AND t.map_total IS NOT NULL)
GROUP BY t.state;

-- name: ops_waiting_summary
-- $1 now. Per waiting state: how many, since when the longest has waited, and (DEFERRED,
-- SENSING) the largest share of its own timeout any wait has used.
SELECT 'DEFERRED' AS state, count(*) AS n, min(wait_started_at) AS oldest,
       max(($1::double precision - wait_started_at)
           / NULLIF(wait_timeout_at - wait_started_at, 0)) AS timeout_ratio
FROM task WHERE state = 'DEFERRED'
UNION ALL
SELECT 'SENSING', count(*), min(wait_started_at),
       max(($1::double precision - wait_started_at)
           / NULLIF(wait_timeout_at - wait_started_at, 0))
FROM task WHERE ready_at IS NOT NULL AND state = 'SENSING'
UNION ALL
SELECT 'RETRYING', count(*), min(updated_at), NULL
FROM task WHERE ready_at IS NOT NULL AND state = 'RETRYING';

-- name: ops_retrying_since
-- When the longest retry episode still going began: tasks waiting to retry, and tasks
-- running a retry (attempt > 1), each since its first move to RETRYING.
SELECT min(since) AS since FROM (
    SELECT (SELECT min(e.ts) FROM task_event e
            WHERE e.task_row = t.id AND e.to_state = 'RETRYING') AS since
    FROM task t WHERE t.ready_at IS NOT NULL AND t.state = 'RETRYING'
    UNION ALL
    SELECT (SELECT min(e.ts) FROM task_event e
            WHERE e.task_row = t.id AND e.to_state = 'RETRYING')
    FROM task t WHERE t.state = 'RUNNING' AND t.owner IS NOT NULL AND t.attempt > 1
) AS episodes;

-- name: ops_deferred
-- $1 limit. The longest waits first, with their trigger and the lease of its shard.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts,
       t.updated_at, t.wait_started_at, t.wait_timeout_at, t.next_method, t.soft_fail,
       g.id AS trigger_id, g.classpath, g.poke_hash, g.shard, g.description,
       s.owner AS lease_owner, s.expires_at AS lease_expires_at
FROM task t
LEFT JOIN trigger g ON g.id = t.trigger_id
LEFT JOIN shard_lease s ON s.shard = g.shard
WHERE t.state = 'DEFERRED'
ORDER BY t.wait_started_at, t.id
LIMIT $1;

-- name: ops_sensing
-- $1 limit. Reschedule-mode sensors between checks; last_message is their last check.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts,
       t.updated_at, t.ready_at, t.wait_started_at, t.wait_timeout_at,
       (SELECT e.message FROM task_event e WHERE e.task_row = t.id AND e.kind = 'transition'
        ORDER BY e.id DESC LIMIT 1) AS last_message
FROM task t
WHERE t.ready_at IS NOT NULL AND t.state = 'SENSING'
ORDER BY t.wait_started_at, t.id
LIMIT $1;

-- name: ops_retrying
-- $1 limit. Tasks waiting for their next attempt, the longest retry episode first.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts,
       t.updated_at, t.ready_at,
       (SELECT min(e.ts) FROM task_event e
        WHERE e.task_row = t.id AND e.to_state = 'RETRYING') AS retrying_since,
       (SELECT e.message FROM task_event e WHERE e.task_row = t.id AND e.to_state = 'RETRYING'
        ORDER BY e.id DESC LIMIT 1) AS last_error
FROM task t
WHERE t.ready_at IS NOT NULL AND t.state = 'RETRYING'
ORDER BY retrying_since, t.id
LIMIT $1;

-- name: ops_shard_leases
SELECT shard, owner, expires_at FROM shard_lease ORDER BY shard;

-- name: ops_run_counts
-- Instances by state of the newest $1 runs (an expanded mapped task counts as its instances).
SELECT t.run_id, t.state, count(*) AS n FROM task t
WHERE t.run_id IN (SELECT run_id FROM dag_run ORDER BY created_at DESC LIMIT $1)
  AND NOT (t.map_index = -1 AND t.map_total IS NOT NULL)
GROUP BY t.run_id, t.state;

-- name: ops_run_edges
SELECT parent, child FROM edge WHERE run_id = $1 ORDER BY parent, child;

-- name: ops_run_waits
-- What each DEFERRED task of one run waits for.
SELECT t.task_id, t.map_index, g.description, g.classpath
FROM task t JOIN trigger g ON g.id = t.trigger_id
WHERE t.run_id = $1 AND t.state = 'DEFERRED';

-- name: ops_task_instances
-- $3 limit: the instances of one mapped task, in index order.
SELECT id, map_index, state, attempt, updated_at FROM task
WHERE run_id = $1 AND task_id = $2 AND map_index >= 0
ORDER BY map_index
LIMIT $3;

-- name: ops_trigger
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, g.created_at, g.description,
       s.owner AS lease_owner, s.expires_at AS lease_expires_at
FROM trigger g LEFT JOIN shard_lease s ON s.shard = g.shard
WHERE g.id = $1;

-- name: ops_check_waiters
-- How many tasks wait on one check: $1 poke_hash, $2 its shard (for the index).
SELECT count(*) AS n
FROM trigger g JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
WHERE g.shard = $2 AND g.poke_hash = $1;
