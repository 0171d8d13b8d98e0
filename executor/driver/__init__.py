"""The database driver: one interface (:mod:`.db`), its SQLite and PostgreSQL backends,
migrations, liveness locks, and which failures of a write are worth retrying.

Below the state machine and the store's parts, which run their statements through it.
"""
