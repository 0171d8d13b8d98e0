-- The statements whose SQLite spelling differs from PostgreSQL's; the rest are in
-- schema/common/queries.sql. Parameters are named; a JSON array stands for a list.

-- name: cas
-- The one compare-and-set through which every task state change passes, with what the
-- transition carries (executor/statemachine.py, Carry), so a state and its payload change
-- in one statement. :output_mode keep | one (:output for every row) | each (:outputs, a
-- JSON object of row id -> output); :resume_mode keep | event | defer | restart (a retry
-- forgets the resume point, the event and the wait); :wait_mode keep | start | clear.
UPDATE task
SET state = :new, ready_at = :ready_at, owner = :owner, heartbeat_at = :heartbeat_at,
    attempt = attempt + :attempt_delta, updated_at = :now,
    started_at = CASE WHEN :new = 'RUNNING' AND started_at IS NULL THEN :now ELSE started_at END,
    ended_at = CASE WHEN :terminal = 1 THEN :now ELSE ended_at END,
    output = CASE :output_mode WHEN 'one' THEN :output
                               WHEN 'each' THEN json_extract(:outputs, '$."' || id || '"')
                               ELSE output END,
    event = CASE :resume_mode WHEN 'event' THEN :event WHEN 'keep' THEN event ELSE NULL END,
    next_method = CASE :resume_mode WHEN 'defer' THEN :next_method
                                    WHEN 'restart' THEN NULL ELSE next_method END,
    next_kwargs = CASE :resume_mode WHEN 'defer' THEN :next_kwargs
                                    WHEN 'restart' THEN NULL ELSE next_kwargs END,
    trigger_id = CASE :resume_mode WHEN 'defer' THEN :trigger_id ELSE trigger_id END,
    soft_fail = CASE :resume_mode WHEN 'defer' THEN :soft_fail ELSE soft_fail END,
    wait_started_at = CASE :wait_mode WHEN 'start' THEN COALESCE(wait_started_at, :wait_started_at)
                                      WHEN 'clear' THEN NULL ELSE wait_started_at END,
    wait_timeout_at = CASE :wait_mode WHEN 'start' THEN :wait_timeout_at
                                      WHEN 'clear' THEN NULL ELSE wait_timeout_at END
WHERE id = ANY(:ids) AND state = :expected
  AND (:expect_owner IS NULL OR owner = :expect_owner)
-- What callers read (executor/rows.py, MovedTask): settling a transition, running a claim.
RETURNING id, run_id, task_id, map_index, state, attempt, max_attempts, is_leaf, priority,
          n_parents, expand_from, item, map_total, next_method, next_kwargs, event,
          wait_started_at, owner, started_at;

-- name: bump_children
-- A parent ended: count it in each child's counters (each flag is 0/1 by how it ended).
UPDATE task
SET n_done = n_done + 1, n_success = n_success + :success, n_failed = n_failed + :failed,
    n_upstream_failed = n_upstream_failed + :upstream_failed, n_skipped = n_skipped + :skipped
WHERE run_id = :run_id AND map_index = -1
  AND task_id IN (SELECT child FROM edge WHERE run_id = :run_id AND parent = :parent)
RETURNING *;

-- name: claim_candidates
-- SQLite has one writer at a time: the write transaction that reads these claims them.
SELECT id, state FROM task
WHERE ready_at IS NOT NULL AND ready_at <= :now
ORDER BY priority DESC, ready_at, id
LIMIT :n;

-- name: external_states
-- Cross-DAG questions, all answered at once: :questions is a JSON array of
-- {"q": n, "dag_id": ..., "task_id": ... or null, "logical_date": ...}; the latest run wins.
SELECT q.value ->> 'q' AS q,
       (SELECT CASE WHEN q.value ->> 'task_id' IS NULL THEN r.state
                    ELSE (SELECT t.state FROM task t
                          WHERE t.run_id = r.run_id AND t.task_id = q.value ->> 'task_id'
                            AND t.map_index = -1) END
        FROM dag_run r
        WHERE r.dag_id = q.value ->> 'dag_id' AND r.logical_date = q.value ->> 'logical_date'
        ORDER BY r.created_at DESC, r.rowid DESC LIMIT 1) AS state,
       (SELECT r.run_id FROM dag_run r
        WHERE r.dag_id = q.value ->> 'dag_id' AND r.logical_date = q.value ->> 'logical_date'
        ORDER BY r.created_at DESC, r.rowid DESC LIMIT 1) AS run_id
FROM json_each(:questions) AS q;

-- name: load_triggers
-- The waits of the given shards, from trigger id :after on (0 for a full reload): the
-- tasks' and the start waits'. In no order: the loader needs none, and sorting the union
-- would be one more pass over every row of a full reload.
SELECT g.id AS trigger_id, g.classpath, g.kwargs, g.poke_hash, g.shard, t.id AS task_row,
       t.next_method, g.not_before
FROM trigger g JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
WHERE g.shard = ANY(:shards) AND g.id > :after
UNION ALL
-- A start wait is a subscriber too, under the negative of its id (triggerer/store.py).
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, -s.id, NULL, g.not_before
FROM trigger g JOIN start_wait s ON s.trigger_id = g.id
WHERE g.shard = ANY(:shards) AND g.id > :after;

-- name: deferred_rows
SELECT id, trigger_id, attempt, max_attempts, soft_fail, next_method, wait_started_at FROM task
WHERE id = ANY(:ids) AND state = 'DEFERRED';

-- name: expired_waits
-- CROSS JOIN keeps task first, read through task_wait_timeout: otherwise SQLite walks
-- every trigger of the shards (190 ms a second at 100,000 waits) to find none expired.
SELECT t.id, t.soft_fail, t.wait_started_at FROM task t CROSS JOIN trigger g ON g.id = t.trigger_id
WHERE t.state = 'DEFERRED' AND t.wait_timeout_at < :now
  AND g.shard = ANY(:shards);

-- name: lock_dags_runs
-- Nothing to take: a write transaction (BEGIN IMMEDIATE) already holds the file's lock.
SELECT count(*) AS locked FROM dag WHERE dag_id = ANY(:dag_ids);

-- name: armed_start_waits
-- The start waits a fire is for (the write transaction holds the lock: no concurrent fire).
SELECT id, dag_id, kind, trigger_id, logical_date, interval_end FROM start_wait
WHERE id = ANY(:ids) ORDER BY id;

-- name: migrate_lock
-- Nothing to take: the migration's write transaction (BEGIN IMMEDIATE) holds the file's lock.
SELECT 1;

-- name: database_name
SELECT file AS name FROM pragma_database_list WHERE name = 'main';
