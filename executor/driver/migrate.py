"""The one migration runner: bring a database's schema up to the newest this slotless has.

Every backend runs it the same way, in one write transaction: take the backend's
``migrate_lock`` (so that processes starting together take turns), read the version,
refuse a database newer than this code, apply each missing ``schema/<backend>/NNN_*.sql``
and record it in ``schema_version``. A failed migration rolls back whole.
"""

from __future__ import annotations

import schema

from .db import Database, SchemaTooNew, Tx


async def migrate(db: Database, folder: str) -> None:
    """Apply the migrations of ``schema/<folder>/`` that ``db`` has not seen yet."""
    known = schema.migrations(folder)
    latest = known[-1].version
    if await _current(db) == latest:
        # Nothing to write: a read-only database (a standby, a read-only file) opens for
        # the commands that only read, and every start skips the migration lock.
        return

    async def body(tx: Tx) -> None:
        await tx.execute("migrate_lock")
        await tx.execute("schema_version_create")
        row = await tx.fetchone("schema_version_current")
        current = int(row["version"]) if row is not None else 0
        if current > latest:
            where = await tx.fetchone("database_name")
            raise SchemaTooNew(
                f"database {where['name'] if where else db.url} has schema version {current}, "
                f"newer than the {latest} this slotless knows; upgrade slotless to use it"
            )
        for mig in known:
            if mig.version > current:
                await tx.script(mig.sql)
                await tx.execute(
                    "schema_version_insert", version=mig.version, name=mig.name, now=db.clock()
                )

    # One call into SQLite's driver thread for the whole transaction: a new database's
    # hundred-odd DDL statements were as many round trips, a third of `slotless run`'s
    # start on a fresh file.
    await db.transact(body)


async def _current(db: Database) -> int | None:
    """The schema's version, read without a write transaction; None if it cannot be read
    so (no table yet): the write transaction then finds out, and says what is wrong."""
    try:
        async with db.read() as tx:
            row = await tx.fetchone("schema_version_current")
    except Exception:
        return None
    return int(row["version"]) if row is not None else None
