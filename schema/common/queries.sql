-- Every statement that reads the same on SQLite and PostgreSQL. Parameters are named
-- (:run_id); a list is written `col = ANY(:ids)` (on SQLite: json_each over a JSON array,
-- see schema/__init__.py). Times are epoch seconds from the store's clock (on PostgreSQL
-- the server's: leases are judged on the database's timeline). The dialect-specific
-- statements (bump_children, the triggerer's load, ...) are in the backends' files, and
-- schema/__init__.py says what it rewrites for each (casts, row locks, planner hints).

-- name: insert_event
INSERT INTO task_event (task_row, ts, kind, from_state, to_state, attempt, message)
VALUES (:task_row, :ts, :kind, :from_state, :to_state, :attempt, :message);

-- name: insert_slot_usage
INSERT INTO slot_usage (worker_id, slot, task_row, kind, started_at, ended_at)
VALUES (:worker_id, :slot, :task_row, :kind, :started_at, :ended_at);

-- ---------------------------------------------------------------- runs and their tasks

-- name: insert_run
-- At most one run per (dag_id, run_key): a second insert of a key inserts nothing (and on
-- PostgreSQL waits for a concurrent insert of the same key to commit or roll back).
-- Run as executemany over a batch, without RETURNING (2.5 times slower on SQLite there):
-- runs_by_id says which were inserted.
-- The run_id of a schedule's run is made of its interval (executor/store/runs.py:
-- interval_run_id), so a taken key comes with a taken run_id: the conflict target is
-- checked first (SQLite; PostgreSQL's arbiter index), and creators of one DAG's runs
-- hold its lock (lock_dags_runs), so the second insert finds the first committed.
INSERT INTO dag_run (run_id, dag_id, logical_date, state, dag_file, created_at, tasks_unfinished,
                     run_key, conf, data_interval_start, data_interval_end, start_event,
                     max_active, hooks, on_task_failure, deadline_at, timeout_s, late_at,
                     logical_time, timezone, run_type)
VALUES (:run_id, :dag_id, :logical_date, :state, :dag_file, :now, :tasks, :run_key, :conf,
        :data_interval_start, :data_interval_end, :start_event, :max_active, :hooks,
        :on_task_failure, :deadline_at, :timeout_s, :late_at,
        :logical_time, :timezone, :run_type)
ON CONFLICT (dag_id, run_key) DO NOTHING;

-- name: run_by_key
SELECT run_id, state FROM dag_run WHERE dag_id = :dag_id AND run_key = :run_key;

-- name: dags_runs_going
-- Read under lock_dags_runs: whether new runs of these DAGs must queue. A PAUSED run holds
-- its place: it goes on when resumed.
SELECT dag_id,
       COALESCE(sum(CASE WHEN state IN ('RUNNING', 'PAUSED') THEN 1 ELSE 0 END), 0) AS running,
       COALESCE(sum(CASE WHEN state = 'QUEUED' THEN 1 ELSE 0 END), 0) AS queued
FROM dag_run WHERE dag_id = ANY(:dag_ids) AND state IN ('RUNNING', 'QUEUED', 'PAUSED')
GROUP BY dag_id;

-- name: runs_by_id
-- Which of a batch's runs were inserted (the others' run keys were taken).
SELECT run_id FROM dag_run WHERE run_id = ANY(:ids);

-- name: runs_tasks
SELECT * FROM task WHERE run_id = ANY(:ids) AND map_index = -1 ORDER BY id;

-- name: next_queued_run
-- The DAG's oldest queued run (by interval, then creation), and how many runs it has going.
SELECT r.run_id, r.max_active,
       (SELECT count(*) FROM dag_run a
        WHERE a.dag_id = r.dag_id AND a.state IN ('RUNNING', 'PAUSED')) AS running
FROM dag_run r WHERE r.dag_id = :dag_id AND r.state = 'QUEUED'
ORDER BY COALESCE(r.data_interval_start, r.logical_date), r.created_at, r.run_id
LIMIT 1;

-- name: insert_task
-- :ready_at is set for the tasks a new RUNNING run starts at once (executor/store/runs.py).
INSERT INTO task (run_id, task_id, state, trigger_rule, priority, is_leaf, expand_from, map_cap,
                  max_attempts, n_parents, ready_at, updated_at, pool, pool_slots, queue,
                  hooks, role)
VALUES (:run_id, :task_id, 'PENDING', :trigger_rule, :priority, :is_leaf, :expand_from,
        :map_cap, :max_attempts, :n_parents, :ready_at, :now, :pool, :pool_slots, :queue,
        :hooks, :role);

-- name: insert_edge
INSERT INTO edge (run_id, parent, child) VALUES (:run_id, :parent, :child);

-- name: insert_instance
-- Instances keep expand_from so that their inputs leave out the list they were cut from,
-- and their template's pool and queue.
INSERT INTO task (run_id, task_id, map_index, state, trigger_rule, priority, is_leaf,
                  max_attempts, item, map_total, expand_from, ready_at, updated_at,
                  pool, pool_slots, queue)
VALUES (:run_id, :task_id, :map_index, 'PENDING', 'all_success', :priority, 0, :max_attempts,
        :item, :map_total, :expand_from, :now, :now, :pool, :pool_slots, :queue)
ON CONFLICT DO NOTHING;

-- name: insert_group_instance
-- An instance of a mapped task group's member (executor/mapping.py): its own trigger rule
-- over its parents in the group (instance i waits for their instances i), ready at once
-- when it has none there.
INSERT INTO task (run_id, task_id, map_index, state, trigger_rule, priority, is_leaf,
                  max_attempts, item, map_total, expand_from, n_parents, ready_at, updated_at,
                  pool, pool_slots, queue)
VALUES (:run_id, :task_id, :map_index, 'PENDING', :trigger_rule, :priority, 0, :max_attempts,
        :item, :map_total, :expand_from, :n_parents, :ready_at, :now, :pool, :pool_slots,
        :queue)
ON CONFLICT DO NOTHING;

-- name: bump_instances
-- An instance of a mapped group's member ended: count it in the same index's instances of
-- its children in the group.
UPDATE task
SET n_done = n_done + 1, n_success = n_success + :success, n_failed = n_failed + :failed,
    n_upstream_failed = n_upstream_failed + :upstream_failed, n_skipped = n_skipped + :skipped
WHERE run_id = :run_id AND map_index = :map_index AND task_id = ANY(:task_ids)
RETURNING *;

-- name: instance_outputs
SELECT task_id, output FROM task
WHERE run_id = :run_id AND map_index = :map_index AND task_id = ANY(:task_ids);

-- name: set_item
UPDATE task SET item = :item WHERE id = :id;

-- name: group_parents_ended
-- Whether a mapped group's member expanding anew (its group partly cleared) has parents in
-- the group whose instances already ended: they will not report again.
SELECT 1 AS found FROM task
WHERE run_id = :run_id AND task_id = ANY(:after) AND map_index >= 0
  AND state IN ('SUCCESS', 'FAILED', 'UPSTREAM_FAILED', 'SKIPPED')
LIMIT 1;

-- name: recount_group_instances
-- Such a member's new instances, counted from the same index's instances of its parents.
UPDATE task
SET n_done = (SELECT count(*) FROM task p WHERE p.run_id = task.run_id
                AND p.map_index = task.map_index AND p.task_id = ANY(:after)
                AND p.state IN ('SUCCESS', 'FAILED', 'UPSTREAM_FAILED', 'SKIPPED')),
    n_success = (SELECT count(*) FROM task p WHERE p.run_id = task.run_id
                   AND p.map_index = task.map_index AND p.task_id = ANY(:after)
                   AND p.state = 'SUCCESS'),
    n_failed = (SELECT count(*) FROM task p WHERE p.run_id = task.run_id
                  AND p.map_index = task.map_index AND p.task_id = ANY(:after)
                  AND p.state = 'FAILED'),
    n_upstream_failed = (SELECT count(*) FROM task p WHERE p.run_id = task.run_id
                           AND p.map_index = task.map_index AND p.task_id = ANY(:after)
                           AND p.state = 'UPSTREAM_FAILED'),
    n_skipped = (SELECT count(*) FROM task p WHERE p.run_id = task.run_id
                   AND p.map_index = task.map_index AND p.task_id = ANY(:after)
                   AND p.state = 'SKIPPED')
WHERE run_id = :run_id AND task_id = :task_id AND map_index >= 0 AND state = 'PENDING'
  AND ready_at IS NULL
RETURNING *;

-- name: set_expanded
UPDATE task
SET n_parents = :n, n_done = 0, n_success = 0, n_failed = 0, n_upstream_failed = 0,
    n_skipped = 0, map_total = :n
WHERE id = :id;

