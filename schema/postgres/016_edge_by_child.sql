-- slotless schema v15 (PostgreSQL): nothing to change.
--
-- On SQLite this version adds edge_by_child, the index by which a claimed task finds its
-- parents; PostgreSQL has had it since its first schema (001_init.sql). It keeps the
-- version number in step and changes nothing.
SELECT 1;
