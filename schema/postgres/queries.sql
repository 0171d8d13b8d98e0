-- The statements whose PostgreSQL spelling differs from SQLite's; the rest are in
-- schema/common/queries.sql. Parameters are named; lists arrive as arrays.
--
-- Plans that must not depend on statistics. Tables are new, or their statistics lag a
-- burst (100,000 sensors deferring at midnight), exactly when load peaks. Two spellings
-- keep the planner on the path whose cost is the size of the answer:
-- * `(state || '') = ...` next to `id = ANY(...)`: a row is looked up by its key, never
--   found by scanning a partial index over every DEFERRED row (O(waits) per statement);
-- * `e.run_id || ''` in bump_children: children are reached from the edges, never by
--   scanning every task of the run (O(tasks) per batch of finished parents).

-- part: log_moved_begin
-- cas (schema/common/queries.sql) on PostgreSQL also writes each moved row's task_event
-- (`logged`): one round trip per transition, not two.
WITH moved AS (

-- part: log_moved_end
), logged AS (
    INSERT INTO task_event (task_row, ts, kind, from_state, to_state, attempt, message)
    SELECT id, :now, 'transition', :expected, :new, attempt, message FROM moved
)
SELECT *, TRUE AS logged FROM moved

-- part: log_settled
-- log_after (schema/common/logs.sql): only rows whose transaction is older than every
-- transaction still running (age() compares 32-bit xids across wraparound; a frozen row's
-- age is the largest). Those are all committed, and any row still to commit is newer.
age(task_event.xmin) > age((pg_snapshot_xmin(pg_current_snapshot())::text::bigint % 4294967296)::text::xid)

-- name: bump_children
-- Parents of one run ended, all the same way: count them in each child's counters, one
-- update of a child however many of its parents are in :parents (a fan-in of 10,000
-- sensors fired in one batch bumps its child once: each update of a row in a transaction
-- leaves a version the next one walks past). Each flag is 0/1 by how they ended.
WITH c AS (
    SELECT e.run_id || '' AS run_id, e.child, count(*)::integer AS n
    FROM edge e
    WHERE e.run_id = :run_id AND e.parent = ANY(:parents::text[])
    GROUP BY e.run_id, e.child
)
UPDATE task t
SET n_done = t.n_done + c.n, n_success = t.n_success + c.n * :success::integer,
    n_failed = t.n_failed + c.n * :failed::integer,
    n_upstream_failed = t.n_upstream_failed + c.n * :upstream_failed::integer,
    n_skipped = t.n_skipped + c.n * :skipped::integer
FROM c
WHERE t.run_id = c.run_id AND t.task_id = c.child AND t.map_index = -1
RETURNING t.*;

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
-- tasks', the start waits' and the run waits', each named by (wait_kind, wait_id)
-- (triggerer/waitref.py). In no order: the loader needs none, and sorting the union would
-- be one more pass over every row of a full reload. Keep the columns of the two backends'
-- load statements alike (triggerer/loading.py reads them by name).
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
SELECT g.id AS trigger_id, g.classpath, g.kwargs, g.poke_hash, g.shard,
       'task' AS wait_kind, t.id AS wait_id, t.next_method, g.not_before
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
WHERE g.event_key IS NULL  -- an event wait is settled by its event, never checked
UNION ALL
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, 'start', s.id, NULL, g.not_before
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN start_wait s ON s.trigger_id = g.id
UNION ALL
-- A run wait: a deadline, a dagrun_timeout, an expected_by (executor/store/runwaits.py).
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, 'run', r.id, NULL, g.not_before
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN run_wait r ON r.trigger_id = g.id;

-- name: load_trigger_range
-- load_triggers for a window of trigger ids, (:after, :upto], when a load reads many shards
-- (see the SQLite twin). Rows of the window are marked `loaded` as load_triggers marks
-- them; one committed late below the window is not, and the next incremental load returns it.
-- The SELECT after `wanted` repeats load_triggers' own (keep the two alike): one statement
-- with an optional window would OR its conditions, and an OR here made a scan of every
-- trigger (see load_triggers).
WITH marked AS (
    UPDATE trigger SET loaded = TRUE
    WHERE NOT loaded AND shard = ANY(:shards::integer[])
      AND id > :after::bigint AND id <= :upto::bigint
), wanted AS (
    SELECT id FROM trigger
    WHERE shard = ANY(:shards::integer[]) AND id > :after::bigint AND id <= :upto::bigint
)
SELECT g.id AS trigger_id, g.classpath, g.kwargs, g.poke_hash, g.shard,
       'task' AS wait_kind, t.id AS wait_id, t.next_method, g.not_before
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
WHERE g.event_key IS NULL
UNION ALL
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, 'start', s.id, NULL, g.not_before
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN start_wait s ON s.trigger_id = g.id
UNION ALL
SELECT g.id, g.classpath, g.kwargs, g.poke_hash, g.shard, 'run', r.id, NULL, g.not_before
FROM wanted w
JOIN trigger g ON g.id = w.id
JOIN run_wait r ON r.trigger_id = g.id;


