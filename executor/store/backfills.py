"""Backfill: the runs of a DAG's past intervals, from the shape the catalogue stored.

Each interval's run takes the key its schedule would give it (:func:`scheduled_run_key`),
so the run keys' unique index makes a backfill idempotent (run it again: the intervals
that have a run are found, not created) and the schedule never creates a second run of
an interval a backfill ran, nor a backfill of one the schedule ran.

A rerun of an interval whose run ended FAILED is a new run keyed ``KEY~rerun-N`` (the
first N free); the failed run is left as it ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Literal

from ..driver.db import Tx
from ..runnames import RunType
from ..schedules import Interval
from ..states import RunState
from .runs import NewRun, insert_run, interval_run_id, scheduled_run_key
from .starts import StartSpec

RERUN = "~rerun-"
# Intervals created per transaction: a year of hourly runs must not hold the write lock
# (SQLite: the whole file) for one long transaction; each batch is idempotent anyway.
BATCH = 500

How = Literal["created", "existing", "rerun"]


@dataclass(frozen=True, slots=True)
class Backfilled:
    """An interval of a backfill and its run: created now, found, or a rerun of a failure."""

    interval: Interval
    run_id: str
    run_key: str
    state: str  # as of its creation (or when it was found)
    how: How
    rerun_of: str | None = None  # the FAILED run a rerun follows


async def backfill_runs(
    tx: Tx,
    spec: StartSpec,
    intervals: Sequence[Interval],
    *,
    max_active: int,
    rerun_failed: bool,
    now: float,
) -> list[Backfilled]:
    """A run for each interval that has none, in ``tx``; with ``rerun_failed``, a new one for
    each interval whose latest run (``KEY``, then ``KEY~rerun-1``, ...) ended FAILED.

    Runs go through :func:`insert_run` with ``max_active``: over it they wait QUEUED, and
    the store starts the oldest interval first as runs end.
    """
    assert spec.shape is not None, f"DAG {spec.dag_id!r} has no stored shape"
    done: list[Backfilled] = []
    for iv in intervals:
        key = scheduled_run_key(iv)
        n, failed = 0, None
        while True:
            suffix = f"{RERUN}{n}" if n else ""
            new = NewRun(
                logical_date=date.fromisoformat(iv.ds),
                run_key=key + suffix,
                interval=iv,
                dag_file=spec.file,
                max_active=max_active,
                run_id=interval_run_id(spec.dag_id, iv, suffix),
                run_type=RunType.BACKFILL,
            )
            # Insert first, look after: a taken key inserts nothing and names its run,
            # and no concurrent backfill or schedule fire can slip in between.
            run = await insert_run(tx, spec.shape, new, now)
            if run.created or not rerun_failed or run.state != RunState.FAILED:
                break
            n, failed = n + 1, run.run_id
        if not run.created:
            done.append(Backfilled(iv, run.run_id, run.run_key, run.state, "existing"))
        else:
            how: How = "rerun" if n else "created"
            done.append(Backfilled(iv, run.run_id, run.run_key, run.state, how, failed))
    return done
