-- slotless schema v8 (PostgreSQL): a run's creation and each change of its state are
-- announced on `slotless_runs` with the payload 'dag_id/logical_date', so that waits on
-- another DAG's run (triggers/external.py) are woken at once instead of polled. DAG ids
-- hold no '/' (letters, digits, _ - .). Sent at COMMIT, identical ones of one transaction
-- folded into one.
CREATE FUNCTION slotless_run_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('slotless_runs', NEW.dag_id || '/' || NEW.logical_date);
    RETURN NULL;
END
$$;

CREATE TRIGGER dag_run_created_notify
    AFTER INSERT ON dag_run
    FOR EACH ROW EXECUTE FUNCTION slotless_run_notify();

-- The WHEN clause is checked without calling the function: updates of a run's counters
-- (every task that ends) pay nothing.
CREATE TRIGGER dag_run_state_notify
    AFTER UPDATE OF state ON dag_run
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION slotless_run_notify();
