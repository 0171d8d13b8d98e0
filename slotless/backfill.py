"""``slotless backfill DAG --from D1 --to D2``: a run for each past interval of a schedule.

The DAG comes from the catalogue (``--dags DIR`` parses a folder into it first, as
``slotless trigger`` does) and its runs from the shape the catalogue stored, not from an
import of the file here: :meth:`Runs.backfill` keys each interval's run as the schedule
does, so a backfill run again creates nothing and the schedule never runs an interval a
backfill ran. The runs are the running workers' to run; this command follows them (the
store's run states, polled) until they end, and Ctrl-C stops only the following.

``--from`` and ``--to`` are read on the DAG's clock: a date is its whole day, a naive ISO
datetime is wall time in the DAG's zone. Intervals that have not ended yet are the
schedule's: a backfill never starts a run before its data interval is complete.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, time, timedelta
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from executor.loader import DagImportError
from executor.runnames import logical_time_text, shown_at
from executor.schedules import Interval
from executor.states import RUN_TERMINAL, RunState
from executor.store import Store
from executor.store.backfills import Backfilled
from executor.store.starts import StartSpec

from .options import db_opt, parse_timeout_opt, slots
from .trigger import catalogued

# The most intervals one backfill creates: a typo (a minutely DAG over a year) must not
# insert half a million runs; a longer backfill is several commands.
MAX_INTERVALS = 10_000
POLL = 0.5  # seconds between two reads of the runs' states
# CANCELLED too: an operator's cancel, or a run past its dagrun_timeout.
ENDED = RUN_TERMINAL
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")

err = Console(stderr=True)


class BadBackfill(ValueError):
    """A backfill that cannot be made: no schedule, an empty or reversed range."""


def add_commands(sub: Any) -> None:
    back = sub.add_parser(
        "backfill",
        help="a run of a scheduled DAG for each past interval from --from to --to; follows them",
    )
    back.add_argument("dag_id", metavar="DAG")
    back.add_argument(
        "--from",
        dest="date_from",
        required=True,
        metavar="D1",
        help="the first logical date: YYYY-MM-DD or an ISO datetime, on the DAG's clock",
    )
    back.add_argument(
        "--to",
        dest="date_to",
        required=True,
        metavar="D2",
        help="the last logical date, included (a date: its whole day)",
    )
    back.add_argument(
        "--max-active",
        type=slots,
        metavar="N",
        help="at most N of its runs at once, the rest wait queued (default: max_active_runs)",
    )
    back.add_argument(
        "--rerun-failed",
        action="store_true",
        help="a new run for each interval whose run ended FAILED (default: left alone)",
    )
    back.add_argument(
        "--no-wait", action="store_true", help="create the runs and exit, without following them"
    )
    back.add_argument("--json", action="store_true", help="print one JSON object")
    db_opt(back)
    back.add_argument("--dags", metavar="DIR", help="parse this folder's changed DAG files first")
    parse_timeout_opt(back)
    back.set_defaults(func=backfill_command)


async def backfill_command(args: argparse.Namespace) -> int:
    async with catalogued(args) as store:
        spec = await store.catalogue.start_spec(args.dag_id)
        due, later = plan(spec, args.date_from, args.date_to, store.clock())
        # From here Ctrl-C only ends the following: the runs are created whole (a batch
        # at a time anyway), then their states are read once more for the summary.
        with _ctrl_c() as stop:
            done = await store.runs.backfill(
                spec,
                due,
                max_active=args.max_active or spec.max_active_runs,
                rerun_failed=args.rerun_failed,
            )
            if not args.json:
                _announce(spec, args, done, later)
            states = {b.run_id: b.state for b in done}
            interrupted = False
            if not args.no_wait:
                show = not args.json and err.is_terminal
                states, interrupted = await follow(store, spec.dag_id, states, show, stop)
    failed = sum(s == RunState.FAILED for s in states.values())
    going = sum(s not in ENDED for s in states.values())
    if args.json:
        print(json.dumps(_report(spec, args, done, states, later, interrupted)))
    elif not args.no_wait:
        _summary(spec, done, states, interrupted)
    if args.no_wait:
        return 0
    return 1 if failed else 130 if going else 0


def plan(
    spec: StartSpec, first: str, last: str, now: float
) -> tuple[list[Interval], list[Interval]]:
    """The intervals whose logical date is in ``[first, last]`` on the DAG's clock: those
    ended by ``now`` (to backfill) and those not (left to the schedule)."""
    if spec.parse_error is not None:
        raise DagImportError(
            f"DAG {spec.dag_id!r} cannot be backfilled: its file is broken: {spec.parse_error}"
        )
    if spec.schedule is None or spec.shape is None:
        raise BadBackfill(
            f"DAG {spec.dag_id!r} has no schedule, so no intervals to backfill "
            "(`slotless trigger` starts a run of it)"
        )
    start = moment(first, spec.zone, "--from", end=False)
    end = moment(last, spec.zone, "--to", end=True)
    if start >= end:
        raise BadBackfill(f"--from {first} is after --to {last}")
    found = list(islice(spec.schedule.intervals(start, end), MAX_INTERVALS + 1))
    if not found:
        raise BadBackfill(
            f"DAG {spec.dag_id!r} has no interval starting from {first} to {last} "
            f"({spec.schedule.describe()}; its start_date and end_date bound it)"
        )
    if len(found) > MAX_INTERVALS:
        raise BadBackfill(
            f"more than {MAX_INTERVALS} intervals from {first} to {last}: backfill a "
            "shorter range at a time"
        )
    at = datetime.fromtimestamp(now, UTC)
    due = [iv for iv in found if iv.end <= at]
    if not due:
        raise BadBackfill(
            f"no interval of DAG {spec.dag_id!r} from {first} to {last} has ended yet: "
            "the schedule runs them when they are due"
        )
    return due, found[len(due) :]


def moment(text: str, zone: ZoneInfo, flag: str, *, end: bool) -> datetime:
    """``--from`` / ``--to`` as an instant: a date is its midnight on the DAG's clock (for
    ``--to``, the next midnight: the whole day is in); a naive datetime is wall time in
    ``zone``. ``end`` gives the exclusive bound just past ``--to``."""
    try:
        if _DATE.fullmatch(text):
            day = date.fromisoformat(text) + timedelta(days=1 if end else 0)
            return datetime.combine(day, time(), tzinfo=zone)
        value = datetime.fromisoformat(text)
    except ValueError:
        raise BadBackfill(
            f"{flag}: not a date (YYYY-MM-DD) nor an ISO datetime: {text!r}"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    return value + timedelta(microseconds=1) if end else value


@contextlib.contextmanager
def _ctrl_c() -> Iterator[asyncio.Event]:
    """An event Ctrl-C sets, instead of raising KeyboardInterrupt, meanwhile."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        yield stop
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def follow(
    store: Store, dag_id: str, states: dict[str, str], show: bool, stop: asyncio.Event
) -> tuple[dict[str, str], bool]:
    """Poll the runs' states until every one has ended, or ``stop`` (Ctrl-C, which cancels
    nothing: the workers go on). Returns the last states read, and whether it stopped early."""
    progress = Progress(
        TextColumn(f"[bold]backfill {dag_id}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[states]}"),
        TimeElapsedColumn(),
        console=err,
        disable=not show,
    )
    with progress:
        bar = progress.add_task("runs", total=len(states), states="")
        while True:
            states = {**states, **await store.views.runs_states(list(states))}
            counts = Counter(states.values())
            progress.update(
                bar,
                completed=sum(counts[s] for s in ENDED),
                states=" ".join(f"{s.lower()}={n}" for s, n in sorted(counts.items())),
            )
            if all(s in ENDED for s in states.values()):
                return states, False
            if stop.is_set():
                return states, True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL)


