"""The DAG catalogue's rows: which files were parsed, what each declared, which DAGs are paused.

Mixed into :class:`executor.store.Store`. :mod:`executor.catalogue` decides what to parse
and parses it; this module only records the results (tables in ``002_dag_catalogue.sql``,
statements in the catalogue section of ``schema/common/queries.sql``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..driver.db import Row, Tx
from ..errors import DagError
from ..schedules import Schedule
from .assets import catalogue_assets, forget_asset_dags
from .part import Part
from .pools import check_known
from .runs import RunShape
from .starts import StartSpec, arm, disarm, start_row


class UnknownDag(LookupError):
    """A DAG id the catalogue does not hold."""


@dataclass(frozen=True, slots=True)
class DeclaredDag:
    """What a DAG file declares about one DAG, as the catalogue stores it."""

    dag_id: str
    schedule: str | None = None  # JSON: executor.schedules.Schedule.to_json()
    timezone: str = "UTC"  # the DAG's clock: its start condition's dates, its listing
    next_logical_date: str | None = None  # ISO 8601, UTC: as of the parse
    max_active_runs: int = 16
    start_when: str | None = None  # JSON [classpath, kwargs]: a start condition
    shape: str | None = None  # JSON: executor.store.runs.RunShape
    assets: str | None = None  # JSON: executor.assets.declared (condition, outlets, watchers)

    def starts(self) -> tuple[object, ...]:
        """What decides when it starts: a change re-arms its start waits."""
        return _starts(self.schedule, self.timezone, self.start_when)


class Catalogue(Part):
    """The DAG files, the DAGs they declare, and how each DAG's runs start."""

    async def catalogue_files(self) -> dict[str, float | None]:
        """Every file parsed so far -> its mtime as last parsed (None: parse it again)."""
        async with self.db.read() as tx:
            return {r["path"]: r["mtime"] for r in await tx.fetch("catalogue_files")}

    async def record_parse(
        self,
        path: str,
        mtime: float,
        dags: Sequence[DeclaredDag],
        error: str | None,
        *,
        settled: bool = True,
    ) -> str | None:
        """Record one parse of ``path``: its DAGs, or its error. Returns the error stored.

        ``settled=False``: a provisional parse (a command run by hand, in an environment
        that may not be the services'): recorded as any other, but with no mtime, so that
        the next scan parses the file again and a service's parse has the last word.

        A file that fails keeps the DAGs it declared before (with the error on them), so a
        typo in a file does not forget that its DAG was paused. A dag_id that another file
        already declares is refused for this file, and the file is parsed again on the next
        scan (its mtime is stored as NULL): once the other file lets the id go, it is taken.
        """
        now = self.clock()
        async with self.db.write() as tx:
            retry = not settled
            if error is None:
                # A pool or queue that does not exist (yet) breaks the file, naming
                # it; the file is parsed again on each scan (mtime NULL) until it exists.
                error = await _unknown_pools(tx, dags)
                retry = retry or error is not None
            if error is not None:
                await tx.execute(
                    "upsert_dag_file",
                    path=path,
                    mtime=None if retry else mtime,
                    now=now,
                    parse_error=error,
                )
                await tx.execute("mark_file_dags_broken", file=path, parse_error=error, now=now)
                # A broken file starts no run (a worker could not import it); fixed, it is
                # armed again from its last run, its catchup deciding about the ones missed.
                broken = await tx.fetch("dags_of_file", file=path)
                await disarm(tx, [r["dag_id"] for r in broken])
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
                mtime=None if taken or retry else mtime,
                now=now,
                parse_error=error,
            )
            kept = [dag for dag in dags if dag.dag_id not in taken]
            for dag in kept:
                before = await start_row(tx, dag.dag_id)
                await tx.execute(
                    "upsert_dag",
                    dag_id=dag.dag_id,
                    file=path,
                    schedule=dag.schedule,
                    timezone=dag.timezone,
                    next_logical_date=dag.next_logical_date,
                    file_mtime=mtime,
                    now=now,
                    max_active_runs=dag.max_active_runs,
                    start_when=dag.start_when,
                    shape=dag.shape,
                )
                rewatch = await catalogue_assets(tx, dag.dag_id, dag.assets, now)
                if (
                    before is None
                    or before["parse_error"]
                    or _row_starts(before) != dag.starts()
                    or rewatch  # its assets' watchers are start waits too
                ):
                    await arm(tx, dag.dag_id, now)
            gone = await tx.fetch("undeclared_dags", file=path, keep=[d.dag_id for d in kept])
            await disarm(tx, [r["dag_id"] for r in gone])
            await forget_asset_dags(tx, [r["dag_id"] for r in gone])
            await tx.execute("delete_undeclared_dags", file=path, keep=[d.dag_id for d in kept])
        return error

    async def forget_files(self, paths: Sequence[str]) -> None:
        """Drop files that left the folder, and the DAGs they declared."""
        if not paths:
            return
        async with self.db.write() as tx:
            gone = await tx.fetch("dags_of_files", paths=list(paths))
            await disarm(tx, [r["dag_id"] for r in gone])
            await forget_asset_dags(tx, [r["dag_id"] for r in gone])
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
        """Pause (no run starts; its start waits are dropped) or unpause (armed again: with
        ``catchup=False`` only the latest missed interval runs, never a flood)."""
        async with self.db.write() as tx:
            if not await tx.execute("set_dag_paused", dag_id=dag_id, paused=int(paused)):
                raise UnknownDag(
                    f"no DAG {dag_id!r} in the catalogue (`slotless dags list --dags DIR` "
                    "parses a folder into it)"
                )
            if paused:
                await disarm(tx, [dag_id])
            else:
                await arm(tx, dag_id, self.clock())

    async def start_waits(self) -> list[Row]:
        """Every armed schedule and start condition, with what it waits for."""
        async with self.db.read() as tx:
            return await tx.fetch("start_waits")

    async def catalogue_dag(self, dag_id: str) -> Row:
        """One catalogued DAG (file, paused, parse_error); :class:`UnknownDag` if none."""
        async with self.db.read() as tx:
            row = await tx.fetchone("catalogue_dag", dag_id=dag_id)
        if row is None:
            raise _unknown(dag_id)
        return row

    async def start_spec(self, dag_id: str) -> StartSpec:
        """What the catalogue holds about starting ``dag_id`` (schedule, shape, file, limits);
        :class:`UnknownDag` if none."""
        async with self.db.read() as tx:
            row = await start_row(tx, dag_id)
        if row is None:
            raise _unknown(dag_id)
        return StartSpec.of(row)


async def _unknown_pools(tx: Tx, dags: Sequence[DeclaredDag]) -> str | None:
    problems = []
    for dag in dags:
        if dag.shape is None:
            continue
        try:
            tasks = RunShape.from_json(dag.dag_id, dag.shape).tasks
            await check_known(tx, tasks, f"DAG {dag.dag_id!r}")
        except DagError as exc:
            problems.append(str(exc))
    return "; ".join(problems) or None


def _unknown(dag_id: str) -> UnknownDag:
    return UnknownDag(
        f"no DAG {dag_id!r} in the catalogue (`--dags DIR` or $SLOTLESS_DAGS parses a folder "
        "into it)"
    )


def _row_starts(row: Row) -> tuple[object, ...]:
    """:meth:`DeclaredDag.starts` of a stored row."""
    return _starts(row["schedule"], row["timezone"], row["start_when"])


def _starts(schedule: str | None, timezone: str, start_when: str | None) -> tuple[object, ...]:
    # Schedules compared as values: JSON written by another version (or by the migration
    # from separate columns) may differ in spacing from ours and still be the same schedule.
    return (None if schedule is None else Schedule.from_json(schedule), timezone, start_when)