-- name: run_tasks
SELECT * FROM task WHERE run_id = :run_id AND map_index = -1 ORDER BY id;

-- name: run_tasks_done
UPDATE dag_run
SET tasks_unfinished = tasks_unfinished - :done, leaves_failed = leaves_failed + :leaves_failed
WHERE run_id = :run_id
RETURNING tasks_unfinished, leaves_failed, dag_id, state, on_task_failure;

-- name: cas
-- The one compare-and-set through which every task state change passes, with what the
-- transition carries (executor/carried.py turns a payload into these modes), so a state
-- and its payload change in one statement. Each carried column is kept, set from one
-- value for every row moved, set from the row's entry in :per_row (a JSON object of row
-- id -> the value, when one column is carried per row; else -> {column: value}), or
-- cleared:
-- * :output_mode keep | one (:output) | each;
-- * :resume_mode keep | one (:event) | each (event) | defer (next_method, next_kwargs,
--   trigger_id, soft_fail; the event cleared) | restart (a retry forgets the resume point
--   and the event);
-- * :wait_mode keep | one (:wait_started_at, kept if a wait already started, and
--   :wait_timeout_at) | each | clear.
-- On PostgreSQL, under READ COMMITTED, a row another transaction holds is waited for, then
-- re-checked against the expected state: a racing process changes nothing the second time.
{{log_moved_begin}}
UPDATE task
SET state = :new, ready_at = :ready_at, owner = :owner, heartbeat_at = :heartbeat_at,
    attempt = attempt + :attempt_delta, updated_at = :now,
    started_at = CASE WHEN :new = 'RUNNING' AND started_at IS NULL THEN :now ELSE started_at END,
    ended_at = CASE WHEN :terminal = 1 THEN :now ELSE ended_at END,
    output = CASE :output_mode::text WHEN 'one' THEN :output::text
                                     WHEN 'each' THEN json_at(:per_row, id)
                                     ELSE output END,
    event = CASE :resume_mode::text WHEN 'one' THEN :event::text
                                    WHEN 'each' THEN json_at(:per_row, id)
                                    WHEN 'keep' THEN event ELSE NULL END,
    next_method = CASE :resume_mode WHEN 'defer' THEN json_at(:per_row, id, 'next_method')
                                    WHEN 'restart' THEN NULL ELSE next_method END,
    next_kwargs = CASE :resume_mode WHEN 'defer' THEN json_at(:per_row, id, 'next_kwargs')
                                    WHEN 'restart' THEN NULL ELSE next_kwargs END,
    trigger_id = CASE :resume_mode WHEN 'defer' THEN json_at(:per_row, id, 'trigger_id')::bigint
                                   ELSE trigger_id END,
    soft_fail = CASE :resume_mode WHEN 'defer' THEN json_at(:per_row, id, 'soft_fail')::integer
                                  ELSE soft_fail END,
    wait_started_at = CASE :wait_mode::text
                      WHEN 'one' THEN COALESCE(wait_started_at, :wait_started_at::float8)
                      WHEN 'each' THEN COALESCE(wait_started_at,
                          json_at(:per_row, id, 'wait_started_at')::float8)
                      WHEN 'clear' THEN NULL ELSE wait_started_at END,
    wait_timeout_at = CASE :wait_mode WHEN 'one' THEN :wait_timeout_at::float8
                      WHEN 'each' THEN json_at(:per_row, id, 'wait_timeout_at')::float8
                      WHEN 'clear' THEN NULL ELSE wait_timeout_at END
-- `(state || '') = :expected`: the rows are found by id, and the expression keeps the
-- state out of the plan. On PostgreSQL the planner would otherwise scan a partial index
-- over every DEFERRED row (O(waits) per statement). On SQLite a parameter compared with a
-- column that a partial index's condition names (state = 'RUNNING', ...) makes the
-- statement compiled again at every new binding: 80-100 us per transition.
WHERE id = ANY(:ids::bigint[]) AND (state || '') = :expected
  AND (:expect_owner::text IS NULL OR owner = :expect_owner::text)
-- What callers read (executor/rows.py, MovedTask, by column name): settling a transition,
-- running a claim. Each moved row's message (:messages' entry, else :message) is for its
-- task_event row.
RETURNING id, run_id, task_id, map_index, state, attempt, max_attempts, is_leaf, priority,
          n_parents, expand_from, item, map_total, next_method, next_kwargs, event,
          wait_started_at, owner, started_at, hooks,
          COALESCE(json_at(:messages, id), :message::text) AS message
{{log_moved_end}};

-- name: cas_run
-- A run's compare-and-set (executor.statemachine.transition_run), with what arming its
-- time waits needs (executor/runwaits.py).
UPDATE dag_run SET state = :new, ended_at = :ended_at
WHERE run_id = :run_id AND state = :expected
RETURNING run_id, hooks, deadline_at, timeout_s, late_at, deadline_missed_at;

-- name: bump_template
-- Instances of a mapped task ended: count them in the template's counters.
UPDATE task
SET n_done = n_done + :done, n_success = n_success + :success, n_failed = n_failed + :failed,
    n_upstream_failed = n_upstream_failed + :upstream_failed, n_skipped = n_skipped + :skipped
WHERE run_id = :run_id AND task_id = :task_id AND map_index = -1
RETURNING *;

-- name: mark_ready
UPDATE task SET ready_at = :now
WHERE id = ANY(:ids) AND state = 'PENDING' AND ready_at IS NULL;

-- name: task_result
SELECT state, output, map_total FROM task
WHERE run_id = :run_id AND task_id = :task_id AND map_index = -1;

-- name: mapped_outputs
SELECT output FROM task
WHERE run_id = :run_id AND task_id = :task_id AND map_index >= 0
ORDER BY map_index;

-- name: parent_outputs
-- Outputs of a task's parents; a mapped parent contributes its instances in index order.
-- :leave_out names a parent to leave out (a mapped instance's source: it gets its item).
SELECT task_id, map_index, output, expand_from FROM task
WHERE run_id = :run_id
  AND task_id IN (SELECT parent FROM edge
                  WHERE run_id = :run_id AND child = :task_id
                    AND parent IS DISTINCT FROM :leave_out)
ORDER BY task_id, map_index;

-- name: ids_by_task_id
SELECT id FROM task WHERE run_id = :run_id AND map_index = -1 AND task_id = ANY(:task_ids);

-- name: heartbeat
-- The rows still held; one missing was taken back (reaped, cleared with force, cancelled).
UPDATE task SET heartbeat_at = :now
WHERE id = ANY(:ids) AND state = 'RUNNING' AND owner = :owner
RETURNING id;

-- name: stale_running
SELECT id, owner, attempt, max_attempts, heartbeat_at,
       (SELECT r.created_at FROM dag_run r WHERE r.run_id = task.run_id) AS run_created_at
FROM task
WHERE state = 'RUNNING' AND owner IS NOT NULL AND heartbeat_at < :before;

-- name: run_info
SELECT * FROM dag_run WHERE run_id = :run_id;

-- name: run_counts
SELECT state, count(*) AS n FROM task WHERE run_id = :run_id AND map_index >= 0 GROUP BY state
UNION ALL
SELECT state, count(*) AS n FROM task
WHERE run_id = :run_id AND map_index = -1 AND map_total IS NULL
GROUP BY state;

-- name: list_runs
SELECT * FROM dag_run ORDER BY created_at DESC LIMIT :n;

-- name: task_row
SELECT * FROM task WHERE run_id = :run_id AND task_id = :task_id AND map_index = :map_index;

-- name: task_events
SELECT * FROM task_event WHERE task_row = :task_row ORDER BY id;

-- name: failed_tasks
-- :n at most, in row order: a run's FAILED tasks and mapped instances (of one task with
-- :task_id, of all with ''), each with the message of the transition that failed it. A
-- mapped task's own row is left out: its instances say why it failed.
SELECT t.task_id, t.map_index,
       (SELECT e.message FROM task_event e WHERE e.task_row = t.id AND e.to_state = 'FAILED'
        ORDER BY e.id DESC LIMIT 1) AS error
FROM task t
WHERE t.run_id = :run_id AND t.state = 'FAILED'
  AND (t.task_id = :task_id OR :task_id = '')
  AND NOT (t.map_index = -1 AND t.map_total IS NOT NULL)
ORDER BY t.id
LIMIT :n;

-- name: mapped_counts
SELECT task_id, state, count(*) AS n FROM task
WHERE run_id = :run_id AND map_index >= 0
GROUP BY task_id, state;

