"""The runs list (filtered, paged by keyset) and a run's Gantt chart: the :class:`RunList`
part of the store, read-only, for the web page and the JSON API.

**The list** is newest first by ``(created_at, run_id)``. A page is one index walk from a
*cursor*, the ``(created_at, run_id)`` of the row it continues from (``before``: the older
page, ``after``: the newer one), so a page deep in 100,000 runs costs what the first does
and a run created while someone pages is never shown twice nor skipped. Every filter is a
parameter of one of four fixed statements (schema/common/runs.sql): a DAG (one or more),
states, run types, a range of logical dates and a text searched in the run id and run key.

**The Gantt chart** of a run is built from the task event log: every ``transition`` row of
the run's tasks, read in one query, cut into segments, one per stretch a task spent in a
state (:func:`segments`): waiting for a slot, running (each attempt its own segment),
deferred, sensing, waiting to retry.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date

from executor.runnames import RUN_TYPES, logical_shown
from executor.states import RUN_TERMINAL, TERMINAL, RunState

from ..driver.db import Row
from .part import Part

DEFAULT_PAGE = 50  # runs on a page when no limit is asked for
MAX_PAGE = 500  # the most runs a page may ask for
MAX_TEXT = 200  # the longest search text and DAG id a filter takes
MAX_DAGS = 50  # the most DAGs one filter names
# A closed range of logical dates shorter than this is found through its index and sorted;
# a longer or open one is checked on the runs walked newest first (its runs are many).
DAYS_INDEXED = 31
# A mapped task's Gantt rows: its first instances (by map index); the rest are counted.
GANTT_INSTANCES = 100

RUN_STATES = tuple(s.value for s in RunState)
_OPEN_END = "9999-12-31"
_TOP = 1e300  # above every created_at: the first page's bound


class BadFilter(ValueError):
    """A filter or a cursor that cannot be: the message is one line, ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page continues from: the (created_at, run_id) of a row of the page before.
    Written in a URL as ``CREATED_AT:RUN_ID`` (``repr`` of the float: read back exactly)."""

    created_at: float
    run_id: str

    def text(self) -> str:
        return f"{self.created_at!r}:{self.run_id}"

    @classmethod
    def parse(cls, text: str, field: str) -> Cursor:
        at, sep, run_id = text.partition(":")
        try:
            value = float(at)
        except ValueError:
            value = math.nan
        if not sep or not math.isfinite(value) or not _storable(run_id):
            raise BadFilter(field, "not a cursor of this list (follow the page's own links)")
        return cls(value, run_id)


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which runs: each field empty means "any". ``from_day``/``to_day`` bound the run's
    logical date (its ``ds``, on its DAG's clock), both days included; ``text`` is found
    anywhere in the run id or the run key, case-insensitive, taken literally (``%`` and
    ``_`` are not wildcards). Checked when made: :class:`BadFilter` names the bad field."""

    dags: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    from_day: date | None = None
    to_day: date | None = None
    text: str = ""

    def __post_init__(self) -> None:
        if len(self.dags) > MAX_DAGS:
            raise BadFilter("dag", f"at most {MAX_DAGS} DAGs at once")
        for dag in self.dags:
            if not dag or len(dag) > MAX_TEXT or not _storable(dag):
                raise BadFilter("dag", f"not a DAG id: {dag[:60]!r}")
        for state in self.states:
            if state not in RUN_STATES:
                raise BadFilter(
                    "state", f"{state[:40]!r} is not a run state ({', '.join(RUN_STATES)})"
                )
        for kind in self.types:
            if kind not in RUN_TYPES:
                raise BadFilter("type", f"{kind[:40]!r} is not a run type ({', '.join(RUN_TYPES)})")
        if self.from_day and self.to_day and self.from_day > self.to_day:
            raise BadFilter("from", f"{self.from_day} is after to ({self.to_day})")
        if len(self.text) > MAX_TEXT:
            raise BadFilter("q", f"at most {MAX_TEXT} characters")
        if not _storable(self.text):
            raise BadFilter("q", "text without NUL characters")

    def walk(self) -> str:
        """Which statement finds the runs (schema/common/runs.sql says why there are
        several): one DAG's runs, several DAGs', a short closed range of logical dates, or
        every run newest first."""
        if self.dags:
            return "_dag" if len(self.dags) == 1 else "_dags"
        if self.from_day and self.to_day and (self.to_day - self.from_day).days < DAYS_INDEXED:
            return "_days"
        return ""

    def params(self) -> dict[str, object]:
        """The statement's parameters (schema/common/runs.sql says what each means)."""
        return {
            "states": list(self.states or RUN_STATES),
            "any_type": 0 if self.types else 1,
            "types": list(self.types),
            "from_day": self.from_day.isoformat() if self.from_day else "",
            "to_day": self.to_day.isoformat() if self.to_day else _OPEN_END,
            "pattern": like_pattern(self.text),
        }


