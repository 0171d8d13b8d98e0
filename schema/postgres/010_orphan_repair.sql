-- Orphan repair (triggerer/repair.py) looks for RUNNING rows whose owner is unknown (no
-- owner or no heartbeat): normally none but the templates of expanded mapped tasks, so
-- this index is small and the look cheap.
CREATE INDEX task_running_unowned ON task (id)
WHERE state = 'RUNNING' AND (owner IS NULL OR heartbeat_at IS NULL);
