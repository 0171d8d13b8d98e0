-- The audit list (executor/store/audit.py): every write through the web page or the JSON
-- API under its token's name, refused ones too. Table: schema/<backend>/021_audit.sql.

-- name: audit_insert
INSERT INTO audit (ts, who, role, via, action, target, detail, outcome)
VALUES (:ts, :who, :role, :via, :action, :target, :detail, :outcome);

-- name: audit_since
-- Newest first: the page and the API show what happened last at the top.
SELECT id, ts, who, role, via, action, target, detail, outcome
FROM audit WHERE ts >= :since ORDER BY ts DESC, id DESC LIMIT :limit;
