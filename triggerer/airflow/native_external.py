"""The native check for the standard provider's ``DagStateTrigger`` and ``WorkflowTrigger``
(what ``TriggerDagRunOperator`` and ``ExternalTaskSensor`` defer on, provider 1.21.0).

The provider's AF3 ``run()`` asks the Task SDK for a count every interval
(``get_dr_count``, ``get_ti_count``): one Execution API call per row per interval, answered
one at a time (:mod:`.comms`). Here every group waiting on DAG runs or task instances is
answered by ONE read per moment: the groups check on a grid of their interval (as the S3
checks do), the requests due together are gathered for :data:`GATHER_S` and read in one
statement in a thread, through Airflow's ORM (``dag_run`` rows by ``(dag_id, run_id)`` or
``(dag_id, logical_date)``, ``task_instance`` counts by run, task and state), and each group's
count is computed from it in Python with the semantics of the routes the SDK calls
(``get_dr_count``, ``get_task_instance_count``). Same answer: the routes run the same
filters as one ``count(*)`` each over the same tables, and every task instance has its run's
``logical_date``; one statement also reads every group's runs and tasks at one moment.

The events are the provider's: ``WorkflowTrigger`` yields ``{"status": "failed"}`` when a
``failed_states`` count is above zero, else ``{"status": "skipped"}`` for ``skipped_states``,
else ``{"status": "success"}`` once the ``allowed_states`` count equals
``len(run_ids or logical_dates)`` (with ``external_task_ids``, the task instance count over
``len(external_task_ids)``); ``DagStateTrigger`` yields ``(classpath, serialize() data +
{run_ids[0]: its state})`` once the count of its runs in ``states`` is ``len(run_ids)``, the
state from the same read, of the type the Task SDK's ``get_dagrun_state`` returns (no
Execution API call at all).

What goes through the adapter (:func:`external_key` says None): a kwarg the provider's
``serialize()`` does not write or a value of a type it would not send, a
``DagStateTrigger`` without a non-empty ``run_ids`` list (its AF3 ``run()`` never returns
without one), a ``WorkflowTrigger`` with ``external_task_group_id`` (its tasks come from the
DAG bag) or with neither ``run_ids`` nor ``logical_dates``. The database unreachable is
retried with backoff (logged at most once a minute) and fails nothing.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any

from triggers.airflow import airflow_trigger_class
from triggers.base import TransientError
from triggers.context import to_thread
from triggers.registry import in_import_thread

from .grid import SAY_EVERY_S, back_off, next_point

log = logging.getLogger("slotless.airflow")

MODULE = "airflow.providers.standard.triggers.external_task"
DAGSTATE = f"{MODULE}.DagStateTrigger"
SDK_STATES = "airflow.sdk.api.datamodels._generated"  # the Task SDK's DagRunState
WORKFLOW = f"{MODULE}.WorkflowTrigger"
# What each class's serialize() writes under Airflow 3 (DagStateTrigger takes no others).
DAGSTATE_KWARGS = frozenset({"dag_id", "states", "run_ids", "execution_dates", "poll_interval"})
WORKFLOW_KWARGS = frozenset(
    {
        "external_dag_id",
        "run_ids",
        "logical_dates",
        "execution_dates",
        "external_task_ids",
        "external_task_group_id",
        "failed_states",
        "skipped_states",
        "allowed_states",
        "poke_interval",
        "soft_fail",
    }
)
GATHER_S = 0.02  # requests due within this long of the first are one read
RUNS_PER_STATEMENT = 5_000  # run keys bound per statement (PostgreSQL binds 65,535 at most)

Key = tuple[Any, ...]
Names = tuple[str, ...]


@dataclass(frozen=True)
class Need:
    """What one group reads: runs of one DAG (by run id, or by logical date when it names
    no run id) and, to count task instances, which tasks."""

    dag_id: str
    run_ids: Names | None  # the routes' ``run_ids IN`` filter; None: not given
    dates: tuple[datetime, ...] | None  # ``logical_date IN``, UTC; None: not given
    task_ids: Names | None  # None: the dag-run count


@dataclass
class Seen:
    """One read: the runs found, and their task instances counted by task and state."""

    runs: dict[str, dict[str, tuple[datetime | None, str | None]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    by_date: dict[tuple[str, datetime], list[str]] = field(
        default_factory=lambda: defaultdict(list)
    )
    tis: dict[tuple[str, str], dict[str, Counter[str | None]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Counter))
    )

    def add_run(self, dag_id: str, run_id: str, date: datetime | None, state: Any) -> None:
        date = None if date is None else _utc(date)
        self.runs[dag_id][run_id] = (date, _text(state))
        if date is not None:
            self.by_date[(dag_id, date)].append(run_id)

    def add_tis(self, dag_id: str, run_id: str, task_id: str, state: Any, n: int) -> None:
        self.tis[(dag_id, run_id)][task_id][_text(state)] += n


# -- which rows are native, and their keys -----------------------------------------------


def external_key(classpath: str, kwargs: dict[str, Any]) -> Key | None:
    """The row's key, or None: the native check would not do exactly what the provider's
    AF3 ``run()`` does, and the row runs through the adapter."""
    if classpath == DAGSTATE and set(kwargs) <= DAGSTATE_KWARGS:
        return _dagstate_key(kwargs)
    if classpath == WORKFLOW and set(kwargs) <= WORKFLOW_KWARGS:
        return _workflow_key(kwargs)
    return None


def _dagstate_key(kw: dict[str, Any]) -> Key | None:
    # Its event echoes every kwarg (serialize()), so the key keeps each as written.
    dag_id, states, run_ids = kw.get("dag_id"), kw.get("states"), kw.get("run_ids")
    dates, every = kw.get("execution_dates"), kw.get("poll_interval", 5.0)
    if not (isinstance(dag_id, str) and dag_id and _strs(run_ids, list) and run_ids):
        return None
    if "states" not in kw:  # required by its constructor: the adapter fails it as Airflow
        return None
    if not (states is None or _strs(states, list)) or not _positive(every):
        return None
    if not (dates is None or (isinstance(dates, list) and all(map(_aware, dates)))):
        return None
    shown = None if dates is None else tuple(d.isoformat() for d in dates)
    states_t = None if states is None else tuple(states)
    # json: 5 and 5.0 are one interval but not one payload.
    return ("dagstate", dag_id, tuple(run_ids), states_t, shown, json.dumps(every))


def _workflow_key(kw: dict[str, Any]) -> Key | None:
    dag_id, run_ids, dates = kw.get("external_dag_id"), kw.get("run_ids"), kw.get("logical_dates")
    tasks = kw.get("external_task_ids")
    if not isinstance(dag_id, str) or not dag_id or kw.get("external_task_group_id") is not None:
        return None
    if kw.get("execution_dates") is not None or not isinstance(kw.get("soft_fail", False), bool):
        return None
    if not _positive(kw.get("poke_interval", 2.0)) or not (run_ids is None or _strs(run_ids, list)):
        return None
    if not (dates is None or (isinstance(dates, list) and all(map(_aware, dates)))):
        return None
    if not (run_ids or dates) or not (tasks is None or _strs(tasks, list, tuple, set, frozenset)):
        return None
    states = [kw.get(k) for k in ("failed_states", "skipped_states", "allowed_states")]
    if not all(s is None or _strs(s, list, tuple, set, frozenset) for s in states):
        return None
    # Sorted, duplicates kept (the provider divides by len(ids) and compares with len(runs)).
    return (
        "workflow",
        dag_id,
        tuple(sorted(run_ids)) if run_ids else None,
        tuple(sorted(_utc(d).isoformat() for d in dates)) if dates else None,
        tuple(sorted(tasks)) if tasks else None,
        *(tuple(sorted(set(s))) if s else None for s in states),
    )


def interval(key: Key, rows: Iterable[dict[str, Any]]) -> float:
    """How often the group checks: a DagStateTrigger's ``poll_interval`` (in its key), or
    the shortest ``poke_interval`` among a WorkflowTrigger's rows (the provider's 2 s when
    absent)."""
    if key[0] == "dagstate":
        return float(json.loads(key[5]))
    return min((float(r.get("poke_interval", 2.0)) for r in rows), default=2.0)


@lru_cache(maxsize=65_536)  # asked at each check of each group
def need(key: Key) -> Need:
    """What the group with this key reads."""
    if key[0] == "dagstate":
        _, dag_id, run_ids, _, shown, _ = key
        dates = tuple(_utc(datetime.fromisoformat(d)) for d in shown) if shown else None
        return Need(dag_id, run_ids, dates, None)
    _, dag_id, run_ids, shown, tasks, *_ = key
    dates = tuple(_utc(datetime.fromisoformat(d)) for d in shown) if shown else None
    return Need(dag_id, run_ids, dates, tasks)


# -- the routes' counts, from one read ---------------------------------------------------


def dr_count(seen: Seen, n: Need, states: Iterable[str] | None) -> int:
    """``get_dr_count``: the runs of ``n.dag_id`` with a logical date among ``n.dates`` if
    given, a run id among ``n.run_ids`` if given, a state among ``states`` if given."""
    wanted = set(states) if states else None
    return sum(1 for _, _, state in _runs(seen, n) if wanted is None or state in wanted)


def ti_count(seen: Seen, n: Need, states: Iterable[str] | None) -> int:
    """``get_task_instance_count``: the task instances (every map index) of ``n.task_ids``
    in those runs, in ``states`` if given, where ``"null"`` means no state."""
    tasks = set(n.task_ids or ())
    wanted: set[str | None] | None = set(states) if states else None
    if wanted is not None and "null" in wanted:
        wanted = (wanted - {"null"}) | {None}
    total = 0
    for run_id, _, _ in _runs(seen, n):
        for task_id, by_state in seen.tis.get((n.dag_id, run_id), {}).items():
            if task_id in tasks:
                total += sum(c for s, c in by_state.items() if wanted is None or s in wanted)
    return total


def _runs(seen: Seen, n: Need) -> list[tuple[str, datetime | None, str | None]]:
    found = seen.runs.get(n.dag_id, {})
    dates = set(n.dates) if n.dates else None
    if n.run_ids:
        ids: Iterable[str] = set(n.run_ids)
    else:
        ids = {r for d in dates or () for r in seen.by_date.get((n.dag_id, d), ())}
    out = []
    for run_id in ids:
        if run_id in found:
            date, state = found[run_id]
            if dates is None or date in dates:
                out.append((run_id, date, state))
    return out


def workflow_status(key: Key, seen: Seen) -> str | None:
    """The WorkflowTrigger's AF3 ``run()`` on one read: "failed", "skipped", "success", or
    None (not yet)."""
    _, _, run_ids, dates, tasks, failed, skipped, allowed = key
    n = need(key)

    def count(states: Names | None) -> int:
        if tasks:
            return int(ti_count(seen, n, states) / len(tasks))
        return dr_count(seen, n, states)

    if failed and count(failed) > 0:
        return "failed"
    if skipped and count(skipped) > 0:
        return "skipped"
    return "success" if count(allowed) == len(run_ids or dates or ()) else None


def dagstate_state(key: Key, seen: Seen) -> str | None:
    """DagStateTrigger's AF3 ``run()`` on one read: once its runs are all in ``states``,
    the state of its first run (what ``get_dagrun_state`` reads), else None."""
    _, dag_id, run_ids, states, _, _ = key
    if dr_count(seen, need(key), states) != len(run_ids):
        return None
    state = seen.runs[dag_id][run_ids[0]][1]
    if state is None:  # the route's answer would not validate: the provider's run() fails
        raise ValueError(f"Dag run {dag_id!r} {run_ids[0]!r} has no state")
    return state


# -- one read per moment -------------------------------------------------------------------


@dataclass(eq=False)
class _Batch:
    needs: set[Need] = field(default_factory=set)
    done: asyncio.Future[Seen] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    task: asyncio.Task[None] | None = None


@dataclass
class ExternalNative:
    """The process's native external checks: the reads they share."""

    # Needs -> one read; Airflow's ORM by default, a test's own.
    reader: Callable[[list[Need]], Seen] | None = None
    reads: int = 0  # reads made (each one statement, or one per RUNS_PER_STATEMENT runs)
    _next: _Batch | None = None  # the read gathering requests, not begun
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one read at a time
    _said: float = -SAY_EVERY_S

    async def wait(
        self,
        key: Key,
        decide: Callable[[Key, Seen], Any],
        interval: Callable[[], float],
        on_check: Callable[[str], None],
    ) -> Any:
        """``decide``'s first answer that is not None, checked once per grid point of
        ``interval`` on a read shared with every request due then."""
        n = need(key)
        failures = 0
        while True:
            every = interval()
            try:
                seen = await self.read(n)
            except TransientError as exc:
                failures += 1
                on_check(f"retrying: {exc}")
                await back_off(every, failures)
                continue
            failures = 0
            found = decide(key, seen)
            on_check("found" if found is not None else "not yet")
            if found is not None:
                return found
            await next_point(every)

    async def read(self, n: Need) -> Seen:
        """The next read that has not begun, with ``n`` in it: never one begun earlier."""
        batch = self._next
        if batch is None:
            batch = self._next = _Batch()
            batch.task = asyncio.create_task(self._run(batch), name="airflow external read")
        batch.needs.add(n)
        # Shielded: a group leaving (its task instances cleared) does not stop the others'.
        return await asyncio.shield(batch.done)

    async def _run(self, batch: _Batch) -> None:
        # Retrieved even when every waiter has left, so asyncio does not warn of it.
        batch.done.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.sleep(GATHER_S)
            async with self._lock:
                if self._next is batch:
                    self._next = None  # later requests gather for the next read
                self.reads += 1
                seen = await to_thread(self.reader or read_airflow, list(batch.needs))
        except TransientError as exc:
            if time.monotonic() - self._said >= SAY_EVERY_S:
                self._said = time.monotonic()
                log.warning("reading Airflow's dag runs failed (%s); retrying", exc)
            batch.done.set_exception(exc)
        except asyncio.CancelledError:
            batch.done.cancel()
            raise
        except Exception as exc:  # not the database away: the groups fail with it
            batch.done.set_exception(exc)
        else:
            batch.done.set_result(seen)