-- name: claim_candidates
-- The ready tasks a worker may claim. Only the worker's queues; a limited pool only when it
-- exists, is not in :full (found full earlier in this transaction) and had a free slot
-- when this statement started (a pre-filter: executor/pools.py decides how many fit, on
-- PostgreSQL from a count taken under the pool's lock). On PostgreSQL rows another worker
-- is claiming right now are skipped, not waited for, and a row whose ready_at was cleared
-- meanwhile is re-checked and dropped; on SQLite, one writer at a time, the write
-- transaction that reads these claims them. No row is claimed twice. Rows in :busy are
-- ones the claiming worker still runs a taken-back copy of: another worker may take them.
SELECT t.id, t.state, t.pool, t.pool_slots FROM task t
WHERE t.ready_at IS NOT NULL AND t.ready_at <= :now
  AND t.queue = ANY(:queues::text[])
  AND NOT (t.id = ANY(:busy::bigint[]))
  AND (t.pool = 'default' OR t.pool IN (
        SELECT p.name FROM pool p
        WHERE NOT (p.name = ANY(:full::text[]))
          AND p.slots > (SELECT COALESCE(SUM(r.pool_slots), 0) FROM task r
                         WHERE r.pool = p.name AND r.state = 'RUNNING'
                           AND (r.map_index >= 0 OR r.expand_from IS NULL))))
ORDER BY t.priority DESC, t.ready_at, t.id
LIMIT :n
FOR UPDATE OF t SKIP LOCKED;

-- ---------------------------------------------------------------- callbacks and notifications
-- executor/notifications.py records events; executor/store/callbacks.py delivers them.

-- name: insert_callback
-- In the transaction of the change that raises the event; a :dedup_key already recorded
-- records nothing (a replayed fire).
INSERT INTO callback (run_id, task_row, task_id, event, attempt, message, context, dedup_key,
                      ready_at, created_at)
VALUES (:run_id, :task_row,
        COALESCE(:task_id, (SELECT t.task_id FROM task t WHERE t.id = :task_row)),
        :event, :attempt, :message, :context, :dedup_key, :now, :now)
ON CONFLICT (dedup_key) DO NOTHING;

-- name: claim_callbacks
-- Callback rows due, for a worker's free slots (executor/store/callbacks.py), each task's
-- in the order they were raised (a retried one holds back the ones after it). On
-- PostgreSQL rows another worker is claiming right now are skipped, not waited for; on
-- SQLite the write transaction that reads these claims them.
UPDATE callback SET state = 'RUNNING', owner = :owner, heartbeat_at = :now, tries = tries + 1,
                    ready_at = NULL
WHERE id IN (SELECT c.id FROM callback c
             WHERE c.ready_at IS NOT NULL AND c.ready_at <= :now
               -- a task's events go out in order: none while an earlier one is unfinished
               AND NOT EXISTS (SELECT 1 FROM callback e
                               WHERE e.task_row = c.task_row AND e.id < c.id
                                 AND e.state IN ('PENDING', 'RUNNING'))
             ORDER BY c.ready_at, c.id LIMIT :n
  FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: callback_heartbeat
UPDATE callback SET heartbeat_at = :now
WHERE id = ANY(:ids) AND state = 'RUNNING' AND owner = :owner
RETURNING id;

-- name: stale_callbacks
-- Rows whose worker stopped heartbeating: claimable again (a try was spent).
UPDATE callback SET state = 'PENDING', owner = NULL, ready_at = :now, last_error = :why
WHERE state = 'RUNNING' AND heartbeat_at < :before
RETURNING id, task_row, attempt, event, tries;

-- name: callbacks_of_worker
-- A gone worker's rows, by its claims' "<worker id>#<n>" owners: claimable again.
UPDATE callback SET state = 'PENDING', owner = NULL, ready_at = :now, last_error = :why
WHERE state = 'RUNNING' AND owner IS NOT NULL AND substr(owner, 1, length(:prefix)) = :prefix
RETURNING id, task_row, attempt, event, tries;

-- name: callback_delivered
-- One handler done: remembered at once, so a retry of the row does not run it again.
UPDATE callback SET delivered = :delivered, heartbeat_at = :now
WHERE id = :id AND state = 'RUNNING' AND owner = :owner
RETURNING id;

-- name: end_callback
-- DONE, FAILED (tries spent), or PENDING again at :ready_at (a retry, with backoff).
UPDATE callback SET state = :state, owner = NULL, ready_at = :ready_at, ended_at = :ended_at,
                    last_error = :error, delivered = :delivered
WHERE id = :id AND state = 'RUNNING' AND owner = :owner
RETURNING id;

-- name: callback_log_tail
-- What a handler sees of the task's log: its last lines (ctx.log, tracebacks) up to the event.
SELECT ts, kind, message FROM task_event
WHERE task_row = :task_row AND kind IN ('log', 'error') AND ts <= :before
ORDER BY id DESC LIMIT :n;

-- name: run_callbacks
SELECT * FROM callback WHERE run_id = :run_id ORDER BY id;

-- ---------------------------------------------------------------- deferral

-- name: insert_trigger
-- :description is the trigger's describe(), shown by `slotless status` and the web page.
-- On PostgreSQL the INSERT wakes the triggerers (NOTIFY slotless_triggers, 001_init.sql).
INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, description, not_before)
VALUES (:classpath, :kwargs, :poke_hash, :shard, :now, :description, :not_before)
RETURNING id;

-- name: delete_trigger
DELETE FROM trigger WHERE id = :id;

-- ---------------------------------------------------------------- the triggerer

-- name: triggerer_beat
INSERT INTO triggerer (id, seen_at, started_at, triggers, loop_lag_ms)
VALUES (:id, :now, :now, :triggers, :loop_lag_ms)
ON CONFLICT (id) DO UPDATE SET seen_at = :now, triggers = :triggers, loop_lag_ms = :loop_lag_ms;

-- name: live_triggerers
SELECT id FROM triggerer WHERE seen_at >= :since ORDER BY id;

-- Liveness: who else runs, to ask whether each still holds its lock -------

-- name: other_triggerers
-- Every other triggerer known: holding leases, or only listed (it may hold none yet).
SELECT owner AS id FROM shard_lease WHERE owner IS NOT NULL AND owner <> :me
UNION
SELECT id FROM triggerer WHERE id <> :me;

-- name: worker_beat
-- Live until :expires_at (its stale_after ahead) unless its liveness lock says otherwise.
INSERT INTO worker (id, started_at, seen_at, expires_at) VALUES (:id, :now, :now, :expires_at)
ON CONFLICT (id) DO UPDATE SET seen_at = :now, expires_at = :expires_at;

-- name: worker_serves
-- With every beat: a row reaped after a pause comes back whole.
INSERT INTO worker_queue (worker_id, queue, slots) VALUES (:worker_id, :queue, :slots)
ON CONFLICT (worker_id, queue) DO UPDATE SET slots = :slots;

-- name: worker_leave
DELETE FROM worker WHERE id = :id;

-- name: worker_queues_leave
DELETE FROM worker_queue WHERE worker_id = :id;

-- name: worker_queues_forget
-- Queues of workers whose row is gone (reaped after their TTL).
DELETE FROM worker_queue WHERE worker_id NOT IN (SELECT id FROM worker);

-- name: other_workers
SELECT id FROM worker WHERE id <> :me;

-- name: forget_stale_workers
DELETE FROM worker WHERE seen_at < :before;

-- name: running_of_worker
-- A worker's claims are owned by "<worker id>#<n>": every attempt it runs, by prefix.
SELECT id, owner, attempt, max_attempts, heartbeat_at,
       (SELECT r.created_at FROM dag_run r WHERE r.run_id = task.run_id) AS run_created_at
FROM task
WHERE state = 'RUNNING' AND owner IS NOT NULL AND substr(owner, 1, length(:prefix)) = :prefix;

-- name: deferred_rows
-- Locked on PostgreSQL, so that the trigger they wait on cannot change before this
-- transaction moves them (SQLite's write transaction holds the file's lock).
-- `has_trigger`: a fire from memory for a row deleted meanwhile must not apply.
-- `(state || '')`: found by id, never through the partial index of DEFERRED rows.
SELECT id, trigger_id, attempt, max_attempts, soft_fail, next_method, wait_started_at,
       wait_timeout_at,
       EXISTS (SELECT 1 FROM trigger g WHERE g.id = task.trigger_id) AS has_trigger
FROM task
WHERE id = ANY(:ids::bigint[]) AND (state || '') = 'DEFERRED'
FOR UPDATE OF task;

-- name: expired_waits
-- A LEFT JOIN keeps the waits whose trigger row is missing or NULL: those time out too,
-- homed by task id. On SQLite it also keeps task first, read through task_wait_timeout
-- (otherwise SQLite walks every trigger of the shards, 190 ms a second at 100,000 waits,
-- to find none expired).
SELECT t.id, t.soft_fail, t.wait_started_at FROM task t LEFT JOIN trigger g ON g.id = t.trigger_id
WHERE t.state = 'DEFERRED' AND t.wait_timeout_at < :now
  AND COALESCE(g.shard, (t.id % :n_shards::integer)::integer) = ANY(:shards::integer[]);

-- name: held_shards_fenced
-- The shards a triggerer's lease still covers, locked until commit (FOR SHARE on
-- PostgreSQL; SQLite's write transaction holds the file's lock): a takeover of one of
-- them waits for this transaction, so a fire written here comes from a triggerer that
-- held the shard when it committed.
SELECT shard FROM shard_lease WHERE owner = :owner AND expires_at >= :now
FOR SHARE;

