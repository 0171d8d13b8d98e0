"""Start waits: a DAG's schedule and its start condition, as waits the triggerer holds.

A ``start_wait`` row (one per DAG and kind) points at a trigger row like a deferred task
does, so the triggerer loads, de-duplicates, shards and takes it over like any wait: a
schedule is a :class:`~triggers.temporal.DateTimeTrigger` at the end of the next interval
(10,000 DAGs due at one minute are one check), a condition is the DAG's ``start_when``
trigger rendered for a date.

**Armed** by the catalogue (:func:`arm`): when a DAG is parsed with a new or changed
schedule or condition, and when it is unpaused. Paused, broken or removed DAGs have no
start waits. **Fired** by the triggerer (:func:`fire_starts`), in the transaction that
writes the event: it creates the runs (once per (dag_id, run key): a replayed fire, two
triggerers or a takeover create nothing more), then re-arms the wait on its next trigger
row. The fire re-reads the wait under a row lock and acts only if it still points at the
fired trigger, so a wait is re-armed once per fire.

A schedule's fire creates every interval that has ended by now (catchup) in one go, up to
:data:`MAX_RUNS_PER_FIRE`, then arms the first interval still to come; ``catchup=False``
skips to the latest ended interval. A condition's fire creates the runs its trigger asks
for (:meth:`~triggers.base.BaseTrigger.run_requests`: by default one, keyed by the date the
condition was rendered for), then re-arms: for the next date when the run was keyed by
date, else for the same date after one poke interval (a listing condition keeps finding
new keys; the keys that already have a run create nothing).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from triggers.base import BaseTrigger
from triggers.registry import load_trigger
from triggers.temporal import DateTimeTrigger

from ..assets import MAX_EXTRA
from ..driver.db import Row, Tx
from ..runnames import RunType
from ..runwaits import insert_trigger as _insert_trigger
from ..schedules import Interval, Schedule
from ..templating import Scope, render_trigger
from .assets import NewAssetEvent, has_assets, record_asset_events
from .lines import one_line
from .runs import (
    NewRun,
    RunShape,
    insert_runs,
    interval_run_id,
    interval_text,
    scheduled_run_key,
)

SCHEDULE = "schedule"
CONDITION = "condition"
# An asset's watcher (executor/assets.py): kind `watch:N:URI`, the DAG's N-th watcher.
WATCH = "watch:"
# One fire creates at most this many catch-up runs; the wait is re-armed at once (its
# moment has passed) and the next fire goes on, so one transaction stays short.
MAX_RUNS_PER_FIRE = 500
# The longest run key a start condition may ask for (an S3 key is at most 1,024 bytes).
MAX_RUN_KEY = 2048
# A start wait whose trigger failed is checked again after this long (seconds).
RETRY_AFTER = 60.0


@dataclass(frozen=True, slots=True)
class StartSpec:
    """What the catalogue holds about when a DAG starts (its ``dag`` row)."""

    dag_id: str
    file: str  # where workers import the DAG from
    zone: ZoneInfo
    schedule: Schedule | None  # catchup included
    max_active_runs: int
    shape: RunShape | None
    start_when: tuple[str, str] | None  # (classpath, kwargs JSON), not rendered
    paused: bool
    parse_error: str | None  # its file's last parse failed (the shape is the last good one)

    @classmethod
    def of(cls, row: Row) -> StartSpec:
        schedule = Schedule.from_json(row["schedule"]) if row["schedule"] else None
        when = json.loads(row["start_when"]) if row["start_when"] else None
        return cls(
            dag_id=row["dag_id"],
            file=row["file"],
            zone=ZoneInfo(row["timezone"]),
            schedule=schedule,
            max_active_runs=row["max_active_runs"],
            shape=_shape(row["dag_id"], row["shape"]) if row["shape"] else None,
            start_when=None if when is None else (when[0], json.dumps(when[1], sort_keys=True)),
            paused=bool(row["paused"]),
            parse_error=row["parse_error"],
        )

    @property
    def startable(self) -> bool:
        """Whether its schedule and condition may start runs: not paused, file not broken."""
        return not self.paused and self.parse_error is None

    def today(self, now: float) -> date:
        """The date on the DAG's clock at ``now``: what a start condition is rendered for."""
        return datetime.fromtimestamp(now, self.zone).date()


# Many DAGs declare the same shape: parse each text once (Schedule.from_json does too).
@functools.lru_cache(maxsize=4096)
def _shape(dag_id: str, text: str) -> RunShape:
    return RunShape.from_json(dag_id, text)