def read_airflow(needs: list[Need]) -> Seen:
    """One read through Airflow's ORM: the runs every need names, and the task instances of
    the tasks they count there, by state, in one statement (a UNION ALL). Blocking."""
    from sqlalchemy.exc import InterfaceError, OperationalError  # type: ignore[import-not-found]
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    seen = Seen()
    try:
        for piece in _pieces(needs):
            _read_piece(piece, seen)
    except (OperationalError, InterfaceError, PoolTimeout, OSError) as exc:
        lines = str(exc).strip().splitlines()
        raise TransientError(f"{type(exc).__name__}: {lines[0][:300] if lines else ''}") from None
    return seen


def _pieces(needs: list[Need]) -> list[list[Need]]:
    pieces: list[list[Need]] = [[]]
    size = 0
    for n in needs:
        runs = len(n.run_ids or n.dates or ())
        if pieces[-1] and size + runs > RUNS_PER_STATEMENT:
            pieces.append([])
            size = 0
        pieces[-1].append(n)
        size += runs
    return pieces


def _read_piece(needs: list[Need], seen: Seen) -> None:
    from airflow.models import DagRun, TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import (  # type: ignore[import-not-found]
        String,
        and_,
        func,
        literal,
        null,
        or_,
        select,
        tuple_,
        union_all,
    )

    by_id = sorted({(n.dag_id, r) for n in needs if n.run_ids for r in n.run_ids})
    by_date = sorted({(n.dag_id, d) for n in needs if not n.run_ids for d in n.dates or ()})
    where = []
    if by_id:
        where.append(tuple_(DagRun.dag_id, DagRun.run_id).in_(by_id))
    if by_date:
        where.append(tuple_(DagRun.dag_id, DagRun.logical_date).in_(by_date))
    runs = select(
        literal("run").label("kind"),
        DagRun.dag_id,
        DagRun.run_id,
        DagRun.logical_date,
        null().cast(String).label("task_id"),
        DagRun.state.label("state"),
        literal(1).label("n"),
    ).where(or_(*where))
    parts = [runs]
    tasks = sorted({(n.dag_id, t) for n in needs if n.task_ids for t in n.task_ids})
    if tasks:
        ti = TaskInstance
        parts.append(
            select(
                literal("ti"),
                ti.dag_id,
                ti.run_id,
                DagRun.logical_date,
                ti.task_id,
                ti.state,
                func.count(),
            )
            .join(DagRun, and_(DagRun.dag_id == ti.dag_id, DagRun.run_id == ti.run_id))
            .where(or_(*where), tuple_(ti.dag_id, ti.task_id).in_(tasks))
            .group_by(ti.dag_id, ti.run_id, DagRun.logical_date, ti.task_id, ti.state)
        )
    statement = union_all(*parts) if len(parts) > 1 else runs
    with create_session() as session:
        rows = session.execute(statement).all()
    for kind, dag_id, run_id, date, task_id, state, count in rows:
        if kind == "run":
            seen.add_run(dag_id, run_id, date, state)
        else:
            seen.add_tis(dag_id, run_id, task_id, state, count)


