"""Idle waits: what a triggerer costs the database and the CPU while nothing happens.

    python -m benchmarks.idle                      # PostgreSQL 0 and 100,000; SQLite 0,
                                                   # 100,000 and 1,000,000 event waits
    python -m benchmarks.idle --pg-sizes 0 --sqlite-sizes 0,100000 --repeat 1

For each backend and size, a fresh database gets that many event waits (a DEFERRED task on
a trigger row with an event key, as ``EventTrigger`` writes them: the database holds them,
the triggerer never checks them; approvals are the same rows), written in bulk. One
Triggerer runs in this process with its default periods, alone on its 64 shards. Once its
first load, its first (full) repair and the reconcile after them are done (that one
compares every shard once: the bulk write's change log names them all) and, on
PostgreSQL, the schema's tables vacuumed and analyzed, as autovacuum would have within a
minute (see ``vacuum``), two windows are measured:

* base (``--window`` s): the reconcile and the cleanup off; what every minute costs anyway
  (lease renewals, liveness, incremental loads, the timeout sweep);
* reconcile (``--window`` s): the reconcile and the cleanup every ``--period`` s instead of
  every 60 s, so that a window holds several of them; their cost is this window's less the
  base rate over it, divided by the reconciles counted (each full load of the loader).

Per minute = base rate x 60 + one reconcile and one cleanup (their default period is a
minute): a shrunk period only lets a minute's reconcile be measured in less wall time; it
is scaled back to one a minute, never counted at its own rate.

Measured, per window:

* ``db_rows_read``: PostgreSQL's row reads of the benchmark's schema: ``seq_tup_read +
  idx_tup_fetch`` of ``pg_stat_user_tables`` and ``idx_tup_read`` of
  ``pg_stat_user_indexes``, summed over its tables and indexes (the per-table
  share of ``pg_stat_database``'s tup_returned + tup_fetched, without the other sessions of
  a shared server). Backends report their counts at most once a second, so each window
  opens and closes with ``pg_stat_force_next_flush()`` on every connection of the
  triggerer's pool. SQLite keeps no row counts: there, ``db_rows_read_per_min`` is null and
  the work is ``db_vm_steps_per_min``, the SQLite VM instructions run on the connection
  (a progress handler called every 1,000: a read of one row is tens of them);
* ``db_statements``: the store's statements, counted in the driver (each fetch, execute of
  a named statement; transaction control not counted), on both backends: PostgreSQL's
  pg_stat_statements is not loaded on the server this was written for;
* ``triggerer_cpu_pct``: this process's CPU time (user + system) over the window: the
  triggerer is all that runs in it.

The target: with 100,000 waits, rows read per idle minute at most 2x the no-wait baseline
(PostgreSQL; on SQLite the VM instructions are held to the same). Each configuration runs
``--repeat`` times (a fresh database each); the JSON keeps every run and the median.

Writes benchmarks/results/idle.json and idle.png.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from . import calibration, common

NAME = "idle"
TARGET_RATIO = 2.0
LABEL = {"postgresql": "PG", "sqlite": "SQLite"}
KEYS = ("db_rows_read_per_min", "db_vm_steps_per_min", "db_statements_per_min", "triggerer_cpu_pct")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.idle", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--pg-sizes", default="0,100000", help="event waits on PostgreSQL ('' skips)")
    ap.add_argument("--sqlite-sizes", default="0,100000,1000000", help="event waits on SQLite")
    ap.add_argument("--window", type=float, default=12.0, help="seconds per measured window")
    ap.add_argument("--period", type=float, default=2.0, help="reconcile period in its window")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", help="where SQLite files go (a temporary folder otherwise)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--results", type=Path, default=common.RESULTS)
    return ap.parse_args(argv)


def sizes(text: str) -> list[int]:
    return [int(s.replace("_", "")) for s in text.split(",") if s.strip()]


# -- the waits -------------------------------------------------------------------------------


async def write_event_waits(store: Any, n: int) -> None:
    """``n`` event waits: a DEFERRED task on a trigger row with an event key, each its own."""
    from triggers.base import SHARDS
    from triggers.events import EventTrigger

    cp = EventTrigger.classpath()
    chunk = 100_000  # rows per transaction: a million in one holds SQLite's lock for long
    async with store.db.write() as tx:
        await tx.script(
            "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at, "
            f"tasks_unfinished) VALUES ('idle', 'idle', '2026-01-01', 'RUNNING', 0, {n})"
        )
    for low in range(0, n, chunk):
        high = min(n, low + chunk)
        async with store.db.write() as tx:
            await tx.script(
                "INSERT INTO trigger (classpath, kwargs, poke_hash, shard, created_at, "
                f"event_key) WITH RECURSIVE k(i) AS (SELECT {low + 1} UNION ALL SELECT i + 1 "
                f"FROM k WHERE i < {high}) SELECT '{cp}', "
                "'{\"name\": \"order-' || i || '\"}', 'e' || i, "
                f"i % {SHARDS}, 0, 'ev' || i FROM k"
            )
            await tx.script(
                "INSERT INTO task (run_id, task_id, state, trigger_rule, updated_at, "
                "trigger_id, wait_started_at, wait_timeout_at) SELECT 'idle', 'w' || g.id, "
                "'DEFERRED', 'all_success', 0, g.id, 0, 4000000000 FROM trigger g "
                f"WHERE g.id > {low} AND g.id <= {high}"
            )


# -- instruments -----------------------------------------------------------------------------


class Statements:
    """The store's statements, counted where the driver runs them."""

    def __init__(self) -> None:
        self.n = 0

    def install(self) -> None:
        from executor.driver import postgres, sqlite

        for cls in (sqlite.SqliteTx, sqlite._ThreadTx, postgres.PostgresTx):
            for method in ("fetch", "execute", "executemany"):
                if method in vars(cls):
                    setattr(cls, method, self._counting(getattr(cls, method)))
            if cls is postgres.PostgresTx:  # SQLite's fetchone is its fetch
                cls.fetchone = self._counting(cls.fetchone)  # type: ignore[method-assign]

    def _counting(self, real: Any) -> Any:
        async def call(tx: Any, *args: Any, **params: Any) -> Any:
            self.n += 1
            return await real(tx, *args, **params)

        return call