async def start_row(tx: Tx, dag_id: str) -> Row | None:
    """``dag_id``'s catalogue row as :meth:`StartSpec.of` reads it (None: not catalogued)."""
    return await tx.fetchone("dag_start_specs", dag_ids=[dag_id])


async def arm(tx: Tx, dag_id: str, now: float) -> None:
    """(Re-)arm ``dag_id``'s start waits from its catalogue row and its runs so far."""
    await tx.execute("delete_start_waits", dag_id=dag_id)
    row = await start_row(tx, dag_id)
    if row is None:
        return
    spec = StartSpec.of(row)
    if not spec.startable or spec.shape is None:
        return
    if spec.schedule is not None:
        last = await tx.fetchone("last_interval_end", dag_id=dag_id)
        after = _instant(last["last_end"]) if last is not None else None
        iv = spec.schedule.next_run(after, _at(now))
        if iv is not None:
            await _arm(tx, spec.dag_id, SCHEDULE, _schedule_trigger(iv), iv.start, iv, now)
    await _arm_watchers(tx, spec, now)
    if spec.start_when is not None:
        try:
            rendered = _render(load_trigger(*spec.start_when), spec, spec.today(now))
        except Exception as exc:  # its class left the allow-list, or changed its fields
            why = f"cannot arm start condition {spec.start_when[0]}: {type(exc).__name__}: {exc}"
            await tx.execute("set_start_error", dag_id=dag_id, error=one_line(why), now=now)
            return
        day = spec.today(now)
        await _arm(tx, spec.dag_id, CONDITION, rendered, day, None, now, not_before=None)


async def disarm(tx: Tx, dag_ids: list[str]) -> None:
    """Forget the start waits of these DAGs (paused, broken, removed); their trigger rows
    go with the triggerer's orphan sweep, and a fire already in flight finds no wait."""
    await tx.execute("delete_start_waits_of", dag_ids=dag_ids)


async def fire_starts(tx: Tx, waits: Mapping[int, int], payload: Any, now: float) -> int:
    """The triggerer's fire for start waits (start_wait id -> fired trigger id): create the
    runs and re-arm, in ``tx``. Returns how many runs were created.

    Schedules are handled as one batch, so that 10,000 DAGs due at one minute cost a few
    statements: their specs are read at once, equal schedules are planned once, the runs
    are inserted together (:func:`insert_runs`) and waits re-armed on the same moment share
    one trigger row."""
    armed = [
        w
        for w in await tx.fetch("armed_start_waits", ids=sorted(waits))
        # Re-armed by an earlier fire of the same event: nothing twice.
        if w["trigger_id"] == waits[w["id"]]
    ]
    if not armed:
        return 0
    dag_ids = sorted({w["dag_id"] for w in armed})
    specs = {
        r["dag_id"]: StartSpec.of(r) for r in await tx.fetch("dag_start_specs", dag_ids=dag_ids)
    }
    await tx.execute("clear_start_errors", dag_ids=dag_ids)
    batch = _ScheduleBatch(_at(now))
    created = 0
    for wait in armed:
        spec = specs.get(wait["dag_id"])
        if spec is None or not spec.startable or spec.shape is None:
            batch.drop.append(wait["id"])
        elif wait["kind"] == SCHEDULE:
            batch.add(spec, wait)
        elif wait["kind"].startswith(WATCH):
            created += await _fire_watcher(tx, wait, payload, now)
        else:
            created += await _fire_condition(tx, spec, wait, payload, now)
    return created + await batch.write(tx, now)