-- name: lock_dags_runs
-- Serializes the creation and starting of these DAGs' runs until commit, so that two
-- creators (or a creator and a run ending) never both see room under max_active_runs.
-- Taken in dag_id order (the sorted subquery), so two batches cannot deadlock.
SELECT pg_advisory_xact_lock(hashtext('slotless.dag_run:' || d)) IS NULL AS locked
FROM (SELECT d FROM unnest(:dag_ids::text[]) AS d ORDER BY d) AS sorted;

-- name: migrate_lock
-- One migrator at a time per schema; the others wait here, then find the work done.
SELECT pg_advisory_xact_lock(hashtext('slotless.migrate:' || current_schema()));

-- name: database_name
SELECT current_database() || '.' || current_schema() AS name;

-- Liveness: locks that die with a process (executor/driver/liveness.py) -------

-- name: liveness_lock
-- A session lock, on a connection kept for the process's life: the server drops it when
-- that connection ends (the process died, or its host's kernel closed the socket).
SELECT pg_try_advisory_lock(:space, :key) AS held;

-- name: liveness_holders
-- Every liveness lock held now, in this database: one query answers for every process;
-- and how long the server has been up (just restarted: every lock is being taken again).
-- Two-integer advisory locks show their integers as classid and objid, objsubid 2.
SELECT extract(epoch FROM clock_timestamp() - pg_postmaster_start_time())::float8 AS uptime,
       ARRAY(SELECT objid::bigint FROM pg_locks
             WHERE locktype = 'advisory' AND objsubid = 2 AND granted
               AND classid = :space::bigint::oid
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       ) AS keys;

-- ---------------------------------------------------------------- events

-- name: lock_event_names
-- An event's writer, until commit: exclusive per event name, so that a wait registering on
-- the name (lock_event_names_shared) either committed before the event looks for waits,
-- or waits for the event's commit and then finds it stored. Waits do not block each other.
-- Taken in name order (the sorted subquery), so two batches cannot deadlock.
SELECT pg_advisory_xact_lock(hashtext('slotless.event:' || n)) IS NULL AS locked
FROM (SELECT n FROM unnest(:names::text[]) AS n ORDER BY n) AS sorted;

-- name: lock_event_names_shared
-- A wait registering on these names, until commit (see lock_event_names).
SELECT pg_advisory_xact_lock_shared(hashtext('slotless.event:' || n)) IS NULL AS locked
FROM (SELECT n FROM unnest(:names::text[]) AS n ORDER BY n) AS sorted;

-- name: insert_triggers
-- A batch of waits' trigger rows in one statement (the worker's deferrals of one exchange:
-- :rows is a JSON list of [classpath, kwargs, poke_hash, shard, description]), in order:
-- ids are handed out in that order, so the caller sorts the ids it gets back. The INSERT
-- wakes the triggerers once (NOTIFY slotless_triggers, per statement).
INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, description, not_before)
SELECT r ->> 0, r ->> 1, r ->> 2, (r ->> 3)::integer, :now::float8, r ->> 4, NULL
FROM json_array_elements(:rows::json) WITH ORDINALITY AS x(r, n) ORDER BY n
RETURNING id;

-- name: insert_event_trigger
-- An event wait's trigger row: never loaded by a triggerer (loaded from the start, and
-- load_triggers skips it), so its INSERT wakes them for nothing only.
INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, description, not_before,
                     event_key, loaded)
VALUES (:classpath, :kwargs, :poke_hash, :shard, :now, :description, NULL, :event_key, TRUE)
RETURNING id;

-- name: store_events
-- A batch of events in one statement, in order (:events is a JSON list of [name, payload
-- text] pairs): ids are handed out in that order, so the caller sorts the ids it gets back.
INSERT INTO event (name, payload, sent_at, source)
SELECT e ->> 0, e ->> 1, :now::double precision, :source::text
FROM jsonb_array_elements(:events::jsonb) WITH ORDINALITY AS t(e, n) ORDER BY n
RETURNING id;

-- name: insert_check_logs
-- A triggerer's sampled check lines in one statement: :lines is a JSON array of [task row,
-- line], in order (one parameter instead of a row each: see the SQLite twin).
INSERT INTO task_event (task_row, ts, kind, message)
SELECT (e ->> 0)::bigint, :now::double precision, 'check', e ->> 1
FROM jsonb_array_elements(:lines::text::jsonb) WITH ORDINALITY AS t(e, n) ORDER BY n;