async def external_events(
    ext: ExternalNative,
    key: Key,
    kwargs: dict[str, Any],
    interval: Callable[[], float],
    on_check: Callable[[str], None],
) -> AsyncGenerator[Any, None]:
    """The provider's event, once its condition holds on a shared read."""
    from airflow.triggers.base import TriggerEvent

    if key[0] == "workflow":
        status = await ext.wait(key, workflow_status, interval, on_check)
        yield TriggerEvent({"status": status})
        return
    state = await ext.wait(key, dagstate_state, interval, on_check)
    cls = await in_import_thread(MODULE, partial(airflow_trigger_class, DAGSTATE))
    classpath, data = cls(**kwargs).serialize()
    # As the provider: {its first run id: that run's state}, the state from the read that
    # found the count (what the route get_dagrun_state reads), as the Task SDK's
    # DagRunState, the type the provider's get_dagrun_state returns.
    sdk_state = await in_import_thread(SDK_STATES, partial(importlib.import_module, SDK_STATES))
    data.update({kwargs["run_ids"][0]: sdk_state.DagRunState(state)})
    yield TriggerEvent((classpath, data))


def _utc(d: datetime) -> datetime:
    """An aware datetime as a plain UTC ``datetime`` (pendulum's compare and hash alike)."""
    u = d.astimezone(UTC)
    return datetime(u.year, u.month, u.day, u.hour, u.minute, u.second, u.microsecond, UTC)


def _text(state: Any) -> str | None:
    # A str Enum hashes by its name: as its value, so it is found in a set of strings.
    return None if state is None else str(getattr(state, "value", state))


def _aware(d: Any) -> bool:
    return isinstance(d, datetime) and d.tzinfo is not None and d.utcoffset() is not None


def _strs(value: Any, *kinds: type[Iterable[Any]]) -> bool:
    """``value`` is one of ``kinds`` (collections) holding only plain strings (what the
    SDK's messages take as ``list[str]``; a str Enum would hash unlike its value)."""
    return isinstance(value, kinds) and all(type(v) is str for v in value)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0
