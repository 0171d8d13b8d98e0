-- slotless schema v12 (PostgreSQL): people in the loop (executor/store/people.py).
--
-- A person's wait is a trigger row keyed 'person:<task row>' (never loaded by a triggerer,
-- never matched by an event). The "Needs you" list and its count in the page's header read
-- these rows on every page: a partial index keeps that to the requests waiting, however
-- many other waits are held.

CREATE INDEX trigger_person ON trigger (id) WHERE event_key LIKE 'person:%';
