-- The statements whose PostgreSQL spelling differs from SQLite's; the rest are in
-- schema/common/queries.sql. Parameters are named; lists arrive as arrays.
--
-- Plans that must not depend on statistics. Tables are new, or their statistics lag a
-- burst (100,000 sensors deferring at midnight), exactly when load peaks. Two spellings
-- keep the planner on the path whose cost is the size of the answer:
-- * `(state || '') = ...` next to `id = ANY(...)`: a row is looked up by its key, never
--   found by scanning a partial index over every DEFERRED row (O(waits) per statement);
-- * `t.run_id = (e.run_id || '')` in bump_children: children are reached from the edges,
--   never by scanning every task of the run (O(tasks) per finished parent).

-- name: cas
-- The one compare-and-set through which every task state change passes, with what the
-- transition carries (see schema/sqlite/queries.sql for the modes). Under READ COMMITTED
-- a row another transaction holds is waited for, then re-checked against
-- `state = :expected`: a racing process changes nothing the second time.
UPDATE task
SET state = :new, ready_at = :ready_at, owner = :owner, heartbeat_at = :heartbeat_at,
    attempt = attempt + :attempt_delta, updated_at = :now,
    started_at = CASE WHEN :new = 'RUNNING' AND started_at IS NULL THEN :now ELSE started_at END,
    ended_at = CASE WHEN :terminal = 1 THEN :now ELSE ended_at END,
    output = CASE :output_mode::text WHEN 'one' THEN :output::text
                                     WHEN 'each' THEN :outputs::jsonb ->> id::text
                                     ELSE output END,
    event = CASE :resume_mode::text WHEN 'event' THEN :event::text
                                    WHEN 'keep' THEN event ELSE NULL END,
    next_method = CASE :resume_mode WHEN 'defer' THEN :next_method::text
                                    WHEN 'restart' THEN NULL ELSE next_method END,
    next_kwargs = CASE :resume_mode WHEN 'defer' THEN :next_kwargs::text
                                    WHEN 'restart' THEN NULL ELSE next_kwargs END,
    trigger_id = CASE :resume_mode WHEN 'defer' THEN :trigger_id::bigint ELSE trigger_id END,
    soft_fail = CASE :resume_mode WHEN 'defer' THEN :soft_fail::integer ELSE soft_fail END,
    wait_started_at = CASE :wait_mode::text
                      WHEN 'start' THEN COALESCE(wait_started_at, :wait_started_at::float8)
                      WHEN 'clear' THEN NULL ELSE wait_started_at END,
    wait_timeout_at = CASE :wait_mode WHEN 'start' THEN :wait_timeout_at::float8
                                      WHEN 'clear' THEN NULL ELSE wait_timeout_at END
WHERE id = ANY(:ids::bigint[]) AND (state || '') = :expected
  AND (:expect_owner::text IS NULL OR owner = :expect_owner::text)
-- What callers read (executor/rows.py, MovedTask): settling a transition, running a claim.
RETURNING id, run_id, task_id, map_index, state, attempt, max_attempts, is_leaf, priority,
          n_parents, expand_from, item, map_total, next_method, next_kwargs, event,
          wait_started_at, owner, started_at;

-- name: bump_children
-- A parent ended: count it in each child's counters (each flag is 0/1 by how it ended).
UPDATE task t
SET n_done = t.n_done + 1, n_success = t.n_success + :success, n_failed = t.n_failed + :failed,
    n_upstream_failed = t.n_upstream_failed + :upstream_failed,
    n_skipped = t.n_skipped + :skipped
FROM edge e
WHERE e.run_id = :run_id AND e.parent = :parent
  AND t.run_id = (e.run_id || '') AND t.task_id = e.child AND t.map_index = -1
RETURNING t.*;

-- name: claim_candidates
-- Rows another worker is claiming right now are skipped, not waited for; a row whose
-- ready_at was cleared meanwhile is re-checked and dropped. No row is claimed twice.
SELECT id, state FROM task
WHERE ready_at IS NOT NULL AND ready_at <= :now
ORDER BY priority DESC, ready_at, id
LIMIT :n
FOR UPDATE SKIP LOCKED;

-- name: external_states
-- Cross-DAG questions, all answered at once: :questions is a JSON array of
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
FROM jsonb_array_elements(:questions::text::jsonb) WITH ORDINALITY AS q(value, ord)
ORDER BY q.ord;

-- name: load_triggers
-- The waits of the given shards, from trigger id :after on (0 for a full reload): the
-- tasks' and the start waits'. In no order: the loader needs none, and sorting the union
-- would be one more pass over every row of a full reload.
-- Identity ids are handed out at INSERT but become visible at COMMIT, and concurrent
-- workers commit out of order: a row with an id below :after may appear after a load that
-- moved the cursor past it. So every row is also returned, once, by the first load that
-- sees it: `loaded` marks the rows some load has returned (a triggerer skips rows it holds).
-- (A UNION, not an OR: each half reads an index; an OR made it a scan of every trigger.)
WITH fresh AS (
    UPDATE trigger SET loaded = TRUE
    WHERE NOT loaded AND shard = ANY(:shards::integer[])
    RETURNING id
), wanted AS (
    SELECT id FROM trigger WHERE shard = ANY(:shards::integer[]) AND id > :after::bigint
    UNION
    SELECT id FROM fresh
)
SELECT g.id AS trigger_id, g.classpath, g.kwargs, g.poke_hash, g.shard, t.id AS task_row,
       t.next_method, g.not_before
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
UNION ALL
-- A start wait is a subscriber too, under the negative of its id (triggerer/store.py).
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, -s.id, NULL, g.not_before
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN start_wait s ON s.trigger_id = g.id;

-- name: deferred_rows
-- Locked, so that the trigger they wait on cannot change before this transaction moves them.
SELECT id, trigger_id, attempt, max_attempts, soft_fail, next_method, wait_started_at FROM task
WHERE id = ANY(:ids::bigint[]) AND (state || '') = 'DEFERRED'
FOR UPDATE;

-- name: expired_waits
SELECT t.id, t.soft_fail, t.wait_started_at FROM task t JOIN trigger g ON g.id = t.trigger_id
WHERE t.state = 'DEFERRED' AND t.wait_timeout_at < :now
  AND g.shard = ANY(:shards::integer[]);

-- name: lock_dags_runs
-- Serializes the creation and starting of these DAGs' runs until commit, so that two
-- creators (or a creator and a run ending) never both see room under max_active_runs.
-- Taken in dag_id order (the sorted subquery), so two batches cannot deadlock.
SELECT pg_advisory_xact_lock(hashtext('slotless.dag_run:' || d)) IS NULL AS locked
FROM (SELECT d FROM unnest(:dag_ids::text[]) AS d ORDER BY d) AS sorted;

-- name: armed_start_waits
-- The start waits a fire is for, locked until commit: a concurrent fire of the same event
-- (a takeover) waits, then sees the wait re-armed and does nothing.
SELECT id, dag_id, kind, trigger_id, logical_date, interval_end FROM start_wait
WHERE id = ANY(:ids) ORDER BY id
FOR UPDATE;

-- name: migrate_lock
-- One migrator at a time per schema; the others wait here, then find the work done.
SELECT pg_advisory_xact_lock(hashtext('slotless.migrate:' || current_schema()));

-- name: database_name
SELECT current_database() || '.' || current_schema() AS name;
