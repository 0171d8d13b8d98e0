-- slotless schema v17 (PostgreSQL): who could answer a person's request, kept once it is
-- answered (executor/store/people.py).
--
-- A request's respondents live in its trigger row, which goes when the wait ends; without
-- them a stranger asking after the answer could only be refused as "already answered",
-- which tells them the request's fate. Written in the answer's transaction, one row per
-- task row, replaced when the task answers another request; read only while the task
-- still names that request's trigger row (a reused row id never inherits it). JSON list
-- of names; empty: anyone may answer.

CREATE TABLE person_respondents (
    task_row          BIGINT PRIMARY KEY,
    trigger_id        BIGINT NOT NULL,
    respondents       TEXT NOT NULL
);
