"""The DAG catalogue's rows: which files were parsed, what each declared, which DAGs are paused.

Mixed into :class:`executor.store.Store`. :mod:`executor.catalogue` decides what to parse
and parses it; this module only records the results (tables in ``002_dag_catalogue.sql``,
statements in the catalogue section of ``schema/common/queries.sql``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .db import Database, Row


class UnknownDag(LookupError):
    """A DAG id the catalogue does not hold."""


@dataclass(frozen=True, slots=True)
class DeclaredDag:
    """What a DAG file declares about one DAG, as the catalogue stores it."""

    dag_id: str
    schedule: str | None = None  # Schedule.text: a cron, a preset or an ISO 8601 duration
    timezone: str = "UTC"
    next_logical_date: str | None = None  # ISO 8601, UTC: as of the parse


class CatalogueOps:
    db: Database
    clock: Callable[[], float]

    async def catalogue_files(self) -> dict[str, float | None]:
        """Every file parsed so far -> its mtime as last parsed (None: parse it again)."""
        async with self.db.read() as tx:
            return {r["path"]: r["mtime"] for r in await tx.fetch("catalogue_files")}

    async def record_parse(
        self, path: str, mtime: float, dags: Sequence[DeclaredDag], error: str | None
    ) -> str | None:
        """Record one parse of ``path``: its DAGs, or its error. Returns the error stored.

        A file that fails keeps the DAGs it declared before (with the error on them), so a
        typo in a file does not forget that its DAG was paused. A dag_id that another file
        already declares is refused for this file, and the file is parsed again on the next
        scan (its mtime is stored as NULL): once the other file lets the id go, it is taken.
        """
        now = self.clock()
        async with self.db.write() as tx:
            if error is not None:
                await tx.execute(
                    "upsert_dag_file", path=path, mtime=mtime, now=now, parse_error=error
                )
                await tx.execute("mark_file_dags_broken", file=path, parse_error=error, now=now)
                return error
            taken: dict[str, str] = {}  # dag_id -> the file that holds it
            for dag in dags:
                owner = await tx.fetchone("dag_owner", dag_id=dag.dag_id)
                if owner is not None and owner["file"] != path:
                    taken[dag.dag_id] = owner["file"]
            if taken:
                error = "; ".join(f"DAG {d!r} is already defined in {f}" for d, f in taken.items())
            # The file row first: on PostgreSQL `dag.file` references it.
            await tx.execute(
                "upsert_dag_file",
                path=path,
                mtime=None if taken else mtime,
                now=now,
                parse_error=error,
            )
            kept = [dag for dag in dags if dag.dag_id not in taken]
            for dag in kept:
                await tx.execute(
                    "upsert_dag",
                    dag_id=dag.dag_id,
                    file=path,
                    schedule=dag.schedule,
                    timezone=dag.timezone,
                    next_logical_date=dag.next_logical_date,
                    file_mtime=mtime,
                    now=now,
                )
            await tx.execute("delete_undeclared_dags", file=path, keep=[d.dag_id for d in kept])
        return error

    async def forget_files(self, paths: Sequence[str]) -> None:
        """Drop files that left the folder, and the DAGs they declared."""
        if not paths:
            return
        async with self.db.write() as tx:
            await tx.execute("delete_dags_of_files", paths=list(paths))
            await tx.execute("delete_dag_files", paths=list(paths))

    async def catalogue_dags(self) -> list[Row]:
        """Every catalogued DAG, by dag_id, with ``last_run_state`` (None: never ran)."""
        async with self.db.read() as tx:
            return await tx.fetch("catalogue_dags")

    async def broken_files(self) -> list[Row]:
        """Files whose last parse failed, with their one-line error."""
        async with self.db.read() as tx:
            return await tx.fetch("catalogue_broken_files")

    async def set_paused(self, dag_id: str, paused: bool) -> None:
        async with self.db.write() as tx:
            if not await tx.execute("set_dag_paused", dag_id=dag_id, paused=int(paused)):
                raise UnknownDag(
                    f"no DAG {dag_id!r} in the catalogue (`slotless dags list --dags DIR` "
                    "parses a folder into it)"
                )

    async def catalogue_dag(self, dag_id: str) -> Row:
        """One catalogued DAG (file, paused, parse_error); :class:`UnknownDag` if none."""
        async with self.db.read() as tx:
            row = await tx.fetchone("catalogue_dag", dag_id=dag_id)
        if row is None:
            raise UnknownDag(
                f"no DAG {dag_id!r} in the catalogue (`--dags DIR` or $SLOTLESS_DAGS parses "
                "a folder into it)"
            )
        return row