def like_pattern(text: str) -> str:
    """``text`` found anywhere, as a LIKE pattern with ``\\`` as its escape: lower case (the
    statement lowers the columns), its own ``\\``, ``%`` and ``_`` taken literally."""
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True, slots=True)
class ListedRun:
    """One run of the list, with its task instances by state (an expanded mapped task
    counts as its instances) and when its first task started."""

    run_id: str
    dag_id: str
    logical_date: str
    logical: str  # the logical time as people read it (executor/runnames.py)
    run_type: str | None  # None: written by a release before run types
    run_key: str | None
    state: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    counts: dict[str, int]

    @property
    def finished(self) -> bool:
        return self.state in RUN_TERMINAL

    def duration(self, now: float) -> float | None:
        """From its first task's start to its end (to ``now`` while it runs)."""
        if self.started_at is None:
            return None
        return (self.ended_at if self.ended_at is not None else now) - self.started_at

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.created_at, self.run_id)


@dataclass(frozen=True, slots=True)
class RunsPage:
    """One page of the list: its runs newest first, and the cursors of the pages beside it
    (``older``: ``before=`` it; ``newer``: ``after=`` it; None: there is none)."""

    runs: list[ListedRun]
    older: Cursor | None
    newer: Cursor | None
    now: float
    dag_ids: list[str] = field(default_factory=list)  # every catalogued DAG (the form's list)

    @property
    def live(self) -> bool:
        """Whether the page can still change: the first page (new runs arrive at its top),
        or a run on it has not finished."""
        return self.newer is None or any(not r.finished for r in self.runs)