class Reads:
    """Rows read (PostgreSQL) or VM instructions (SQLite) on the triggerer's store."""

    def __init__(self, store: Any, schema: str | None, dsn: str | None) -> None:
        self.store = store
        self.schema = schema
        self.dsn = dsn
        self.vm_thousands = [0]

    async def install(self) -> None:
        if self.schema is not None:
            return
        counter = self.vm_thousands

        def tick() -> int:
            counter[0] += 1
            return 0

        conn = self.store.db._conn
        await conn._execute(lambda: conn._conn.set_progress_handler(tick, 1000))

    async def read(self) -> dict[str, float]:
        if self.schema is None:
            return {"vm_steps": self.vm_thousands[0] * 1000.0}
        import asyncpg

        # Every pool connection reports its counts now, not within the next second or ten.
        pool = self.store.db._pool
        conns = [await pool.acquire() for _ in range(pool.get_max_size())]
        try:
            for c in conns:
                await c.execute("SELECT pg_stat_force_next_flush()")
        finally:
            for c in conns:
                await pool.release(c)
        conn = await asyncpg.connect(self.dsn)
        try:
            row = await conn.fetchrow(
                "SELECT (SELECT COALESCE(sum(seq_tup_read + COALESCE(idx_tup_fetch, 0)), 0) "
                "FROM pg_stat_user_tables WHERE schemaname = $1) + (SELECT "
                "COALESCE(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
                "WHERE schemaname = $1) AS n",
                self.schema,
            )
        finally:
            await conn.close()
        return {"rows": float(row["n"])}


# -- one run ---------------------------------------------------------------------------------


