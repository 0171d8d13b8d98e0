-- slotless schema v24 (PostgreSQL): the waits page. The last hour of each triggerer, for its
-- sidebar. A triggerer writes one row per sample period (triggerer/sampling.py, 30 s by
-- default) at its heartbeat, in the transaction that deletes every row older than an hour,
-- so the table holds at most 120 rows per triggerer, whatever the waits it holds.
CREATE TABLE triggerer_sample (
    triggerer    TEXT NOT NULL,
    at           DOUBLE PRECISION NOT NULL,
    checks_per_s DOUBLE PRECISION NOT NULL, -- checks settled per second since its last sample
    lag_p99_ms   DOUBLE PRECISION,      -- loop lag over the watchdog's last ~100 s
    lag_max_ms   DOUBLE PRECISION,
    waits        INTEGER NOT NULL,            -- waits held (subscriptions)
    checks       INTEGER NOT NULL,            -- distinct conditions held (poke hashes)
    shards       INTEGER NOT NULL             -- shards leased
);
CREATE INDEX triggerer_sample_by_time ON triggerer_sample (at);

-- The waits page lists the first waiters of the conditions it shows (waiters_of_checks):
-- found by poke hash, instead of reading every trigger row of their shards (at 100,000
-- waits, 50 conditions over 44 shards read 70,000 rows, 0.4 s). One entry per trigger row,
-- written when a task defers; nothing periodic reads or writes it.
CREATE INDEX trigger_by_poke_hash ON trigger (poke_hash);
