-- The statements whose SQLite spelling differs from PostgreSQL's; the rest are in
-- schema/common/queries.sql. Parameters are named; a JSON array stands for a list.

-- part: log_moved_begin
-- cas (schema/common/queries.sql) on SQLite: no data-modifying CTE here, so the statement
-- returns each moved row's message and its caller writes the task_event rows.

-- part: log_moved_end
, 0 AS logged

-- part: log_settled
-- log_after (schema/common/logs.sql): one writer at a time, so ids commit in order: every
-- row read is settled.
1 = 1

-- name: bump_children
-- Parents of one run ended, all the same way: count them in each child's counters, one
-- update of a child however many of its parents are in :parents (each flag is 0/1 by how
-- they ended). "GROUP BY +child": found by the key (run_id, parent), not by edge_by_child,
-- which would give the groups in order by reading every edge of the run.
UPDATE task
SET n_done = n_done + c.n, n_success = n_success + c.n * :success,
    n_failed = n_failed + c.n * :failed,
    n_upstream_failed = n_upstream_failed + c.n * :upstream_failed,
    n_skipped = n_skipped + c.n * :skipped
FROM (SELECT child, count(*) AS n FROM edge
      WHERE run_id = :run_id AND parent = ANY(:parents) GROUP BY +child) AS c
WHERE task.run_id = :run_id AND task.map_index = -1 AND task.task_id = c.child
RETURNING *;

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
-- tasks', the start waits' and the run waits', each named by (wait_kind, wait_id)
-- (triggerer/waitref.py). In no order: the loader needs none, and sorting the union would
-- be one more pass over every row of a full reload. Keep the columns of the two backends'
-- load statements alike (triggerer/loading.py reads them by name).
SELECT g.id AS trigger_id, g.classpath, g.kwargs, g.poke_hash, g.shard,
       'task' AS wait_kind, t.id AS wait_id, t.next_method, g.not_before
FROM trigger g JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
WHERE g.shard = ANY(:shards) AND g.id > :after
  AND g.event_key IS NULL  -- an event wait is settled by its event, never checked
UNION ALL
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, 'start', s.id, NULL, g.not_before
FROM trigger g JOIN start_wait s ON s.trigger_id = g.id
WHERE g.shard = ANY(:shards) AND g.id > :after
UNION ALL
-- A run wait: a deadline, a dagrun_timeout, an expected_by (executor/store/runwaits.py).
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, 'run', w.id, NULL, g.not_before
FROM trigger g JOIN run_wait w ON w.trigger_id = g.id
WHERE g.shard = ANY(:shards) AND g.id > :after;

-- name: load_trigger_range
-- load_triggers for a window of trigger ids, (:after, :upto], when a load reads many shards
-- (the first load of a triggerer, a takeover): the rows come in id order from task's
-- index on trigger_id, then trigger by rowid. Read through the index on shard instead,
-- each row is a lookup in a different page, shard after shard: 3-4x the time at a million
-- rows. The unary plus keeps the planner off that index (benchmarks/capacity.py).
SELECT g.id AS trigger_id, g.classpath, g.kwargs, g.poke_hash, g.shard,
       'task' AS wait_kind, t.id AS wait_id, t.next_method, g.not_before
FROM trigger g JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
WHERE +g.shard = ANY(:shards) AND g.id > :after AND g.id <= :upto
  AND g.event_key IS NULL
UNION ALL
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, 'start', s.id, NULL, g.not_before
FROM trigger g JOIN start_wait s ON s.trigger_id = g.id
WHERE +g.shard = ANY(:shards) AND g.id > :after AND g.id <= :upto
UNION ALL
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, 'run', w.id, NULL, g.not_before
FROM trigger g JOIN run_wait w ON w.trigger_id = g.id
WHERE +g.shard = ANY(:shards) AND g.id > :after AND g.id <= :upto;


-- name: lock_dags_runs
-- Nothing to take: a write transaction (BEGIN IMMEDIATE) already holds the file's lock.
SELECT count(*) AS locked FROM dag WHERE dag_id = ANY(:dag_ids);

-- name: migrate_lock
-- Nothing to take: the migration's write transaction (BEGIN IMMEDIATE) holds the file's lock.
SELECT 1;

-- name: database_name
SELECT file AS name FROM pragma_database_list WHERE name = 'main';

-- Liveness: locks that die with a process (executor/driver/liveness.py) -------

-- name: liveness_lock
-- Never run: on SQLite the lock is a file's (fcntl), held by the process, not by SQL.
SELECT 0 AS held WHERE :space IS NULL AND :key IS NULL;

-- name: liveness_holders
-- Never run: on SQLite a process tries the other's lock file instead.
SELECT NULL AS uptime, NULL AS keys WHERE :space IS NULL;

-- ---------------------------------------------------------------- events

-- name: lock_event_names
-- An event's writer. Nothing to take: the write transaction (BEGIN IMMEDIATE) holds the
-- file's lock, so an event and a wait registering are never concurrent on SQLite.
SELECT count(*) AS locked FROM event_shape WHERE name = ANY(:names);

-- name: lock_event_names_shared
-- A wait registering (see lock_event_names).
SELECT count(*) AS locked FROM event_shape WHERE name = ANY(:names);

-- name: insert_event_trigger
-- An event wait's trigger row: never loaded by a triggerer (load_triggers skips it).
INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, description, not_before,
                     event_key)
VALUES (:classpath, :kwargs, :poke_hash, :shard, :now, :description, NULL, :event_key)
RETURNING id;

-- name: insert_triggers
-- A batch of waits' trigger rows in one statement (the worker's deferrals of one exchange:
-- :rows is a JSON list of [classpath, kwargs, poke_hash, shard, description]), in order:
-- ids are handed out in that order, so the caller sorts the ids it gets back.
INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, description, not_before)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), :now, json_extract(value, '$[4]'), NULL
FROM json_each(:rows) WHERE true ORDER BY key
RETURNING id;

-- name: store_events
-- A batch of events in one statement, in order (:events is a JSON list of [name, payload
-- text] pairs): ids are handed out in that order, so the caller sorts the ids it gets back.
INSERT INTO event (name, payload, sent_at, source)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), :now, :source
FROM json_each(:events) ORDER BY key
RETURNING id;

-- name: insert_check_logs
-- A triggerer's sampled check lines in one statement: :lines is a JSON array of [task row,
-- line], in order. Inserted by SQLite from the JSON, not row by row from Python: a cycle of a
-- million first checks writes a million lines, and this way the driver's thread does it
-- without holding the interpreter (triggerer/store.py).
INSERT INTO task_event (task_row, ts, kind, message)
SELECT json_extract(value, '$[0]'), :now, 'check', json_extract(value, '$[1]')
FROM json_each(:lines) ORDER BY key;