class _ScheduleBatch:
    """The runs and re-arms of the schedules one fire answers, written together."""

    def __init__(self, at: datetime) -> None:
        self.at = at
        self.runs: list[tuple[RunShape, NewRun]] = []
        self.rearm: list[tuple[int, Interval]] = []  # start wait id, the interval to arm
        self.drop: list[int] = []  # start wait ids with nothing more to arm
        # Planned once per (schedule, fired interval): DAGs due together share the plan.
        self._plans: dict[
            tuple[Any, ...], tuple[list[tuple[Interval, date, str]], Interval | None]
        ] = {}

    def add(self, spec: StartSpec, wait: Row) -> None:
        assert spec.schedule is not None and spec.shape is not None
        key = (spec.schedule, wait["logical_date"], wait["interval_end"])
        plan = self._plans.get(key)
        if plan is None:
            fired = Interval(
                _utc(wait["logical_date"]), _utc(wait["interval_end"]), spec.schedule.zone
            )
            due, after = _due(spec.schedule, fired, self.at)
            plan = [(iv, date.fromisoformat(iv.ds), scheduled_run_key(iv)) for iv in due], after
            self._plans[key] = plan
        due_runs, nxt = plan
        for iv, logical_date, run_key in due_runs:
            new = NewRun(
                logical_date=logical_date,
                run_key=run_key,
                interval=iv,
                dag_file=spec.file,
                max_active=spec.max_active_runs,
                run_id=interval_run_id(spec.dag_id, iv),
                run_type=RunType.SCHEDULED,
            )
            self.runs.append((spec.shape, new))
        if nxt is None:  # past end_date: nothing more to arm
            self.drop.append(wait["id"])
        else:
            self.rearm.append((wait["id"], nxt))

    async def write(self, tx: Tx, now: float) -> int:
        if self.drop:
            await tx.execute("delete_start_waits_by_id", ids=self.drop)
        started = await insert_runs(tx, self.runs, now) if self.runs else []
        moments: dict[datetime, int] = {}  # one trigger row per moment, shared by its waits
        rows = []
        for wait_id, iv in self.rearm:
            if iv.end not in moments:
                moments[iv.end] = await _insert_trigger(tx, _schedule_trigger(iv), now, None)
            start, end = interval_text(iv)
            rows.append(
                {
                    "trigger_id": moments[iv.end],
                    "logical_date": start,
                    "interval_end": end,
                    "now": now,
                    "id": wait_id,
                }
            )
        await tx.executemany("rearm_start_wait", rows)
        return sum(s.created for s in started)


def _due(
    schedule: Schedule, fired: Interval, at: datetime
) -> tuple[list[Interval], Interval | None]:
    """The intervals to create from ``fired`` on (those ended by ``at``, at most
    :data:`MAX_RUNS_PER_FIRE`), and the interval to arm after them."""
    due: list[Interval] = []
    iv = schedule.skip_missed(fired, at)  # a late fire (an outage, a takeover) included
    while iv is not None and iv.end <= at and len(due) < MAX_RUNS_PER_FIRE:
        due.append(iv)
        iv = schedule.next_run(iv.end, at)
    return due, iv


async def fail_starts(tx: Tx, waits: Mapping[int, int], why: str, now: float) -> None:
    """A start wait's trigger failed (raised, reported an error, could not be loaded): the
    error goes on its DAG (``slotless dags list`` shows it) and the same wait is checked
    again after :data:`RETRY_AFTER` seconds. No run is created, none is lost for good."""
    for wait in await tx.fetch("armed_start_waits", ids=list(waits)):
        if wait["trigger_id"] == waits[wait["id"]]:
            await _retry_later(tx, wait, why, now)


async def _retry_later(tx: Tx, wait: Row, why: str, now: float) -> None:
    """Keep ``why`` on the wait's DAG and check the same wait again after a while."""
    await tx.execute("set_start_error", dag_id=wait["dag_id"], error=one_line(why), now=now)
    await _check_again(tx, wait, now, RETRY_AFTER)


async def _check_again(tx: Tx, wait: Row, now: float, after: float) -> None:
    """Arm ``wait`` again on a fresh copy of its trigger, checked ``after`` seconds on."""
    copy = await tx.fetchone("copy_trigger", id=wait["trigger_id"], now=now, not_before=now + after)
    if copy is None:  # its trigger row is gone: arm from scratch
        await arm(tx, wait["dag_id"], now)
        return
    await tx.execute(
        "rearm_start_wait",
        trigger_id=copy["id"],
        logical_date=wait["logical_date"],
        interval_end=wait["interval_end"],
        now=now,
        id=wait["id"],
    )


async def _fire_condition(tx: Tx, spec: StartSpec, wait: Row, payload: Any, now: float) -> int:
    assert spec.start_when is not None and spec.shape is not None
    armed = date.fromisoformat(wait["logical_date"])
    try:  # the trigger class's code (a user's own, maybe): its failure is this DAG's alone
        trigger = load_trigger(*spec.start_when)
        requests = [(_run_key(key), json.loads(json.dumps(event)))
                    for key, event in trigger.run_requests(payload)]  # fmt: skip
        keyed_by_date = all(key is None for key, _ in requests)
        today = spec.today(now)
        if keyed_by_date:
            nxt, not_before = max(armed + timedelta(days=1), today), None
        else:
            nxt, not_before = today, now + trigger.poke_interval
        rendered = _render(trigger, spec, nxt)
    except Exception as exc:
        why = f"start condition {spec.start_when[0]}: {type(exc).__name__}: {exc}"
        await _retry_later(tx, wait, why, now)
        return 0
    runs = [
        NewRun(
            logical_date=armed,
            run_key=key or armed.isoformat(),
            start_event=event,
            dag_file=spec.file,
            max_active=spec.max_active_runs,
            run_type=RunType.EVENT,
            zone=spec.zone,
        )
        for key, event in requests
    ]
    started = await insert_runs(tx, [(spec.shape, new) for new in runs], now)
    await _rearm(tx, wait, rendered, nxt, None, now, not_before=not_before)
    return sum(s.created for s in started)


