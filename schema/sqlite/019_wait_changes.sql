-- slotless schema v19 (SQLite): a log of the waits that began or stopped waiting, per
-- shard, so that a triggerer's minutely reconcile and orphan repair read what changed
-- since they last looked instead of every wait (schema/postgres/019_wait_changes.sql says
-- what a row means; here each case is a trigger of its own, SQLite's triggers being
-- statements, not functions). 64 is triggers.base.SHARDS.
CREATE TABLE wait_change (
    id          INTEGER PRIMARY KEY,
    shard       INTEGER NOT NULL,
    task_row    INTEGER,
    trigger_id  INTEGER
);
CREATE INDEX wait_change_by_shard ON wait_change (shard);

CREATE TRIGGER task_wait_left
AFTER UPDATE OF state, trigger_id ON task
WHEN OLD.state = 'DEFERRED'
     AND (NEW.state IS NOT OLD.state OR NEW.trigger_id IS NOT OLD.trigger_id)
BEGIN
    INSERT INTO wait_change (shard, trigger_id)
    VALUES (COALESCE((SELECT shard FROM trigger WHERE id = OLD.trigger_id), OLD.id % 64),
            OLD.trigger_id);
END;

CREATE TRIGGER task_wait_began
AFTER UPDATE OF state, trigger_id ON task
WHEN NEW.state = 'DEFERRED'
     AND (NEW.state IS NOT OLD.state OR NEW.trigger_id IS NOT OLD.trigger_id)
BEGIN
    INSERT INTO wait_change (shard, task_row, trigger_id)
    VALUES (COALESCE((SELECT shard FROM trigger WHERE id = NEW.trigger_id), NEW.id % 64),
            NEW.id, NEW.trigger_id);
END;

CREATE TRIGGER task_wait_inserted
AFTER INSERT ON task
WHEN NEW.state = 'DEFERRED'
BEGIN
    INSERT INTO wait_change (shard, task_row, trigger_id)
    VALUES (COALESCE((SELECT shard FROM trigger WHERE id = NEW.trigger_id), NEW.id % 64),
            NEW.id, NEW.trigger_id);
END;

CREATE TRIGGER task_wait_deleted
AFTER DELETE ON task
WHEN OLD.state = 'DEFERRED'
BEGIN
    INSERT INTO wait_change (shard, trigger_id)
    VALUES (COALESCE((SELECT shard FROM trigger WHERE id = OLD.trigger_id), OLD.id % 64),
            OLD.trigger_id);
END;

CREATE TRIGGER trigger_wait_deleted
AFTER DELETE ON trigger
BEGIN
    INSERT INTO wait_change (shard, task_row, trigger_id)
    SELECT OLD.shard, t.id, OLD.id FROM task t
    WHERE t.trigger_id = OLD.id AND t.state = 'DEFERRED';
    INSERT INTO wait_change (shard, trigger_id)
    SELECT OLD.shard, OLD.id
    WHERE EXISTS (SELECT 1 FROM start_wait WHERE trigger_id = OLD.id)
       OR EXISTS (SELECT 1 FROM run_wait WHERE trigger_id = OLD.id);
END;

CREATE TRIGGER start_wait_armed
AFTER INSERT ON start_wait
BEGIN
    INSERT INTO wait_change (shard, trigger_id) SELECT shard, id FROM trigger WHERE id = NEW.trigger_id;
END;

CREATE TRIGGER start_wait_rearmed
AFTER UPDATE OF trigger_id ON start_wait
BEGIN
    INSERT INTO wait_change (shard, trigger_id) SELECT shard, id FROM trigger WHERE id = OLD.trigger_id;
    INSERT INTO wait_change (shard, trigger_id) SELECT shard, id FROM trigger WHERE id = NEW.trigger_id;
END;

CREATE TRIGGER start_wait_dropped
AFTER DELETE ON start_wait
BEGIN
    INSERT INTO wait_change (shard, trigger_id) SELECT shard, id FROM trigger WHERE id = OLD.trigger_id;
END;

CREATE TRIGGER run_wait_armed
AFTER INSERT ON run_wait
BEGIN
    INSERT INTO wait_change (shard, trigger_id) SELECT shard, id FROM trigger WHERE id = NEW.trigger_id;
END;

CREATE TRIGGER run_wait_rearmed
AFTER UPDATE OF trigger_id ON run_wait
BEGIN
    INSERT INTO wait_change (shard, trigger_id) SELECT shard, id FROM trigger WHERE id = OLD.trigger_id;
    INSERT INTO wait_change (shard, trigger_id) SELECT shard, id FROM trigger WHERE id = NEW.trigger_id;
END;

CREATE TRIGGER run_wait_dropped
AFTER DELETE ON run_wait
BEGIN
    INSERT INTO wait_change (shard, trigger_id) SELECT shard, id FROM trigger WHERE id = OLD.trigger_id;
END;
