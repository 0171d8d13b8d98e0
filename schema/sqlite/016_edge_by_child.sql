-- slotless schema v15 (SQLite): edges found by their child.
--
-- A claimed task reads its parents' outputs in the transaction that claims it
-- (parent_outputs: the edges whose child it is). The edge table's key starts with
-- (run_id, parent), so without this index that lookup read every edge of the run: 40 us
-- per step of a chain of 1,000 tasks, and more the bigger the run. PostgreSQL has had this
-- index since its first schema.

CREATE INDEX IF NOT EXISTS edge_by_child ON edge (run_id, child);
