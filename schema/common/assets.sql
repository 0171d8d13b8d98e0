-- Assets (executor/store/assets.py, migration 025): an event is inserted, queued for each
-- DAG that consumes its URI (asset_consumer_by_uri), and each of those DAGs' queue is read
-- by its primary key under the DAG's lock (lock_dags_runs), all in the event's transaction.

-- name: ensure_asset
-- An event's asset: known from now on (an event sent for a URI no DAG names yet).
INSERT INTO asset (uri, name, created_at) VALUES (:uri, NULL, :now)
ON CONFLICT (uri) DO NOTHING;

-- name: name_asset
-- An asset a DAG declares, with its name (the last parse that names it wins).
INSERT INTO asset (uri, name, created_at) VALUES (:uri, :name, :now)
ON CONFLICT (uri) DO UPDATE SET name = COALESCE(excluded.name, asset.name);

-- name: insert_asset_event
-- A replay (the same dedup_key) inserts nothing and returns no row.
INSERT INTO asset_event (uri, ts, source, run_id, task_id, extra, dedup_key)
VALUES (:uri, :now, :source, :run_id, :task_id, :extra, :dedup_key)
ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: asset_event_by_dedup
SELECT id FROM asset_event WHERE dedup_key = :dedup_key;

-- name: queue_asset_event
-- The event, queued for each DAG scheduled on its URI.
INSERT INTO asset_queue (dag_id, event_id, uri)
SELECT c.dag_id, :event_id, :uri FROM asset_consumer c WHERE c.uri = :uri
RETURNING dag_id;

-- name: asset_consumer_dags
SELECT dag_id, file, timezone, max_active_runs, shape, paused, parse_error, asset_schedule
FROM dag WHERE dag_id = ANY(:dag_ids) AND asset_schedule IS NOT NULL;

-- name: asset_queued
-- What a consumer has not consumed yet (read under its lock), oldest first.
SELECT q.dag_id, e.id, e.uri, e.ts, e.source, e.run_id, e.task_id, e.extra
FROM asset_queue q JOIN asset_event e ON e.id = q.event_id
WHERE q.dag_id = ANY(:dag_ids)
ORDER BY q.dag_id, e.id;

-- name: consume_asset_queue
DELETE FROM asset_queue WHERE dag_id = :dag_id AND event_id = ANY(:ids);

-- name: set_dag_assets
UPDATE dag SET asset_schedule = :asset_schedule, asset_watchers = :asset_watchers
WHERE dag_id = :dag_id;

-- name: dag_asset_watchers
SELECT asset_watchers FROM dag WHERE dag_id = :dag_id;

-- name: dag_assets_before
-- What the catalogue held of a DAG's assets before this parse (nothing: skip the writes).
SELECT asset_schedule, asset_watchers,
       EXISTS (SELECT 1 FROM asset_producer p WHERE p.dag_id = :dag_id) AS produces
FROM dag WHERE dag_id = :dag_id;

-- name: delete_asset_links
DELETE FROM asset_consumer WHERE dag_id = ANY(:dag_ids);

-- name: delete_asset_producers
DELETE FROM asset_producer WHERE dag_id = ANY(:dag_ids);

-- name: delete_asset_queues
DELETE FROM asset_queue WHERE dag_id = ANY(:dag_ids);

-- name: insert_asset_consumer
INSERT INTO asset_consumer (dag_id, uri) VALUES (:dag_id, :uri) ON CONFLICT DO NOTHING;

-- name: insert_asset_producer
INSERT INTO asset_producer (dag_id, task_id, uri) VALUES (:dag_id, :task_id, :uri)
ON CONFLICT DO NOTHING;

-- name: assets_listed
-- Every asset with its newest event's time (by the index on (uri, id), not a scan of its
-- events) and how many it has (a count over that index).
SELECT a.uri, a.name, a.created_at,
       (SELECT count(*) FROM asset_event e WHERE e.uri = a.uri) AS events,
       (SELECT e.ts FROM asset_event e WHERE e.uri = a.uri ORDER BY e.id DESC LIMIT 1)
           AS last_ts
FROM asset a ORDER BY a.uri;

-- name: asset_last_events
-- The newest :n events of each asset named: :n index entries per asset, however many
-- events it has had.
SELECT e.id, e.uri, e.ts, e.source, e.run_id, e.task_id, e.extra
FROM asset a JOIN asset_event e ON e.id IN (
    SELECT x.id FROM asset_event x WHERE x.uri = a.uri ORDER BY x.id DESC LIMIT :n
)
WHERE a.uri = ANY(:uris)
ORDER BY e.uri, e.id DESC;

-- name: asset_links
-- Who produces and who consumes each asset: the lineage.
SELECT 'producer' AS role, dag_id, task_id, uri FROM asset_producer
UNION ALL
SELECT 'consumer' AS role, dag_id, NULL AS task_id, uri FROM asset_consumer
ORDER BY uri, role, dag_id;

-- name: trigger_classpath
-- A watcher's trigger row: its class, for its poke interval when it is armed again.
SELECT classpath, kwargs FROM trigger WHERE id = :id;
