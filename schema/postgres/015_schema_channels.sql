-- slotless schema v14 (PostgreSQL): NOTIFY channels of this schema only.
--
-- LISTEN and NOTIFY act on the whole database: two installations in two schemas of one
-- database (search_path) woke each other's workers and triggerers with every write. Each
-- channel name now ends with a tag of the schema its table lives in, the first 12 hex
-- digits of md5(schema), which the store computes the same way for its LISTEN
-- (executor/store/postgres.py, schema_tag). The wake-ups stay what they were otherwise.

CREATE OR REPLACE FUNCTION slotless_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0] || '_' || left(md5(TG_TABLE_SCHEMA), 12), '');
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION slotless_run_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('slotless_runs_' || left(md5(TG_TABLE_SCHEMA), 12),
                      NEW.dag_id || '/' || NEW.logical_date);
    RETURN NULL;
END
$$;