async def one_run(url: str, waits: int, args: argparse.Namespace, schema: str | None) -> dict:
    from executor.store import open_store
    from triggerer.config import TriggererConfig
    from triggerer.service import Triggerer
    from triggers.base import SHARDS

    store = await open_store(url)
    try:
        t0 = time.perf_counter()
        await write_event_waits(store, waits)
        written_s = time.perf_counter() - t0
        statements = STATEMENTS
        reads = Reads(store, schema, args.dsn if schema else None)
        await reads.install()
        config = TriggererConfig()
        trig = Triggerer(store.views, config=config)
        reconciles = [0]
        real_load = trig.loader.load

        async def load(shards: Any, *, full: bool) -> None:
            await real_load(shards, full=full)
            if full:
                reconciles[0] += 1

        trig.loader.load = load  # type: ignore[method-assign]
        repairs = [0]
        real_repair = trig.repair.run

        async def repair(shards: Any, *a: Any, **kw: Any) -> Any:
            # A pass before the first renewal has nothing to repair (the set is the
            # leases' own, filled meanwhile: judged before the pass).
            full = len(shards) == SHARDS
            got = await real_repair(shards, *a, **kw)
            repairs[0] += full
            return got

        trig.repair.run = repair  # type: ignore[method-assign]
        task = asyncio.create_task(trig.run())
        proc = psutil.Process()
        try:
            t0 = time.perf_counter()
            while repairs[0] < 1:  # the first load and its full repair
                if task.done():
                    await task
                await asyncio.sleep(0.05)
            settle_s = time.perf_counter() - t0
            # And the reconcile after them: the repair took the bulk write's change log
            # (a row per wait), which names every shard; that one reconcile compares them
            # all, once. The idle state begins after it.
            first, config.reload_every = reconciles[0], args.period
            while reconciles[0] <= first:
                if task.done():
                    await task
                await asyncio.sleep(0.05)
            catch_up_s = time.perf_counter() - t0 - settle_s
            if schema is not None:
                await vacuum(args.dsn, schema)

            async def window(period: float) -> dict[str, float]:
                config.reload_every = config.cleanup_every = period
                r0, s0, c0, n0 = await reads.read(), statements.n, _cpu(proc), reconciles[0]
                w0 = time.perf_counter()
                await asyncio.sleep(args.window)
                r1, s1, c1, n1 = await reads.read(), statements.n, _cpu(proc), reconciles[0]
                wall = time.perf_counter() - w0
                out = {k: r1[k] - r0[k] for k in r1}
                out.update(statements=s1 - s0, cpu_s=c1 - c0, wall=wall, reconciles=n1 - n0)
                return out

            base = await window(1e9)
            busy = await window(args.period)
        finally:
            trig.stop()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await store.close()
    return per_minute(waits, base, busy) | {
        "written_s": round(written_s, 2),
        "first_load_and_repair_s": round(settle_s, 2),
        "first_reconcile_after_s": round(catch_up_s, 2),
        "windows": {"base": base, "reconcile": busy},
    }


async def vacuum(dsn: str, schema: str) -> None:
    """VACUUM ANALYZE the schema's tables, as autovacuum does within a minute or so of the
    first load (it marks every trigger row loaded) and of the bulk write: the idle state
    measured is a settled one. Without it, the dead index entries they left are read
    again by each bitmap scan (a look at the change log, the incremental load) until
    autovacuum comes, and the planner knows nothing of the new rows."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
        for t in tables:
            await conn.execute(f'VACUUM (ANALYZE) "{schema}"."{t["tablename"]}"')
    finally:
        await conn.close()


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def per_minute(waits: int, base: dict[str, float], busy: dict[str, float]) -> dict[str, Any]:
    """A minute: the base window's rate for 60 s, plus one reconcile and one cleanup (each
    the reconcile window's excess over the base rate, per reconcile counted)."""
    n = max(1, int(busy["reconciles"]))

    def minute(key: str) -> float:
        rate = base[key] / base["wall"]
        return rate * 60 + max(0.0, busy[key] - rate * busy["wall"]) / n

    out: dict[str, Any] = {"waits": waits}
    out["db_rows_read_per_min"] = round(minute("rows")) if "rows" in base else None
    out["db_vm_steps_per_min"] = round(minute("vm_steps")) if "vm_steps" in base else None
    out["db_statements_per_min"] = round(minute("statements"))
    out["triggerer_cpu_pct"] = round(minute("cpu_s") / 60 * 100, 3)
    out["reconcile"] = {
        k: round(max(0.0, busy[k] - base[k] / base["wall"] * busy["wall"]) / n, 1)
        for k in ("rows", "vm_steps", "statements", "cpu_s")
        if k in base
    }
    return out