-- name: trigger_shards
SELECT id, shard FROM trigger WHERE id = ANY(:ids);

-- name: triggerer_leave
DELETE FROM triggerer WHERE id = :id;

-- name: renew_shards
UPDATE shard_lease SET expires_at = :expires_at WHERE owner = :owner RETURNING shard;

-- name: free_shards
SELECT shard FROM shard_lease WHERE owner IS NULL OR expires_at < :now ORDER BY shard;

-- name: take_shard
-- Re-checked under the row lock: of two triggerers racing for a shard, one gets it.
UPDATE shard_lease SET owner = :owner, expires_at = :expires_at
WHERE shard = :shard AND (owner IS NULL OR expires_at < :now);

-- name: release_shard
UPDATE shard_lease SET owner = NULL, expires_at = NULL WHERE shard = :shard AND owner = :owner;

-- name: release_all_shards
UPDATE shard_lease SET owner = NULL, expires_at = NULL WHERE owner = :owner;

-- name: delete_orphan_triggers
DELETE FROM trigger
WHERE shard = ANY(:shards)
  AND NOT EXISTS (SELECT 1 FROM task t WHERE t.trigger_id = trigger.id AND t.state = 'DEFERRED')
  AND NOT EXISTS (SELECT 1 FROM start_wait s WHERE s.trigger_id = trigger.id)
  AND NOT EXISTS (SELECT 1 FROM run_wait w WHERE w.trigger_id = trigger.id);

-- Orphan repair (triggerer/repair.py), once per full reconcile. A row with no trigger has
-- no shard: it is homed by `task id mod shards`, so exactly one triggerer repairs it.

-- name: orphan_deferred
-- DEFERRED tasks whose trigger row is missing, or whose trigger_id is NULL.
SELECT t.id, t.trigger_id, t.attempt, t.max_attempts, t.soft_fail, t.wait_started_at,
       t.wait_timeout_at
FROM task t
WHERE t.state = 'DEFERRED' AND (t.id % :n_shards) = ANY(:shards)
  AND (t.trigger_id IS NULL OR NOT EXISTS (SELECT 1 FROM trigger g WHERE g.id = t.trigger_id));

-- name: take_wait_changes
-- The change log's rows of these shards (019_wait_changes.sql), taken, :n at most: what
-- changed since the last look, so that an idle reconcile and repair read nothing else. A
-- row committed after this statement began is the next look's. (A million rows taken in
-- one statement held SQLite's write lock, and the loop reading them, for a second.)
DELETE FROM wait_change
WHERE id IN (SELECT id FROM wait_change WHERE shard = ANY(:shards) LIMIT :n)
RETURNING shard, task_row, trigger_id;