# ------------------------------------------------------------------------------- Gantt


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch one task row spent in one state. ``kind``: ``queued`` (claimable, waiting
    for a worker's slot), ``running`` (an attempt, ``attempt`` its number), ``deferred``
    (its trigger waits in the triggerer), ``sensing`` (a reschedule-mode sensor between
    checks), ``retrying`` (a failed attempt's wait for the next). ``open``: still going,
    ``end`` is the time the chart was read."""

    kind: str
    start: float
    end: float
    attempt: int | None = None
    open: bool = False
    ended_as: str | None = None  # the state it ended in (SUCCESS, RETRYING, ...)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class GanttRow:
    """One task row of the chart: a task, or one instance of a mapped task."""

    task_id: str
    map_index: int
    state: str
    attempt: int
    max_attempts: int
    segments: list[Segment]
    map_total: int | None = None  # a mapped task's own row: how many instances it has


@dataclass(frozen=True, slots=True)
class GanttTask:
    """A task and, if it is mapped, its instances (the first GANTT_INSTANCES of them)."""

    row: GanttRow
    instances: list[GanttRow]

    @property
    def hidden(self) -> int:
        """Instances not drawn (over GANTT_INSTANCES)."""
        return max(0, (self.row.map_total or 0) - len(self.instances))


@dataclass(frozen=True, slots=True)
class Gantt:
    """A run's chart: its tasks in the order they were created, on one time axis from
    ``start`` (the run's creation) to ``end`` (its end, or ``now`` while it goes on)."""

    run_id: str
    dag_id: str
    state: str
    logical: str
    start: float
    end: float
    now: float
    tasks: list[GanttTask]

    @property
    def live(self) -> bool:
        return self.state not in RUN_TERMINAL


_KIND = {
    "PENDING": "queued",
    "RUNNING": "running",
    "DEFERRED": "deferred",
    "SENSING": "sensing",
    "RETRYING": "retrying",
}
SEGMENT_KINDS = tuple(_KIND.values())


def segments(
    events: Iterable[Row], *, ready: float | None, state: str, ready_at: float | None, now: float
) -> list[Segment]:
    """One task row's segments from its ``transition`` events (oldest first).

    Each stretch between two events is a segment of the state the first one entered; a
    terminal state draws none. Before its first claim the row was PENDING: claimable from
    ``ready`` (when its upstream let it run, see :meth:`RunList.gantt`) until claimed, so
    that stretch is its first ``queued`` segment (none when it ended without a claim). A
    row not yet terminal has an open segment up to ``now`` (a PENDING one only once
    claimable: ``ready_at`` set)."""
    out: list[Segment] = []
    current: str | None = None
    since = 0.0
    attempt: int | None = None
    for e in events:
        ts = float(e["ts"])
        if current is None:
            # Only a claim says the row was claimable before it: a row skipped, marked or
            # failed by its upstream while PENDING may have been waiting for that upstream.
            claimed = e["from_state"] == "PENDING" and e["to_state"] == "RUNNING"
            current = e["from_state"]
            since = min(ready, ts) if claimed and ready is not None else ts
        if current in _KIND and ts > since:
            out.append(Segment(_KIND[current], since, ts, _attempt(current, attempt), False,
                               e["to_state"]))  # fmt: skip
        current, since, attempt = e["to_state"], ts, e["attempt"]
    if current is None:  # never moved: PENDING (or SKIPPED/UPSTREAM_FAILED by its upstream)
        if state == "PENDING" and ready_at is not None and ready_at <= now:
            out.append(Segment("queued", ready_at, now, None, True))
        return out
    if current not in TERMINAL and current in _KIND:
        if current == "PENDING" and ready_at is None:  # cleared, waiting for its upstream
            return out
        out.append(Segment(_KIND[current], since, max(since, now), _attempt(current, attempt),
                           True))  # fmt: skip
    return out


def _attempt(state: str, attempt: int | None) -> int | None:
    return attempt if state == "RUNNING" else None


def _storable(s: str) -> bool:
    if "\x00" in s:
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class RunList(Part):
    """The runs list and a run's Gantt chart: nothing here writes."""

    async def runs_page(
        self,
        which: RunFilter = RunFilter(),
        *,
        limit: int = DEFAULT_PAGE,
        before: Cursor | None = None,
        after: Cursor | None = None,
        dag_ids: bool = False,
    ) -> RunsPage:
        """The runs ``which`` finds, newest first: the first ``limit`` of them, or those
        just older than ``before``, or just newer than ``after`` (one of the two at most).
        One read transaction: the runs, their tasks' counts (and, with ``dag_ids``, every
        catalogued DAG's id) as of one moment."""
        if not 1 <= limit <= MAX_PAGE:
            raise BadFilter("limit", f"between 1 and {MAX_PAGE}")
        if before is not None and after is not None:
            raise BadFilter("after", "give before or after, not both")
        newer_first = after is None
        bound = after or before or Cursor(_TOP, "")
        name = ("runs_older" if newer_first else "runs_newer") + which.walk()
        params = which.params() | {"at": bound.created_at, "id": bound.run_id, "n": limit + 1}
        if len(which.dags) == 1:
            params["dag"] = which.dags[0]
        elif which.dags:
            params["dags"] = list(which.dags)
        async with self.db.read() as tx:
            rows = list(await tx.fetch(name, **params))
            more = len(rows) > limit
            rows = rows[:limit]
            if not newer_first:
                rows.reverse()
            counts: dict[str, dict[str, int]] = defaultdict(dict)
            started: dict[str, float] = {}
            if rows:
                for c in await tx.fetch("runs_task_counts", run_ids=[r["run_id"] for r in rows]):
                    counts[c["run_id"]][c["state"]] = c["n"]
                    if c["started_at"] is not None:
                        first = started.get(c["run_id"], c["started_at"])
                        started[c["run_id"]] = min(first, c["started_at"])
            names = [r["dag_id"] for r in await tx.fetch("runs_dag_ids")] if dag_ids else []
        runs = [
            ListedRun(
                run_id=r["run_id"], dag_id=r["dag_id"], logical_date=r["logical_date"],
                logical=logical_shown(dict(r)), run_type=r["run_type"], run_key=r["run_key"],
                state=r["state"], created_at=r["created_at"], started_at=started.get(r["run_id"]),
                ended_at=r["ended_at"], counts=dict(counts[r["run_id"]]),
            )
            for r in rows
        ]  # fmt: skip
        if newer_first:
            older = runs[-1].cursor if more and runs else None
            newer = (runs[0].cursor if runs else before) if before is not None else None
        else:
            newer = runs[0].cursor if more and runs else None
            older = runs[-1].cursor if runs else after
        return RunsPage(runs, older, newer, self.clock(), names)

    async def gantt(self, run_id: str, instances: int = GANTT_INSTANCES) -> Gantt | None:
        """A run's Gantt chart (None: no such run), read in one transaction: the run, its
        task rows (each mapped task's first ``instances`` instances), its edges, and every
        state change of those rows in one query.

        When a task became claimable is not an event (its ``ready_at`` is cleared when it is
        claimed), so its first wait for a slot is taken to begin when the last of its
        upstream tasks to end before its first claim ended (a mapped instance: its task's
        upstream), or when the run was created for a task with none: exact for the default
        trigger rule (all upstream succeeded), a lower bound of the wait for the others."""
        if not _storable(run_id):
            return None
        async with self.db.read() as tx:
            run = await tx.fetchone("run_info", run_id=run_id)
            if run is None:
                return None
            rows = list(await tx.fetch("gantt_tasks", run_id=run_id, instances=instances))
            events: dict[int, list[Row]] = defaultdict(list)
            for e in await tx.fetch("gantt_events", run_id=run_id, instances=instances):
                events[e["task_row"]].append(e)
            parents: dict[str, list[str]] = defaultdict(list)
            for edge in await tx.fetch("ops_run_edges", run_id=run_id):
                parents[edge["child"]].append(edge["parent"])
        now = self.clock()
        created = float(run["created_at"])
        # When each task's own row reached a terminal state (it may have, more than once, if
        # cleared): what its downstream's first wait for a slot is measured from.
        ends: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            if r["map_index"] < 0:
                ends[r["task_id"]] += [
                    float(e["ts"]) for e in events[r["id"]] if e["to_state"] in TERMINAL
                ]

        def ready(task_id: str, first: list[Row]) -> float:
            claimed = float(first[0]["ts"]) if first else now
            upstream = [t for p in parents.get(task_id, ()) for t in ends[p] if t <= claimed]
            return max([created, *upstream])

        by_task: dict[str, GanttTask] = {}
        for r in rows:
            evs = events[r["id"]]
            row = GanttRow(
                task_id=r["task_id"], map_index=r["map_index"], state=r["state"],
                attempt=r["attempt"], max_attempts=r["max_attempts"],
                segments=segments(evs, ready=ready(r["task_id"], evs), state=r["state"],
                                  ready_at=r["ready_at"], now=now),
                map_total=r["map_total"] if r["map_index"] < 0 else None,
            )  # fmt: skip
            if r["map_index"] < 0:
                by_task[r["task_id"]] = GanttTask(row, [])
            elif r["task_id"] in by_task:
                by_task[r["task_id"]].instances.append(row)
        for t in by_task.values():
            t.instances.sort(key=lambda i: i.map_index)
        tasks = list(by_task.values())
        end = float(run["ended_at"]) if run["ended_at"] is not None else now
        drawn = [s for t in tasks for r in (t.row, *t.instances) for s in r.segments]
        start = min([created, *(s.start for s in drawn)])
        end = max([end, *(s.end for s in drawn)])
        return Gantt(run_id, run["dag_id"], run["state"], logical_shown(dict(run)), start, end, now,
                     tasks)  # fmt: skip


def cursor_or_none(text: str | None, field: str) -> Cursor | None:
    """A cursor from a URL's ``before``/``after`` (None when not given or empty)."""
    return Cursor.parse(text, field) if text else None


def states_of(values: Sequence[str]) -> tuple[str, ...]:
    """Run states as a person may write them (``failed``), in the store's spelling."""
    return tuple(dict.fromkeys(v.strip().upper() for v in values if v.strip()))
