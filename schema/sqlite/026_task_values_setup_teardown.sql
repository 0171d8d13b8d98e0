-- slotless schema v26 (SQLite): named values between tasks, and setup/teardown tasks.
--
-- A task's named values (ctx.push(key, value), read downstream with ctx.pull): one row per
-- key of a task row (a mapped task's instance has its own), its value as compact JSON.
-- Written in the transaction that records the attempt's SUCCESS (executor/store/recording.py),
-- so a failed attempt leaves none; deleted with its task when it is cleared
-- (executor/store/control.py). Read by run and task id through task's unique index, then
-- by this key: nothing scans the table.
CREATE TABLE task_value (
    task_row  INTEGER NOT NULL,                -- task.id
    key       TEXT NOT NULL,
    value     TEXT NOT NULL,               -- JSON, at most 64 KiB (executor/context.py)
    PRIMARY KEY (task_row, key)
);

-- A task's part in a setup/teardown pair: 'setup', 'teardown' or NULL. Read only when a
-- teardown's parents have all ended (which of them were its setups: executor/rules.py) and
-- by a clear (a cleared task brings back its setups and their teardowns). Rows from before
-- read NULL: plain tasks. Whether a task's failure fails its run is task.is_leaf, a small
-- enum since this version (executor/rules.py, LEAF_*).
ALTER TABLE task ADD COLUMN role TEXT;