STATEMENTS = Statements()


async def configuration(
    backend: str, waits: int, args: argparse.Namespace, folder: Path, rec: calibration.Recording
) -> dict:
    runs = []
    for i in range(args.repeat):
        if backend == "sqlite":
            runs.append(
                await one_run(common.fresh_db(folder, f"idle-{waits}-{i}"), waits, args, None)
            )
        else:
            from .postgres import Schema

            async with Schema(args.dsn) as schema:
                runs.append(await one_run(schema.url, waits, args, schema.name))
        rec.add({f"{backend}_{waits}_{key}": runs[-1][key] for key in KEYS})
        common.console.print(
            f"{backend} {waits:>9,} waits, run {i + 1}: "
            + ", ".join(f"{k} {runs[-1][k]}" for k in KEYS if runs[-1][k] is not None)
        )
    out: dict[str, Any] = {"backend": backend, "waits": waits}
    for key in KEYS:
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(values) if values else None
        if values:
            out[f"{key}_min_max"] = [min(values), max(values)]
    out["runs"] = runs
    return out


def verdicts(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows read (SQLite: VM instructions) per idle minute at 100,000 waits against 0."""
    out: dict[str, Any] = {}
    for backend, key in (("postgresql", "db_rows_read_per_min"), ("sqlite", "db_vm_steps_per_min")):
        by = {r["waits"]: r for r in results if r["backend"] == backend}
        if 0 in by and 100_000 in by and by[0][key]:
            ratio = by[100_000][key] / by[0][key]
            out[backend] = {
                "measure": key,
                "ratio_100k_to_0": round(ratio, 2),
                "target": TARGET_RATIO,
                "met": ratio <= TARGET_RATIO,
            }
    return out


def plot(results: list[dict[str, Any]], path_dir: Path) -> Path:
    fig, axes = common.subplots(3, width=4.6)
    series = (
        ("postgresql", "db_rows_read_per_min", "PostgreSQL rows read / idle min"),
        ("sqlite", "db_vm_steps_per_min", "SQLite VM instructions / idle min"),
        (None, "triggerer_cpu_pct", "triggerer CPU % (idle)"),
    )
    for ax, (backend, key, title) in zip(axes, series, strict=True):
        shown = [r for r in results if backend is None or r["backend"] == backend]
        labels = [f"{LABEL[r['backend']]} {r['waits']:,}" for r in shown]
        ax.bar(labels, [r[key] or 0 for r in shown], color="tab:blue")
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=30)
    return common.save_figure(fig, NAME, path_dir)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    STATEMENTS.install()
    results = []
    with (
        common.workdir(args.workdir, args.keep) as folder,
        calibration.Recording(folder) as rec,
    ):
        for backend, text in (("postgresql", args.pg_sizes), ("sqlite", args.sqlite_sizes)):
            for waits in sizes(text):
                results.append(asyncio.run(configuration(backend, waits, args, folder, rec)))
    doc = common.result_document(
        NAME,
        argv,
        {
            "window_s": args.window,
            "reconcile_period_in_window_s": args.period,
            "repeat": args.repeat,
            "waits": "event waits (DEFERRED tasks on event-keyed trigger rows)",
            "scaling": "base rate x 60 s + one reconcile and one cleanup (default period 60 s)",
        },
        common.REPO,
    )
    doc.update(rec.fields())  # calibration, repeats (each configuration's figures), load
    doc["results"] = results
    doc["targets"] = verdicts(results)
    common.write_json(NAME, doc, args.results)
    plot(results, args.results)
    common.print_table(
        "idle waits, per minute (medians)",
        [
            (
                f"{r['backend']} {r['waits']:,}",
                ", ".join(f"{k} {r[k]}" for k in KEYS if r[k] is not None),
            )
            for r in results
        ],
    )
    common.console.print(doc["targets"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