async def _arm_watchers(tx: Tx, spec: StartSpec, now: float) -> None:
    """The watchers of the assets ``spec``'s DAG names: each a start wait of its own."""
    if not await has_assets(tx):
        return
    row = await tx.fetchone("dag_asset_watchers", dag_id=spec.dag_id)
    watchers = json.loads(row["asset_watchers"]) if row and row["asset_watchers"] else []
    for n, (uri, classpath, kwargs) in enumerate(watchers):
        try:
            trigger = _render(load_trigger(classpath, kwargs), spec, spec.today(now))
        except Exception as exc:  # its class left the allow-list, or changed its fields
            why = f"cannot arm the watcher of asset {uri} ({classpath}): {type(exc).__name__}: "
            why += str(exc)
            await tx.execute("set_start_error", dag_id=spec.dag_id, error=one_line(why), now=now)
            continue
        await _arm(tx, spec.dag_id, f"{WATCH}{n}:{uri}", trigger, spec.today(now), None, now)


async def _fire_watcher(tx: Tx, wait: Row, payload: Any, now: float) -> int:
    """An asset's watcher fired: an event of the asset (its payload as the extra, when an
    object), then the same watcher again after its poke interval. The event's dedup key
    is the fired trigger row, so a fire written twice records one event."""
    uri = wait["kind"].split(":", 2)[2]
    extra = json.dumps(payload, sort_keys=True) if isinstance(payload, dict) else None
    if extra is not None and len(extra.encode()) > MAX_EXTRA:
        extra = None  # an oversized payload is not kept: the event still counts
    event = NewAssetEvent(uri, "watcher", extra, dedup_key=f"watch:{wait['trigger_id']}")
    [rec] = await record_asset_events(tx, [event], now)
    trigger = await tx.fetchone("trigger_classpath", id=wait["trigger_id"])
    interval = RETRY_AFTER
    if trigger is not None:
        try:
            interval = load_trigger(trigger["classpath"], trigger["kwargs"]).poke_interval
        except Exception:  # checked at the next arm; the copy below keeps the wait going
            interval = RETRY_AFTER
    await _check_again(tx, wait, now, interval)
    return len(rec.runs)


def _run_key(key: object) -> str | None:
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_RUN_KEY):
        raise ValueError(f"run_requests() gave the run key {key!r}: a string of 1 to "
                         f"{MAX_RUN_KEY} characters, or None")  # fmt: skip
    return key


async def _arm(
    tx: Tx,
    dag_id: str,
    kind: str,
    trigger: BaseTrigger,
    logical: date | datetime,
    iv: Interval | None,
    now: float,
    not_before: float | None = None,
) -> None:
    trigger_id = await _insert_trigger(tx, trigger, now, not_before)
    await tx.execute(
        "insert_start_wait",
        dag_id=dag_id,
        kind=kind,
        trigger_id=trigger_id,
        logical_date=logical.isoformat(),
        interval_end=None if iv is None else iv.end.isoformat(),
        now=now,
    )


async def _rearm(
    tx: Tx,
    wait: Row,
    trigger: BaseTrigger,
    logical: date | datetime,
    iv: Interval | None,
    now: float,
    not_before: float | None,
) -> None:
    trigger_id = await _insert_trigger(tx, trigger, now, not_before)
    await tx.execute(
        "rearm_start_wait",
        trigger_id=trigger_id,
        logical_date=logical.isoformat(),
        interval_end=None if iv is None else iv.end.isoformat(),
        now=now,
        id=wait["id"],
    )


def _schedule_trigger(iv: Interval) -> BaseTrigger:
    return DateTimeTrigger(moment=iv.end)


def _render(trigger: BaseTrigger, spec: StartSpec, day: date) -> BaseTrigger:
    """The start condition rendered for ``day`` (executor/templating.py). In the fire's
    transaction, which cannot await anything but its statements: once per DAG's arm or
    fire, never per wait; a template's first use in a process compiles it (about 0.3 ms
    for a path's, measured in docs/templates.md, and its source is at most
    MAX_TEMPLATE characters), later ones only run it (about 20 us)."""
    if not trigger.templates():
        return trigger
    return render_trigger(trigger, Scope.for_date(spec.dag_id, day, spec.zone))


def _at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def _instant(text: str | None) -> datetime | None:
    return None if text is None else _utc(text)
