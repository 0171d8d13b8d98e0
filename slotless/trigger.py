"""``slotless trigger DAG``: start a run against the running services, at most once per key.

The DAG is found in the catalogue (the folder of ``--dags`` or ``$SLOTLESS_DAGS`` is
scanned first, as ``slotless dags list`` does: changed files are imported in time-limited
children). Its file is then imported here, with :func:`executor.loader.load_dag` (the
import the workers make), in a daemon thread bounded by the same time limit: never on
this command's event loop, and a file that hangs ends the command with an error instead
of holding it. The run's tasks and the conf's check need the DAG object itself (its task
specs, its params model), which a child process could only send back re-described. The
catalogue has just imported the file in a child: a DAG whose file last failed to parse is
refused before any import here.

The conf is checked against the DAG's params before the run is inserted; the insert is
:meth:`Runs.start_run`, idempotent per (dag_id, run key). The command then exits: a
running ``slotless worker`` imports the DAG from the run's ``dag_file`` and runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import AsyncIterator
from datetime import date
from typing import Any

from executor.catalogue import dags_folder, scan
from executor.dag import DAG
from executor.loader import DagImportError, load_dag
from executor.params import parse_conf
from executor.runnames import RunType
from executor.store import Store, open_store
from executor.store.runs import StartedRun

from .options import db_opt, logical_date, parse_timeout_opt


class DagPaused(ValueError):
    """The DAG is paused and the trigger was not forced."""


def add_commands(sub: Any) -> None:
    trig_run = sub.add_parser(
        "trigger",
        help="start a run of a catalogued DAG for the running worker; once per --run-key",
    )
    trig_run.add_argument("dag_id", metavar="DAG")
    trig_run.add_argument("--logical-date", type=logical_date, help="YYYY-MM-DD (default today)")
    trig_run.add_argument("--conf", metavar="JSON", help="a JSON object, checked against params")
    trig_run.add_argument(
        "--run-key",
        metavar="KEY",
        help="at most one run per DAG and key (default: the date and a random part)",
    )
    trig_run.add_argument("--force", action="store_true", help="trigger a paused DAG anyway")
    db_opt(trig_run)
    trig_run.add_argument(
        "--dags", metavar="DIR", help="parse this folder's changed DAG files first"
    )
    parse_timeout_opt(trig_run, "the DAG's file")
    trig_run.add_argument("--json", action="store_true", help="print one JSON object")
    trig_run.set_defaults(func=trigger_command)


async def trigger_command(args: argparse.Namespace) -> int:
    conf = parse_conf(args.conf)  # bad JSON: refused before the database is even opened
    async with catalogued(args) as store:
        started = await trigger_run(
            store,
            args.dag_id,
            conf,
            logical_date=args.logical_date,
            run_key=args.run_key,
            force=args.force,
            parse_timeout=args.parse_timeout,
        )
    if args.json:
        print(
            json.dumps(
                {
                    "dag_id": args.dag_id,
                    "run_id": started.run_id,
                    "run_key": started.run_key,
                    "created": started.created,
                    "state": started.state,
                }
            )
        )
    elif started.created and started.state == "QUEUED":
        print(
            f"{started.run_id}: created QUEUED (run key {started.run_key}): {args.dag_id} has "
            f"max_active_runs runs going; it starts when one ends"
        )
    elif started.created:
        print(f"{started.run_id}: created (run key {started.run_key})")
    else:
        print(f"{started.run_id}: already exists for run key {started.run_key}; nothing created")
    return 0


async def trigger_run(
    store: Store,
    dag_id: str,
    conf: dict[str, Any] | None,
    *,
    parse_timeout: float,
    logical_date: date | None = None,
    run_key: str | None = None,
    force: bool = False,
) -> StartedRun:
    """A run of the catalogued ``dag_id`` with ``conf``, once per run key: what ``slotless
    trigger`` and the web page's trigger button do.

    Refused, with nothing created: :class:`UnknownDag`, a broken file
    (:class:`DagImportError`), a paused DAG unless ``force`` (:class:`DagPaused`), a conf the
    DAG's params refuse (:class:`executor.params.BadConf`, checked by ``start_run``).
    """
    entry = await store.catalogue.catalogue_dag(dag_id)
    if entry["parse_error"]:
        raise DagImportError(
            f"DAG {dag_id!r} cannot be triggered: its file is broken: {entry['parse_error']}"
        )
    if entry["paused"] and not force:
        raise DagPaused(
            f"DAG {dag_id!r} is paused: `slotless dags unpause {dag_id}` "
            "first, or trigger it anyway with --force"
        )
    dag = await import_dag(entry["file"], dag_id, parse_timeout)
    return await store.runs.start_run(
        dag,
        logical_date or date.today(),
        run_key=run_key,
        conf=conf,
        dag_file=entry["file"],
        # A run by hand counts against max_active_runs, as in Airflow: QUEUED over it.
        max_active=dag.max_active_runs,
        run_type=RunType.MANUAL,  # the command, the page's button and the API alike
    )


@contextlib.asynccontextmanager
async def catalogued(args: argparse.Namespace) -> AsyncIterator[Store]:
    """The store of ``--db``, its catalogue first brought up to date with the folder of
    ``--dags`` (or $SLOTLESS_DAGS) when one is given: ``slotless trigger`` and ``backfill``.

    Without a folder to parse, the catalogue is read as stored, and a mistyped --db must
    not leave a new, empty database behind.
    """
    folder = dags_folder(args.dags)
    store = await open_store(args.db, create=folder is not None)
    try:
        if folder is not None:
            await scan(store, folder, timeout=args.parse_timeout, by_hand=True)
        yield store
    finally:
        await store.close()


async def import_dag(path: str, dag_id: str, timeout: float) -> DAG:
    """:func:`load_dag` in a daemon thread, within ``timeout`` seconds.

    What the file prints goes to stderr, so that ``--json`` stays one object on stdout.
    A daemon thread, because a thread cannot be stopped: one stuck past the limit must
    not keep the command from exiting (asyncio's own executor threads are joined).
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[DAG] = loop.create_future()

    def settle(dag: DAG | None, exc: BaseException | None) -> None:
        if done.done():  # the wait gave up already
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            assert dag is not None
            done.set_result(dag)

    def work() -> None:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                dag = load_dag(path, dag_id, cached=False)  # the file as it is now
                dag.validate()
        except Exception as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, dag, None)

    threading.Thread(target=work, name="slotless-trigger-import", daemon=True).start()
    try:
        return await asyncio.wait_for(done, timeout)
    except TimeoutError:
        raise DagImportError(f"cannot import {path}: did not finish within {timeout:g} s") from None