def _when(iv: Interval, zone: ZoneInfo) -> str:
    """An interval's logical time on the DAG's clock, as its run will be shown: the date
    alone for a day's interval, else its time too (executor.runnames.logical_shown)."""
    return shown_at(iv.start, zone, iv.end)


def _announce(
    spec: StartSpec, args: argparse.Namespace, done: Sequence[Backfilled], later: list[Interval]
) -> None:
    how = Counter(b.how for b in done)
    assert spec.schedule is not None
    limit = args.max_active or spec.max_active_runs
    span = f"{_when(done[0].interval, spec.zone)} to {_when(done[-1].interval, spec.zone)}"
    print(
        f"backfill {spec.dag_id}: {_n(len(done), 'interval')}, {span} "
        f"({spec.schedule.describe()}): "
        f"{how['created']} created, {how['rerun']} rerun, {how['existing']} already had a "
        f"run; at most {limit} running at once",
        flush=True,
    )
    if spec.paused:
        print(
            f"DAG {spec.dag_id!r} is paused: these runs will run; its schedule stays paused",
            flush=True,
        )
    for b in done:
        if b.how == "rerun":
            print(f"  {_when(b.interval, spec.zone)}: {b.run_id} reruns {b.rerun_of} (FAILED)")
        elif b.how == "existing" and b.state == RunState.FAILED and not args.rerun_failed:
            print(
                f"  {_when(b.interval, spec.zone)}: {b.run_id} FAILED, left alone "
                "(--rerun-failed starts a new run of it)"
            )
    if later:
        print(
            f"{_n(len(later), 'interval')} from {_when(later[0], spec.zone)} not ended yet: "
            "left to the schedule, not created",
            flush=True,
        )
    if args.no_wait:
        print("not waiting: `slotless status` shows the runs", flush=True)


def _summary(
    spec: StartSpec, done: Sequence[Backfilled], states: dict[str, str], interrupted: bool
) -> None:
    counts = Counter(states.values())
    parts = [f"{counts[RunState.SUCCESS]} succeeded", f"{counts[RunState.FAILED]} failed"]
    going = counts[RunState.RUNNING] + counts[RunState.QUEUED]
    if going:
        parts.append(f"{counts[RunState.RUNNING]} running, {counts[RunState.QUEUED]} queued")
    print(f"backfill {spec.dag_id}: {_n(len(states), 'run')}: " + ", ".join(parts))
    for b in done:
        if states[b.run_id] == RunState.FAILED:
            print(f"  FAILED {_when(b.interval, spec.zone)}: {b.run_id}")
    if interrupted and going:
        print(f"interrupted: {_n(going, 'run')} not ended go on in the workers (none cancelled)")


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _report(
    spec: StartSpec,
    args: argparse.Namespace,
    done: Sequence[Backfilled],
    states: dict[str, str],
    later: list[Interval],
    interrupted: bool,
) -> dict[str, Any]:
    how = Counter(b.how for b in done)
    return {
        "dag_id": spec.dag_id,
        "paused": spec.paused,
        "max_active": args.max_active or spec.max_active_runs,
        "created": how["created"],
        "existing": how["existing"],
        "rerun": how["rerun"],
        "not_ended": len(later),
        "interrupted": interrupted,
        "runs": [
            {
                "logical_date": b.interval.start.isoformat(),
                "logical_time": logical_time_text(b.interval.start),
                "ds": b.interval.ds,
                "run_id": b.run_id,
                "run_key": b.run_key,
                "how": b.how,
                "rerun_of": b.rerun_of,
                "state": states[b.run_id],
            }
            for b in done
        ],
    }