-- name: wait_change_window
-- The change log's ids after :after, :n rows of them at most (any shard's): the window
-- drop_wait_changes deletes next, in id order (through the index on shard, one shard's
-- rows are scattered over the table's pages: a million deleted so cost 6x the CPU).
SELECT max(id) AS upto
FROM (SELECT id FROM wait_change WHERE id > :after ORDER BY id LIMIT :n) AS w;

-- name: drop_wait_changes
-- take_wait_changes unread, for shards a pass is about to search whole: those rows tell it
-- nothing, and a bulk write's million cost seconds to read back. A window of ids at a time.
DELETE FROM wait_change WHERE shard = ANY(:shards) AND id > :after AND id <= :upto;

-- name: drop_all_wait_changes
-- drop_wait_changes of every shard: one statement (SQLite empties the table whole then,
-- ~5x cheaper than deleting its rows; PostgreSQL deletes what its snapshot sees).
DELETE FROM wait_change;

-- name: orphan_deferred_of
-- orphan_deferred among the tasks the change log named: those that began waiting, and
-- those waiting on a trigger row when it was deleted.
SELECT t.id, t.trigger_id, t.attempt, t.max_attempts, t.soft_fail, t.wait_started_at,
       t.wait_timeout_at
FROM task t
WHERE t.id = ANY(:rows) AND t.state = 'DEFERRED'
  AND (t.trigger_id IS NULL OR NOT EXISTS (SELECT 1 FROM trigger g WHERE g.id = t.trigger_id));

-- name: delete_unwaited_triggers_of
-- delete_orphan_triggers among the trigger rows the change log named (a wait left them).
DELETE FROM trigger
WHERE id = ANY(:ids)
  AND NOT EXISTS (SELECT 1 FROM task t WHERE t.trigger_id = trigger.id AND t.state = 'DEFERRED')
  AND NOT EXISTS (SELECT 1 FROM start_wait s WHERE s.trigger_id = trigger.id)
  AND NOT EXISTS (SELECT 1 FROM run_wait w WHERE w.trigger_id = trigger.id);

-- name: orphan_running
-- RUNNING tasks whose owner is unknown to the store: no owner or no heartbeat ever (a
-- claim sets both; the workers' reap only judges rows that have them). An expanded mapped
-- task's template is RUNNING with no owner while its instances run: not an orphan.
SELECT id, owner, attempt, max_attempts FROM task
WHERE state = 'RUNNING' AND (owner IS NULL OR heartbeat_at IS NULL)
  AND (expand_from IS NULL OR map_index >= 0)
  AND (id % :n_shards) = ANY(:shards);

-- name: max_trigger_id
-- Where the next incremental load starts after a full reload read shard by shard.
SELECT COALESCE(max(id), 0) AS id FROM trigger;

-- name: shard_sums
-- Per shard, how many waits load_triggers would return and a checksum of their (wait_id,
-- trigger id) pairs: a full reconcile reads again only the shards whose sums differ from
-- the triggerer's own (triggerer/waitref.py's wait_sum computes the same), so a minutely
-- reconcile of a million unchanged waits is this one aggregate, not a million rows.
SELECT shard, count(*) AS n, sum((wait_id * 1000003 + trigger_id) % 2147483647)::bigint AS h
FROM (
    SELECT g.shard, t.id AS wait_id, g.id AS trigger_id
    FROM trigger g JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
    WHERE g.shard = ANY(:shards::integer[]) AND g.event_key IS NULL
    UNION ALL
    SELECT g.shard, s.id, g.id FROM trigger g JOIN start_wait s ON s.trigger_id = g.id
    WHERE g.shard = ANY(:shards::integer[])
    UNION ALL
    SELECT g.shard, w.id, g.id FROM trigger g JOIN run_wait w ON w.trigger_id = g.id
    WHERE g.shard = ANY(:shards::integer[])
) AS waits GROUP BY shard;

-- name: list_triggerers
SELECT r.*, (SELECT count(*) FROM shard_lease s WHERE s.owner = r.id) AS shards
FROM triggerer r ORDER BY r.id;

-- ---------------------------------------------------------------- migrations
-- executor/driver/migrate.py; each backend's `migrate_lock` makes migrators take turns.

-- name: schema_version_create
CREATE TABLE IF NOT EXISTS schema_version
    (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL);

-- name: schema_version_current
SELECT COALESCE(max(version), 0) AS version FROM schema_version;

-- name: schema_version_insert
INSERT INTO schema_version (version, name, applied_at) VALUES (:version, :name, :now);

-- ---------------------------------------------------------------- pools and queues
-- Pools and queues: executor/pools.py (the rules), executor/store/pools.py; 006_pools_queues.sql.

-- name: lock_pools
-- A claim that would take slots of these pools holds their rows until commit (PostgreSQL;
-- on SQLite the write transaction already excludes every other claimer), so the count it
-- takes next includes every claim committed before it and none can commit beside it.
-- SKIP LOCKED: a pool another worker is claiming from right now is left to that worker
-- this time (never waited for, so claims never deadlock on pools).
SELECT name, slots FROM pool WHERE name = ANY(:names::text[]) ORDER BY name
FOR UPDATE SKIP LOCKED;

-- name: pool_running
-- Slots in use per pool: its RUNNING rows (a mapped task's template holds none), read
-- through task_pool_running, so the cost is the pool's size, not the table's.
SELECT pool, SUM(pool_slots) AS used FROM task
WHERE pool = ANY(:names) AND state = 'RUNNING' AND (map_index >= 0 OR expand_from IS NULL)
GROUP BY pool;

-- name: pool_set
INSERT INTO pool (name, slots, updated_at) VALUES (:name, :slots, :now)
ON CONFLICT (name) DO UPDATE SET slots = :slots, updated_at = :now;

-- name: pool_delete
DELETE FROM pool WHERE name = :name;

-- name: pools_named
SELECT name, slots FROM pool WHERE name = ANY(:names);

-- name: pool_unfinished
-- How many unfinished tasks name a pool (or a queue): what forbids deleting it.
SELECT count(*) AS n FROM task
WHERE pool = :name AND state NOT IN ('SUCCESS', 'FAILED', 'UPSTREAM_FAILED', 'SKIPPED');

-- name: dags_naming
-- The catalogued DAGs whose stored shape may name a pool or queue (:pattern, a LIKE of the
-- quoted name: a prefilter; the caller reads each shape to be sure).
SELECT dag_id, shape FROM dag WHERE shape LIKE :pattern ORDER BY dag_id;

-- name: queue_unfinished
SELECT count(*) AS n FROM task
WHERE queue = :name AND state NOT IN ('SUCCESS', 'FAILED', 'UPSTREAM_FAILED', 'SKIPPED');

-- name: queue_add
INSERT INTO queue (name, created_at) VALUES (:name, :now) ON CONFLICT (name) DO NOTHING;

-- name: queue_delete
DELETE FROM queue WHERE name = :name;

-- name: queues_named
SELECT name FROM queue WHERE name = ANY(:names);

-- name: ops_pools
-- Every stored pool with its slots in use and its tasks ready to run (claimable now).
SELECT p.name, p.slots,
       (SELECT COALESCE(SUM(r.pool_slots), 0) FROM task r
        WHERE r.pool = p.name AND r.state = 'RUNNING'
          AND (r.map_index >= 0 OR r.expand_from IS NULL)) AS used,
       (SELECT count(*) FROM task w
        WHERE w.ready_at IS NOT NULL AND w.ready_at <= :now AND w.pool = p.name) AS ready
FROM pool p ORDER BY p.name;

-- name: ops_default_pool
SELECT (SELECT COALESCE(SUM(r.pool_slots), 0) FROM task r
        WHERE r.pool = 'default' AND r.state = 'RUNNING'
          AND (r.map_index >= 0 OR r.expand_from IS NULL)) AS used,
       (SELECT count(*) FROM task w
        WHERE w.ready_at IS NOT NULL AND w.ready_at <= :now AND w.pool = 'default') AS ready;

-- name: ops_queues
-- Every queue tasks are ready in or a worker serves or an operator declared: its live
-- workers and their slots, and its tasks ready to run.
SELECT q.name,
       (SELECT count(*) FROM worker_queue s JOIN worker w ON w.id = s.worker_id
        WHERE s.queue = q.name AND w.expires_at >= :now) AS workers,
       (SELECT COALESCE(SUM(s.slots), 0) FROM worker_queue s JOIN worker w ON w.id = s.worker_id
        WHERE s.queue = q.name AND w.expires_at >= :now) AS slots,
       (SELECT count(*) FROM task t
        WHERE t.ready_at IS NOT NULL AND t.ready_at <= :now AND t.queue = q.name) AS ready,
       (SELECT count(*) FROM queue d WHERE d.name = q.name) AS declared
FROM (SELECT 'default' AS name UNION SELECT name FROM queue
      UNION SELECT s.queue FROM worker_queue s JOIN worker w ON w.id = s.worker_id
            WHERE w.expires_at >= :now
      UNION SELECT queue FROM task WHERE ready_at IS NOT NULL AND ready_at <= :now) AS q
ORDER BY q.name;

-- name: ops_held_back
-- :n at most. Tasks ready to run in a limited pool or in a queue other than default: the
-- ones a full pool, a missing pool or a queue nobody serves may be holding back
-- (executor/pools.py says which, and why).
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts,
       t.updated_at, t.ready_at, t.pool, t.pool_slots, t.queue
FROM task t
WHERE t.ready_at IS NOT NULL AND t.ready_at <= :now
  AND (t.pool <> 'default' OR t.queue <> 'default')
ORDER BY t.ready_at, t.id
LIMIT :n;

-- name: ops_run_held_back
-- ops_held_back for one run (its page): every such ready task of it.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts,
       t.updated_at, t.ready_at, t.pool, t.pool_slots, t.queue
FROM task t
WHERE t.run_id = :run_id AND t.ready_at IS NOT NULL AND t.ready_at <= :now
  AND (t.pool <> 'default' OR t.queue <> 'default')
ORDER BY t.ready_at, t.id;

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
WHERE r.state IN ('RUNNING', 'PAUSED') AND NOT (t.map_index = -1 AND t.map_total IS NOT NULL)
GROUP BY t.state;

-- name: ops_waiting_summary
-- :now. Per waiting state: how many, since when the longest has waited, and (DEFERRED,
-- SENSING) the largest share of its own timeout any wait has used.
SELECT 'DEFERRED' AS state, count(*) AS n, min(wait_started_at) AS oldest,
       max((CAST(:now AS DOUBLE PRECISION) - wait_started_at) / NULLIF(wait_timeout_at - wait_started_at, 0)) AS timeout_ratio
FROM task WHERE state = 'DEFERRED'
UNION ALL
SELECT 'SENSING', count(*), min(wait_started_at),
       max((CAST(:now AS DOUBLE PRECISION) - wait_started_at) / NULLIF(wait_timeout_at - wait_started_at, 0))
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
-- :n at most. The longest waits first, with their trigger and the lease of its shard.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts,
       t.updated_at, t.wait_started_at, t.wait_timeout_at, t.next_method, t.soft_fail,
       g.id AS trigger_id, g.classpath, g.poke_hash, g.shard, g.description,
       s.owner AS lease_owner, s.expires_at AS lease_expires_at
FROM task t
LEFT JOIN trigger g ON g.id = t.trigger_id
LEFT JOIN shard_lease s ON s.shard = g.shard
WHERE t.state = 'DEFERRED'
ORDER BY t.wait_started_at, t.id
LIMIT :n;

-- name: ops_sensing
-- :n at most. Reschedule-mode sensors between checks; last_message is their last check.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts,
       t.updated_at, t.ready_at, t.wait_started_at, t.wait_timeout_at,
       (SELECT e.message FROM task_event e WHERE e.task_row = t.id AND e.kind = 'transition'
        ORDER BY e.id DESC LIMIT 1) AS last_message
FROM task t
WHERE t.ready_at IS NOT NULL AND t.state = 'SENSING'
ORDER BY t.wait_started_at, t.id
LIMIT :n;

-- name: ops_retrying
-- :n at most. Tasks waiting for their next attempt, the longest retry episode first.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.attempt, t.max_attempts,
       t.updated_at, t.ready_at,
       (SELECT min(e.ts) FROM task_event e
        WHERE e.task_row = t.id AND e.to_state = 'RETRYING') AS retrying_since,
       (SELECT e.message FROM task_event e WHERE e.task_row = t.id AND e.to_state = 'RETRYING'
        ORDER BY e.id DESC LIMIT 1) AS last_error
FROM task t
WHERE t.ready_at IS NOT NULL AND t.state = 'RETRYING'
ORDER BY retrying_since, t.id
LIMIT :n;

-- name: ops_shard_leases
SELECT shard, owner, expires_at FROM shard_lease ORDER BY shard;

-- name: ops_run_counts
-- Instances by state of the newest :n runs (an expanded mapped task counts as its instances).
SELECT t.run_id, t.state, count(*) AS n FROM task t
WHERE t.run_id IN (SELECT run_id FROM dag_run ORDER BY created_at DESC LIMIT :n)
  AND NOT (t.map_index = -1 AND t.map_total IS NOT NULL)
GROUP BY t.run_id, t.state;

-- name: ops_run_edges
SELECT parent, child FROM edge WHERE run_id = :run_id ORDER BY parent, child;

-- name: ops_run_waits
-- What each DEFERRED task of one run waits for.
SELECT t.task_id, t.map_index, g.description, g.classpath
FROM task t JOIN trigger g ON g.id = t.trigger_id
WHERE t.run_id = :run_id AND t.state = 'DEFERRED';

-- name: ops_task_instances
-- At most :n: the instances of one mapped task, in index order.
SELECT id, map_index, state, attempt, updated_at FROM task
WHERE run_id = :run_id AND task_id = :task_id AND map_index >= 0
ORDER BY map_index
LIMIT :n;

-- name: ops_trigger
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, g.created_at, g.description,
       s.owner AS lease_owner, s.expires_at AS lease_expires_at
FROM trigger g LEFT JOIN shard_lease s ON s.shard = g.shard
WHERE g.id = :id;

-- name: ops_check_waiters
-- How many tasks wait on one check: :poke_hash, and its :shard (for the index).
SELECT count(*) AS n
FROM trigger g JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
WHERE g.shard = :shard AND g.poke_hash = :poke_hash;

-- ---------------------------------------------------------------- the DAG catalogue
-- executor/catalogue.py through executor/store/catalogue.py; tables in 002_dag_catalogue.sql.

-- name: catalogue_files
SELECT path, mtime FROM dag_file ORDER BY path;

-- name: upsert_dag_file
-- :mtime NULL makes the next scan parse the file again (a dag_id another file holds, an
-- unknown pool, a provisional parse by a command run by hand).
INSERT INTO dag_file (path, mtime, parsed_at, parse_error)
VALUES (:path, :mtime, :now, :parse_error)
ON CONFLICT (path) DO UPDATE SET mtime = :mtime, parsed_at = :now, parse_error = :parse_error;

-- name: dag_owner
SELECT file FROM dag WHERE dag_id = :dag_id;

-- name: upsert_dag
-- What a file declares; `paused` is the operator's and is kept.
-- schedule: its JSON (executor.schedules.Schedule.to_json), catchup and dates included.
INSERT INTO dag (dag_id, file, schedule, timezone, next_logical_date, file_mtime, parsed_at,
                 parse_error, max_active_runs, start_when, shape)
VALUES (:dag_id, :file, :schedule, :timezone, :next_logical_date, :file_mtime, :now, NULL,
        :max_active_runs, :start_when, :shape)
ON CONFLICT (dag_id) DO UPDATE
SET file = :file, schedule = :schedule, timezone = :timezone,
    next_logical_date = :next_logical_date, file_mtime = :file_mtime, parsed_at = :now,
    parse_error = NULL, max_active_runs = :max_active_runs, start_when = :start_when,
    shape = :shape;

-- name: undeclared_dags
SELECT dag_id FROM dag WHERE file = :file AND NOT (dag_id = ANY(:keep));

-- name: dags_of_file
SELECT dag_id FROM dag WHERE file = :file;

-- name: dags_of_files
SELECT dag_id FROM dag WHERE file = ANY(:paths);

-- name: delete_undeclared_dags
-- DAGs a file declared before and no longer does.
DELETE FROM dag WHERE file = :file AND NOT (dag_id = ANY(:keep));

-- name: mark_file_dags_broken
-- A file that parsed before is broken now: its DAGs stay (paused kept), with its error.
UPDATE dag SET parse_error = :parse_error, parsed_at = :now WHERE file = :file;

-- name: delete_dags_of_files
DELETE FROM dag WHERE file = ANY(:paths);

-- name: delete_dag_files
DELETE FROM dag_file WHERE path = ANY(:paths);

-- name: catalogue_dags
-- Every DAG, with the state of its newest run (NULL: it never ran).
-- armed_*: the schedule's wait the triggerer holds; waiting_for: the start condition's.
SELECT d.dag_id, d.file, d.schedule, d.timezone, d.paused, d.next_logical_date,
       d.parse_error, d.file_mtime, d.parsed_at, d.start_error, d.asset_schedule,
       (SELECT r.state FROM dag_run r WHERE r.dag_id = d.dag_id
        ORDER BY r.created_at DESC LIMIT 1) AS last_run_state,
       (SELECT s.logical_date FROM start_wait s
        WHERE s.dag_id = d.dag_id AND s.kind = 'schedule') AS armed_logical_date,
       (SELECT s.interval_end FROM start_wait s
        WHERE s.dag_id = d.dag_id AND s.kind = 'schedule') AS armed_due,
       (SELECT g.description FROM start_wait s JOIN trigger g ON g.id = s.trigger_id
        WHERE s.dag_id = d.dag_id AND s.kind = 'condition') AS waiting_for
FROM dag d ORDER BY d.dag_id;

-- name: catalogue_broken_files
SELECT path, mtime, parsed_at, parse_error FROM dag_file
WHERE parse_error IS NOT NULL ORDER BY path;

-- name: set_dag_paused
UPDATE dag SET paused = :paused WHERE dag_id = :dag_id;

-- name: catalogue_dag
-- One DAG as the catalogue holds it (`slotless trigger`: its file, paused, parse error).
SELECT dag_id, file, paused, parse_error, file_mtime FROM dag WHERE dag_id = :dag_id;

-- ---------------------------------------------------------------- dags page
-- The web page's DAG list (slotless/web) through executor/store/inspecting.py.

-- name: dags_page_runs
-- The :n latest runs of each catalogued DAG by logical time (its grid of squares, as in
-- Airflow: a backfill of old dates lands on the left), oldest first; created_at, then
-- run_id, break a tie between runs of one time. Per DAG, a walk of its index (027) that
-- stops after :n runs: a window over every run cost 275 ms at 100,000 runs, this ~5 ms.
-- (A run without a logical time, written by a process of the release before 020 during
-- an upgrade, sorts first on SQLite and last on PostgreSQL, as NULLs do.)
SELECT r.dag_id, r.run_id, r.logical_date, r.state, r.created_at, r.logical_time,
       r.timezone, r.data_interval_end
FROM dag d
JOIN dag_run r ON r.run_id IN (
    SELECT x.run_id FROM dag_run x
    WHERE x.dag_id = d.dag_id
    ORDER BY x.logical_time DESC, x.created_at DESC, x.run_id DESC
    LIMIT :n)
ORDER BY r.dag_id, r.logical_time, r.created_at, r.run_id;

-- ---------------------------------------------------------------- start waits
-- executor/store/starts.py: schedules and start conditions held by the triggerer.

-- name: dag_start_specs
SELECT dag_id, file, schedule, timezone, max_active_runs, shape, start_when, paused,
       parse_error
FROM dag WHERE dag_id = ANY(:dag_ids);

-- name: last_interval_end
-- Where a (re-)armed schedule goes on from: the end of the DAG's latest data interval.
SELECT max(data_interval_end) AS last_end FROM dag_run
WHERE dag_id = :dag_id AND data_interval_end IS NOT NULL
HAVING max(data_interval_end) IS NOT NULL;

-- name: insert_start_wait
-- A concurrent arm of the same DAG (two processes scanning one folder) inserts nothing.
INSERT INTO start_wait (dag_id, kind, trigger_id, logical_date, interval_end, armed_at)
VALUES (:dag_id, :kind, :trigger_id, :logical_date, :interval_end, :now)
ON CONFLICT (dag_id, kind) DO NOTHING;

-- name: rearm_start_wait
UPDATE start_wait
SET trigger_id = :trigger_id, logical_date = :logical_date, interval_end = :interval_end,
    armed_at = :now
WHERE id = :id;

-- name: armed_start_waits
-- The start waits a fire is for, locked until commit (on SQLite the write transaction
-- holds the lock): a concurrent fire of the same event (a takeover) waits, then sees the
-- wait re-armed and does nothing.
SELECT id, dag_id, kind, trigger_id, logical_date, interval_end FROM start_wait
WHERE id = ANY(:ids) ORDER BY id
FOR UPDATE;

-- name: set_start_error
UPDATE dag SET start_error = :error, start_error_at = :now WHERE dag_id = :dag_id;

-- name: clear_start_errors
UPDATE dag SET start_error = NULL, start_error_at = NULL
WHERE dag_id = ANY(:dag_ids) AND start_error IS NOT NULL;

-- name: copy_trigger
-- The same wait again, not checked before :not_before (a start condition that failed).
INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, description, not_before)
SELECT classpath, kwargs, poke_hash, shard, :now, description, :not_before
FROM trigger WHERE id = :id
RETURNING id;

-- name: delete_start_waits_by_id
DELETE FROM start_wait WHERE id = ANY(:ids);

-- name: delete_start_waits
DELETE FROM start_wait WHERE dag_id = :dag_id;

-- name: delete_start_waits_of
DELETE FROM start_wait WHERE dag_id = ANY(:dag_ids);

-- name: start_waits
-- For people: every armed start wait, with what its trigger row says it waits for.
SELECT s.dag_id, s.kind, s.logical_date, s.interval_end, s.armed_at, g.description,
       g.not_before
FROM start_wait s JOIN trigger g ON g.id = s.trigger_id
ORDER BY s.dag_id, s.kind;

-- ---------------------------------------------------------------- events
-- Pushed, never polled: executor/store/events.py. Each event settles the waits it matches.

-- name: event_shapes
-- The field sets each of these names is waited on with.
SELECT name, fields FROM event_shape WHERE name = ANY(:names);

-- name: insert_event_shape
INSERT INTO event_shape (name, fields, first_at) VALUES (:name, :fields, :now)
ON CONFLICT (name, fields) DO NOTHING;

-- name: event_key_triggers
-- The trigger rows of the waits on these keys (an index lookup per key). Two statements,
-- not a join: PostgreSQL, with statistics behind a growing table, hashed every DEFERRED
-- task to join them (the cost of an event then grew with the waits held).
SELECT id, event_key FROM trigger WHERE event_key = ANY(:keys);

-- name: deferred_on_triggers
-- The tasks still waiting on these trigger rows (task_deferred: one lookup per row).
SELECT id, trigger_id FROM task WHERE trigger_id = ANY(:ids) AND state = 'DEFERRED';

-- name: events_since
-- A wait that begins: the events of its name in its lookback window, newest first, but
-- none that already woke this task (a task that waits again waits for a newer event).
-- :since NULL: since the task's run started (the default lookback).
SELECT e.id, e.payload, e.sent_at, e.source FROM event e
WHERE e.name = :name
  AND e.sent_at >= COALESCE(:since, (SELECT r.created_at FROM task t
                                     JOIN dag_run r ON r.run_id = t.run_id
                                     WHERE t.id = :task_row))
  AND NOT EXISTS (SELECT 1 FROM event_woke w WHERE w.event_id = e.id AND w.task_row = :task_row)
ORDER BY e.sent_at DESC, e.id DESC;

-- name: insert_event_woke
INSERT INTO event_woke (event_id, task_row, woke_at) VALUES (:event_id, :task_row, :now)
ON CONFLICT (event_id, task_row) DO NOTHING;

-- name: delete_triggers
DELETE FROM trigger WHERE id = ANY(:ids);

-- name: recent_events
SELECT id, name, payload, sent_at, source FROM event
ORDER BY sent_at DESC, id DESC LIMIT :limit;

-- name: recent_events_named
SELECT id, name, payload, sent_at, source FROM event WHERE name = :name
ORDER BY sent_at DESC, id DESC LIMIT :limit;

-- name: event_by_id
SELECT id, name, payload, sent_at, source FROM event WHERE id = :id;

-- name: event_name_known
-- An event of this name is stored, or a wait was ever registered on it.
SELECT 1 AS known FROM event WHERE name = :name
UNION ALL
SELECT 1 FROM event_shape WHERE name = :name
LIMIT 1;

-- name: event_wakes
SELECT w.event_id, w.woke_at, t.id AS task_row, t.run_id, t.task_id, t.map_index, t.state
FROM event_woke w JOIN task t ON t.id = w.task_row
WHERE w.event_id = ANY(:ids)
ORDER BY w.event_id, t.id;

-- name: prune_events
-- One batch of events past their retention, oldest first (the caller repeats).
DELETE FROM event WHERE id IN (
    SELECT id FROM event WHERE sent_at < :before ORDER BY sent_at LIMIT :n
)
RETURNING id;

-- name: prune_event_wakes
DELETE FROM event_woke WHERE event_id = ANY(:ids);

-- ---------------------------------------------------------------- people in the loop
-- executor/store/people.py: a person's wait is a DEFERRED task on a trigger row whose
-- event_key is 'person:<task row>' (never loaded by a triggerer, never matched by an event).

-- name: needs_you
-- The partial index of persons' waits (013_people.sql), then each one's task: INDEXED BY
-- and CROSS JOIN say so to SQLite (not every event wait); PostgreSQL drops both.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.wait_started_at, t.wait_timeout_at,
       g.classpath, g.kwargs, r.dag_id, r.logical_date
FROM trigger g INDEXED BY trigger_person CROSS JOIN task t ON t.trigger_id = g.id
JOIN dag_run r ON r.run_id = t.run_id
WHERE g.event_key LIKE 'person:%' AND t.state = 'DEFERRED'
ORDER BY t.wait_started_at, t.id
LIMIT :limit;

-- name: needs_you_count
SELECT count(*) AS n FROM trigger g INDEXED BY trigger_person CROSS JOIN task t
ON t.trigger_id = g.id
WHERE g.event_key LIKE 'person:%' AND t.state = 'DEFERRED';

-- name: person_task
-- A task and the person's request it waits on, or, once answered, who could answer it.
SELECT t.id, t.run_id, t.task_id, t.map_index, t.state, t.trigger_id, t.output,
       g.classpath, g.kwargs, g.event_key, p.respondents AS answered_respondents
FROM task t LEFT JOIN trigger g ON g.id = t.trigger_id
LEFT JOIN person_respondents p ON p.task_row = t.id AND p.trigger_id = t.trigger_id
WHERE t.run_id = :run_id AND t.task_id = :task_id AND t.map_index = :map_index;

-- name: keep_respondents
-- Who could answer a request, kept in the answer's transaction (018_person_respondents.sql).
INSERT INTO person_respondents (task_row, trigger_id, respondents)
VALUES (:task_row, :trigger_id, :respondents)
ON CONFLICT (task_row) DO UPDATE
SET trigger_id = excluded.trigger_id, respondents = excluded.respondents;

-- name: person_waits_of
SELECT t.id, t.run_id, t.task_id, t.trigger_id, g.classpath, g.kwargs
FROM task t JOIN trigger g ON g.id = t.trigger_id
WHERE t.id = ANY(:ids) AND g.event_key LIKE 'person:%';

-- (needs_you and needs_you_count: in each backend's queries.sql, to read the partial index.)

-- name: task_children
SELECT child FROM edge WHERE run_id = :run_id AND parent = :parent ORDER BY child;

-- ---------------------------------------------------------------- backfill
-- executor/store/backfills.py creates the runs; `slotless backfill` follows them.

-- name: runs_states
-- The state of each of these runs: a backfill's progress, polled.
SELECT run_id, state FROM dag_run WHERE run_id = ANY(:run_ids);

-- ---------------------------------------------------------------- run control
-- executor/store/control.py: clear, mark, cancel, retry (states through the cas).

-- name: run_edges
SELECT parent, child FROM edge WHERE run_id = :run_id;

-- name: instances_of
SELECT id, task_id, map_index, state, trigger_id FROM task
WHERE run_id = :run_id AND task_id = ANY(:task_ids) AND map_index >= 0;

-- name: delete_instance_events
DELETE FROM task_event WHERE task_row IN (
    SELECT id FROM task WHERE run_id = :run_id AND task_id = ANY(:task_ids) AND map_index >= 0);

-- name: delete_instances
DELETE FROM task WHERE run_id = :run_id AND task_id = ANY(:task_ids) AND map_index >= 0;

-- name: reset_cleared
-- Cleared rows (just moved to PENDING by the cas): fresh attempts, nothing carried over.
UPDATE task
SET attempt = 1, output = NULL, event = NULL, next_method = NULL, next_kwargs = NULL,
    trigger_id = NULL, soft_fail = 0, wait_started_at = NULL, wait_timeout_at = NULL,
    owner = NULL, heartbeat_at = NULL, started_at = NULL, ended_at = NULL, map_total = NULL,
    item = NULL, ready_at = NULL, updated_at = :now
WHERE id = ANY(:ids) AND state = 'PENDING';

-- name: recount_parents
-- A waiting task's readiness counters, counted again from its parents' states (after a
-- clear changed some of them); its trigger rule then decides again.
UPDATE task
SET n_parents = (SELECT count(*) FROM edge e WHERE e.run_id = task.run_id AND e.child = task.task_id),
    n_done = (SELECT count(*) FROM edge e JOIN task p
              ON p.run_id = e.run_id AND p.task_id = e.parent AND p.map_index = -1
              WHERE e.run_id = task.run_id AND e.child = task.task_id
                AND p.state IN ('SUCCESS', 'FAILED', 'UPSTREAM_FAILED', 'SKIPPED')),
    n_success = (SELECT count(*) FROM edge e JOIN task p
                 ON p.run_id = e.run_id AND p.task_id = e.parent AND p.map_index = -1
                 WHERE e.run_id = task.run_id AND e.child = task.task_id AND p.state = 'SUCCESS'),
    n_failed = (SELECT count(*) FROM edge e JOIN task p
                ON p.run_id = e.run_id AND p.task_id = e.parent AND p.map_index = -1
                WHERE e.run_id = task.run_id AND e.child = task.task_id AND p.state = 'FAILED'),
    n_upstream_failed = (SELECT count(*) FROM edge e JOIN task p
                         ON p.run_id = e.run_id AND p.task_id = e.parent AND p.map_index = -1
                         WHERE e.run_id = task.run_id AND e.child = task.task_id
                           AND p.state = 'UPSTREAM_FAILED'),
    n_skipped = (SELECT count(*) FROM edge e JOIN task p
                 ON p.run_id = e.run_id AND p.task_id = e.parent AND p.map_index = -1
                 WHERE e.run_id = task.run_id AND e.child = task.task_id AND p.state = 'SKIPPED'),
    ready_at = NULL
WHERE id = ANY(:ids) AND state = 'PENDING';

-- name: recount_run
UPDATE dag_run
SET tasks_unfinished = (SELECT count(*) FROM task t
                        WHERE t.run_id = dag_run.run_id AND t.map_index = -1
                          AND t.state NOT IN ('SUCCESS', 'FAILED', 'UPSTREAM_FAILED', 'SKIPPED')),
    -- is_leaf 1 (a leaf) or 2 (only quiet teardowns after it) decides (executor/rules.py)
    leaves_failed = (SELECT count(*) FROM task t
                     WHERE t.run_id = dag_run.run_id AND t.map_index = -1 AND t.is_leaf IN (1, 2)
                       AND t.state IN ('FAILED', 'UPSTREAM_FAILED'))
WHERE run_id = :run_id;

-- name: unfinished_tasks_locked
-- A run's unfinished tasks, locked until commit (cancel, fail_fast; on SQLite the write
-- transaction holds the lock): a worker claiming one concurrently is waited for and its
-- row read as it committed it (RUNNING: stopped), and no worker claims one after (SKIP
-- LOCKED passes it by, then finds it ended).
SELECT id, task_id, map_index, expand_from, state, trigger_id FROM task
WHERE run_id = :run_id AND state NOT IN ('SUCCESS', 'FAILED', 'UPSTREAM_FAILED', 'SKIPPED')
ORDER BY map_index DESC, id
FOR UPDATE;

-- name: tasks_by_id
SELECT * FROM task WHERE id = ANY(:ids) ORDER BY id;

-- name: release_waits
-- Waits an operator ended (cancel, clear): the triggerers drop them (005_wait_release.sql).
INSERT INTO wait_release (task_row, trigger_id, released_at) VALUES (:task_row, :trigger_id, :now);

-- name: released_waits
SELECT id, task_row, trigger_id FROM wait_release WHERE id > :after ORDER BY id;

-- name: max_release_id
SELECT COALESCE(max(id), 0) AS id FROM wait_release;

-- name: prune_releases
DELETE FROM wait_release WHERE released_at < :before;

-- ---------------------------------------------------------------- run policy
-- Deadlines, dagrun_timeout, a sensor's expected_by (executor/runwaits.py, armed by
-- the state machine; fired by executor/store/deadlines.py in the triggerer's outbox) and
-- the failure policy (fail_fast, pause: executor/statemachine.py; resume: control.py).

-- name: insert_run_wait
-- A wait that exists already is kept (a queued run's deadline when it starts).
INSERT INTO run_wait (run_id, kind, task_id, trigger_id, due_at, armed_at)
VALUES (:run_id, :kind, :task_id, :trigger_id, :due_at, :now)
ON CONFLICT (run_id, kind, task_id) DO NOTHING;

-- name: armed_run_waits
-- The run waits a fire is for, locked until commit (on SQLite the write transaction holds
-- the lock): a concurrent fire of the same event (a takeover) waits, then finds them
-- deleted and does nothing.
SELECT id, run_id, kind, task_id, trigger_id, due_at FROM run_wait
WHERE id = ANY(:ids::bigint[]) ORDER BY id
FOR UPDATE;

-- name: delete_run_waits_of
DELETE FROM run_wait WHERE run_id = ANY(:run_ids);

-- name: run_waits_of
-- For people: a run's armed waits, the soonest first.
SELECT id, kind, task_id, due_at, trigger_id FROM run_wait WHERE run_id = :run_id
ORDER BY due_at, id;

-- name: ops_runs_needing_attention
-- :n at most. Runs a person must look at: PAUSED by their failure policy, or still going
-- past their deadline; the oldest first.
SELECT run_id, dag_id, logical_date, state, state_reason, created_at, deadline_at,
       deadline_missed_at
FROM dag_run
WHERE state = 'PAUSED'
   OR (deadline_missed_at IS NOT NULL AND state IN ('RUNNING', 'QUEUED'))
ORDER BY created_at, run_id
LIMIT :n;

-- name: delete_run_waits_by_id
DELETE FROM run_wait WHERE id = ANY(:ids);

-- name: run_policy
-- A run's state and failure policy, when a task of it failed (a mapped instance).
SELECT run_id, dag_id, state, on_task_failure FROM dag_run WHERE run_id = :run_id;

-- name: hold_ready
-- A run paused: its tasks that were about to start (claimable, not claimed) wait again;
-- resuming decides them anew. RETRYING, SENSING and DEFERRED rows keep their time.
UPDATE task SET ready_at = NULL
WHERE run_id = :run_id AND state = 'PENDING' AND ready_at IS NOT NULL;

-- name: stopped_tasks
-- The tasks a run's stop (a cancel, a dagrun_timeout, fail_fast) ended that are still as it
-- left them: their last transition is the stop's, at the run's end and with its reason.
SELECT t.task_id FROM task t
JOIN task_event e ON e.task_row = t.id
WHERE t.run_id = :run_id AND t.map_index = -1 AND t.state IN ('SKIPPED', 'FAILED')
  AND e.id = (SELECT max(x.id) FROM task_event x WHERE x.task_row = t.id AND x.kind = 'transition')
  AND e.to_state = t.state AND e.ts = :ended_at AND e.message = :reason;

-- name: held_tasks
-- What a resumed run decides anew: its PENDING rows that are not claimable.
SELECT * FROM task WHERE run_id = :run_id AND state = 'PENDING' AND ready_at IS NULL
ORDER BY id;

-- name: set_run_reason
UPDATE dag_run SET state_reason = :reason WHERE run_id = :run_id;

-- name: set_deadline_missed
UPDATE dag_run SET deadline_missed_at = :now WHERE run_id = :run_id;

-- ---------------------------------------------------------------- run progress
-- `slotless run`'s live view (slotless/progress.py) through executor/store/inspecting.py,
-- a few times a second while the run goes: each statement reads one run's rows through the
-- (run_id, task_id, map_index) index, and the waits at most :n rows, whose events and
-- trigger are read after the limit (columns as ops_deferred / ops_sensing / ops_retrying).

-- name: progress_mapped
-- The run's mapped tasks: a template counts its ended instances in n_done (bump_template);
-- map_total is NULL until it expands.
SELECT task_id, state, expand_from, map_total, n_done, n_failed FROM task
WHERE run_id = :run_id AND map_index = -1 AND expand_from IS NOT NULL
ORDER BY id;

-- name: progress_waits
-- :n at most. The run's DEFERRED and SENSING tasks, the longest wait first, with what they
-- wait for: the trigger's description (DEFERRED), the last check (SENSING).
SELECT w.id, w.run_id, w.task_id, w.map_index, w.state, w.attempt, w.max_attempts,
       w.updated_at, w.ready_at, w.wait_started_at, w.wait_timeout_at, w.next_method,
       g.id AS trigger_id, g.classpath, g.poke_hash, g.shard, g.description,
       s.owner AS lease_owner, s.expires_at AS lease_expires_at,
       CASE WHEN w.state = 'SENSING' THEN
           (SELECT e.message FROM task_event e WHERE e.task_row = w.id AND e.kind = 'transition'
            ORDER BY e.id DESC LIMIT 1)
       END AS last_message
FROM (SELECT id, run_id, task_id, map_index, state, attempt, max_attempts, updated_at,
             ready_at, wait_started_at, wait_timeout_at, next_method, trigger_id
      FROM task
      WHERE run_id = :run_id AND state IN ('DEFERRED', 'SENSING')
      ORDER BY wait_started_at, id
      LIMIT :n) AS w
LEFT JOIN trigger g ON g.id = w.trigger_id
LEFT JOIN shard_lease s ON s.shard = g.shard
ORDER BY w.wait_started_at, w.id;

-- name: progress_retrying
-- :n at most. The run's RETRYING tasks, the first to have failed first, with their last
-- failure and since when they retry.
SELECT w.id, w.run_id, w.task_id, w.map_index, w.state, w.attempt, w.max_attempts,
       w.updated_at, w.ready_at,
       (SELECT min(e.ts) FROM task_event e
        WHERE e.task_row = w.id AND e.to_state = 'RETRYING') AS retrying_since,
       (SELECT e.message FROM task_event e WHERE e.task_row = w.id AND e.to_state = 'RETRYING'
        ORDER BY e.id DESC LIMIT 1) AS last_error
FROM (SELECT id, run_id, task_id, map_index, state, attempt, max_attempts, updated_at, ready_at
      FROM task
      WHERE run_id = :run_id AND state = 'RETRYING'
      ORDER BY updated_at, id
      LIMIT :n) AS w
ORDER BY w.updated_at, w.id;
