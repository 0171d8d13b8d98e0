-- The waits page (slotless/web/waits_page.py, executor/store/waitlist.py) and the
-- triggerers' last hour (triggerer/sampling.py, schema 024_waits_page.sql).

-- name: waits_by_check
-- Every distinct condition tasks wait on now, one row per poke hash: how many wait, since
-- when, the nearest timeout and the largest share of its own timeout any of them used.
-- :order 'waiters' (most waiters first) or 'oldest'; :classpath, :dag_id '' for any. The
-- windows count what the LIMIT leaves out (conditions and waits matching the filters) in
-- the same pass. Event and person waits (event_key set) are settled by their senders, never
-- checked by a triggerer: not here. A DAG filter is a semi-join on the runs' dag_id index.
SELECT g.poke_hash, min(g.shard) AS shard, min(g.classpath) AS classpath,
       count(*) AS waiters, min(t.wait_started_at) AS since, min(t.id) AS first_task,
       min(t.wait_timeout_at) AS timeout_at,
       max((CAST(:now AS DOUBLE PRECISION) - t.wait_started_at)
           / NULLIF(t.wait_timeout_at - t.wait_started_at, 0)) AS worst_share,
       count(*) OVER () AS conditions, sum(count(*)) OVER () AS total_waits
FROM task t JOIN trigger g ON g.id = t.trigger_id
WHERE t.state = 'DEFERRED' AND g.event_key IS NULL
  AND (:classpath = '' OR g.classpath = :classpath)
  AND (:dag_id = '' OR t.run_id IN (SELECT run_id FROM dag_run WHERE dag_id = :dag_id))
GROUP BY g.poke_hash
ORDER BY CASE WHEN :order = 'oldest' THEN min(t.wait_started_at) ELSE -count(*) END,
         g.poke_hash
LIMIT :n;

-- name: waiters_of_checks
-- The first :first waiters (by task row) of each condition in :hashes (by the index on
-- poke_hash; :shards narrows it to the conditions' own shards), and the one whose timeout comes first (by_timeout = 1), under the same
-- filters as waits_by_check. Reads only the waits of the conditions shown.
SELECT poke_hash, id, run_id, task_id, map_index, dag_id, wait_started_at, wait_timeout_at,
       classpath, kwargs, description, by_id, by_timeout
FROM (
    SELECT g.poke_hash, t.id, t.run_id, t.task_id, t.map_index, r.dag_id,
           t.wait_started_at, t.wait_timeout_at, g.classpath, g.kwargs, g.description,
           row_number() OVER (PARTITION BY g.poke_hash ORDER BY t.id) AS by_id,
           row_number() OVER (PARTITION BY g.poke_hash
                              ORDER BY t.wait_timeout_at IS NULL, t.wait_timeout_at, t.id)
               AS by_timeout
    FROM trigger g
    JOIN task t ON t.trigger_id = g.id AND t.state = 'DEFERRED'
    JOIN dag_run r ON r.run_id = t.run_id
    WHERE g.shard = ANY(:shards) AND g.poke_hash = ANY(:hashes) AND g.event_key IS NULL
      AND (:classpath = '' OR g.classpath = :classpath)
      AND (:dag_id = '' OR r.dag_id = :dag_id)
) w
WHERE by_id <= :first OR by_timeout = 1
ORDER BY poke_hash, by_id;

-- name: last_check_logs
-- The newest sampled check line (triggerer/settling.py) of each task row in :rows.
SELECT e.task_row, e.ts, e.message FROM task_event e
WHERE e.id IN (SELECT max(x.id) FROM task_event x
               WHERE x.task_row = ANY(:rows) AND x.kind = 'check'
               GROUP BY x.task_row);

-- name: shard_owners
SELECT shard, owner, expires_at FROM shard_lease WHERE owner IS NOT NULL ORDER BY shard;

-- name: triggerer_sample_add
INSERT INTO triggerer_sample (triggerer, at, checks_per_s, lag_p99_ms, lag_max_ms, waits,
                              checks, shards)
VALUES (:triggerer, :at, :checks_per_s, :lag_p99_ms, :lag_max_ms, :waits, :checks, :shards);

-- name: triggerer_samples_prune
-- In the transaction of each sample: what is older than the hour kept (its index on `at`).
DELETE FROM triggerer_sample WHERE at < :before;

-- name: triggerer_samples
SELECT triggerer, at, checks_per_s, lag_p99_ms, lag_max_ms, waits, checks, shards
FROM triggerer_sample WHERE at >= :since ORDER BY triggerer, at;
