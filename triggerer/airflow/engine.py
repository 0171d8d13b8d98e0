"""The engine: Airflow's trigger rows in, one check per distinct wait, outcomes back out.

Three loops on one event loop, each touching Airflow's database only in a thread:

- assigning: every ``interval`` s, take triggers (``assign_unassigned``), read the rows
  new since the last whole listing, load them (``bulk_fetch``, decrypted), and
  ``clean_unused``, as Airflow's triggerer does each second; every :data:`LIST_ALL_S`, list
  every row (``ids_for_triggerer``) and drop the ones no longer held;
- submitting: an outcome is written as soon as its check finds it (what ``submit_event``
  / ``submit_failure`` do, for every trigger id in the check's group, batched:
  :mod:`.submitting`);
- heartbeating: the Job's heartbeat, every :data:`.owners.BEAT_S`, reading the other
  slotless instances' Job rows with it; when the live ones change, a cycle runs at once
  (a killed instance's conditions are taken over without waiting for the next one). It
  is scheduled from the event loop, so a loop blocked by a trigger stops it, and Airflow
  hands our triggers to a healthy triggerer, as it does when its own runner deadlocks.

Several instances: each cycle sees every row held by a slotless instance of its pool (its
own and the others'), and checks the conditions it owns among the live instances
(:mod:`.owners`), for every row waiting on them wherever Airflow assigned the row.

A group is the rows equal in what they wait for (:mod:`.plans`); its check runs once
however many task instances wait on it. A task instance's row leaves its group when the
check fires (its outcome is submitted); an asset watcher's row stays, as in Airflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from triggers.airflow import airflow_events, airflow_trigger_class
from triggers.context import to_thread
from triggers.registry import in_import_thread

from . import (
    comms,
    native_external,
    native_files,
    native_s3,
    native_sftp,
    native_time,
    owners,
    tasklogs,
)
from .plans import Plan, plan, poke_interval
from .rows import AirflowRows, Outcome, Row, in_batches
from .tasklogs import TaskLogs

log = logging.getLogger("slotless.airflow")

# Trigger ids written per transaction (rows.in_batches, then submitting.write): about
# 0.3 ms each batched, so a transaction of this many holds its row locks for 20-40 ms and a
# burst's first task instances leave DEFERRED while the rest are written; larger ones
# measured no faster (1,000 ids: 0.37 s in tens of 100, 0.34 s as one).
SUBMIT_IDS = 100

# Seconds between two listings of every row held by the pool (see Engine._cycle).
LIST_ALL_S = 10.0
OWN_SLICE = 1_000  # rows joined or left between two yields to the loop (Engine._own)

RECENT = 50  # outcomes kept for `slotless status --airflow`
TASKS_SHOWN = 5  # task instances named per outcome there
TASKLOG_EVERY_S = 0.5  # how often queued trigger-log lines are written


def _payload(event: Any) -> str:
    """An event as said in the task's log: Airflow's TriggerEvent payload, clipped."""
    text = repr(getattr(event, "payload", event))
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass(eq=False)
class Group:
    """Rows equal in what they wait for, and the one check that serves them all."""

    plan: Plan
    classpath: str
    kwargs: dict[str, Any]
    rows: dict[int, Row] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    events: int = 0
    # For `slotless status --airflow`: when this instance started checking it, and its
    # last native check (epoch s) with what that check found.
    started: float = field(default_factory=time.time)
    last_check: float | None = None
    last_result: str | None = None

    def describe(self) -> str:
        return f"{self.classpath.rsplit('.', 1)[-1]} {self.plan.key[1:]!r}"


class Engine:
    def __init__(self, rows: AirflowRows, *, interval: float = 1.0) -> None:
        self.rows = rows
        self.interval = interval
        self.job_id: int | None = None
        self.groups: dict[Any, Group] = {}
        self.member: dict[int, Group] = {}  # trigger id -> the group checking for it
        # Every row held by a slotless instance of this pool, loaded (id -> row, its plan);
        # the ones whose condition this instance owns are in groups.
        self.known: dict[int, tuple[Row, Plan]] = {}
        self.assigned: set[int] = set()  # what Airflow assigns to this instance's Job
        self.live: list[int] = []  # the slotless instances checking conditions now
        self.wake = asyncio.Event()  # a cycle at once: the live instances changed
        # When the rows of every instance were last listed whole (monotonic), and the
        # newest id then: the cycles in between read only the rows above it.
        self._listed_all_at = -math.inf
        self._watermark = 0
        self._rejoin: set[int] = set()  # rows whose check ended while they still wait
        # Each condition's owner among ``live`` (cleared when they change): a cycle looks
        # every held row up, and hashing each one each cycle would cost the loop.
        self._owners: dict[Any, int | None] = {}
        # Trigger ids whose outcome is found (submitted or about to be): not loaded again
        # while Airflow still lists them as ours, before clean_unused removes their rows.
        self.done: set[int] = set()
        self.outbox: asyncio.Queue[Outcome] = asyncio.Queue()
        self.stopping = asyncio.Event()
        self.checks: Counter[str] = Counter()  # native checks made, by kind
        # Conditions checked at least once since the start (held and looked at).
        self.first_checks = 0
        # The native FileTrigger checks of literal paths: by directory, pushed by inotify.
        self.files = native_files.FileHub()
        self.timers = native_time.TimeHub()  # every native DateTimeTrigger's one timer
        # The native S3 checks' clients (one per connection, closed at the stop) and the
        # listings they share.
        self.s3 = native_s3.S3Native()
        self.sftp = native_sftp.SFTPNative()  # likewise: a link per SFTP connection
        # The native DagStateTrigger / WorkflowTrigger checks' shared reads of Airflow's runs.
        self.external = native_external.ExternalNative()
        self.submitted: Counter[str] = Counter()  # "event" / "failure", per trigger id
        self.cycles = 0
        self._classes: dict[str, type] = {}
        # The last outcomes found here, newest last, for `slotless status --airflow`.
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.tasklogs = TaskLogs()

    # -- the loops -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until :meth:`stop`; then the checks end, what they found is written, and
        the Job ends."""
        self.job_id = await to_thread(self.rows.start_job)
        log.info("slotless airflow-triggerer started as TriggererJob %s", self.job_id)
        self.tasklogs.job_id = self.job_id
        loops = [
            asyncio.create_task(self._assigning()),
            asyncio.create_task(self._submitting()),
            asyncio.create_task(
                self._every(owners.BEAT_S / 2, self._heartbeat, "the Job's heartbeat")
            ),
            asyncio.create_task(
                self._every(TASKLOG_EVERY_S, self.tasklogs.flush, "writing trigger logs")
            ),
        ]
        try:
            await self.stopping.wait()
        finally:
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._stop_groups()
            with contextlib.suppress(Exception):
                await self.files.close()
            with contextlib.suppress(Exception):
                await self.timers.close()
            with contextlib.suppress(Exception):
                await self.s3.close()
            with contextlib.suppress(Exception):
                await self.sftp.close()
            await self._flush()
            with contextlib.suppress(Exception):
                await self.tasklogs.flush()
            await to_thread(self.rows.end_job)
            log.info("slotless airflow-triggerer stopped (TriggererJob %s ended)", self.job_id)

    def stop(self) -> None:
        self.stopping.set()

    async def _every(self, seconds: float, step: Callable[[], Any], what: str) -> None:
        # When a failure was last said: a step run 4 times a second must not fill the log
        # while the database is away (said at first, then each minute).
        said: float | None = None
        while not self.stopping.is_set():
            try:
                await step()
                said = None
            except Exception as exc:
                # The database gone for a while: said, and tried again; the process stays.
                if said is None or time.monotonic() - said >= 60.0:
                    said = time.monotonic()
                    log.warning("%s failed (%s); trying again", what, first_line(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _assigning(self) -> None:
        """A cycle every ``interval``; at once again while a cycle took as many new rows as
        Airflow lets one query take (``[triggerer] max_trigger_to_select_per_loop``): a
        burst of deferred tasks is taken in a few quick cycles, not one batch a second."""
        while not self.stopping.is_set():
            more = False
            try:
                more = await self._cycle()
            except Exception as exc:
                log.warning("assigning triggers failed (%s); trying again", first_line(exc))
            if more:
                continue
            self.wake.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self.stopping, self.wake)]
            try:
                await asyncio.wait(waits, timeout=self.interval, return_when="FIRST_COMPLETED")
            finally:
                for w in waits:
                    w.cancel()

    async def _heartbeat(self) -> None:
        peers = await to_thread(self.rows.heartbeat)
        live = self._live(peers, time.time())
        if live != self.live:
            self.wake.set()

    async def _cycle(self) -> bool:
        """One cycle; True when it took a full batch of new rows (more may be waiting).

        Every :data:`LIST_ALL_S` (and first) the rows of every instance are listed whole:
        rows gone since (resumed elsewhere, cleared) are forgotten then, and rows handed
        to the pool with an old id (an Airflow triggerer's, taken over) are found. In
        between, only the rows above the newest id of that listing are read: a cycle
        costs the rows new since, not the 100,000 held (listing those each second was a
        third of a core)."""
        began = time.monotonic()
        full = began - self._listed_all_at >= LIST_ALL_S
        seen = await to_thread(self.rows.cycle, None if full else self._watermark)
        held = seen.held.keys()
        if seen.full:
            self._listed_all_at = began
            self._watermark = max(held, default=0)
            for tid in [t for t in self.known if t not in held]:
                self._forget(tid)
            self.done &= held
            self.assigned = {t for t, job in seen.held.items() if job == self.job_id}
        else:
            self.assigned.update(t for t, job in seen.held.items() if job == self.job_id)
        new = held - self.known.keys() - self.done
        live = self._live(seen.peers, seen.now)
        moved = live != self.live
        if moved:
            log.info("slotless instances checking conditions: TriggererJobs %s", live)
            self.live = live
            self._owners.clear()
        elif len(self._owners) > 2 * len(self.known) + 1024:
            self._owners.clear()  # the keys of conditions long gone
        added: list[int] = []
        if new:
            loaded, bad, gone = await to_thread(self.rows.load, new)
            self.done |= gone
            for outcome in bad:
                if self._owner(outcome.key) in (self.job_id, None):
                    log.warning("trigger %s failed: %s", outcome.names, outcome.error)
                    self.done.update(outcome.ids)
                    self.outbox.put_nowait(outcome)
            for row in loaded:
                if row.id not in self.known and row.id not in self.done:
                    self.known[row.id] = (row, plan(row.classpath, row.kwargs))
                    added.append(row.id)
        # Who checks what changes only with the live instances, or for rows new here (or
        # whose check ended while they still wait: an asset watcher's).
        rejoin, self._rejoin = self._rejoin, set()
        await self._own(list(self.known) if moved or seen.full else [*added, *rejoin])
        await to_thread(self.rows.clean_unused)
        self.cycles += 1
        return len(new) >= self.rows.select_limit

    def _live(self, peers: list[owners.Peer], now: float) -> list[int]:
        """The instances checking conditions now, this one always among them while it runs.

        Its own beat read late (its loop or the database slow for a moment) must not make
        it drop every condition it checks and take them all back a beat later: seen with
        19,000 rows, dropped and joined again every two seconds, a core busy doing only
        that, its loop stalled by it, and so its beat late again. The others still stop
        counting it while its beat is late and check its conditions meanwhile; the trigger
        rows' lock in :meth:`.rows.AirflowRows.submit` keeps each row's outcome single."""
        live = set(owners.candidates(peers, now))
        if self.job_id is not None:
            live.add(self.job_id)
        return sorted(live)

    async def _own(self, tids: list[int]) -> None:
        """Check the conditions this instance owns among the live ones, for every row
        waiting on them (of ``tids``); leave the ones another instance owns now.

        Yields to the loop every :data:`OWN_SLICE` rows: joining 50,000 rows (a task and
        a log line each) in one pass stopped the loop for seconds."""
        for i, tid in enumerate(tids):
            if i % OWN_SLICE == OWN_SLICE - 1:
                await asyncio.sleep(0)
            held = self.known.get(tid)
            if held is None:
                continue
            row, p = held
            mine = self._owner(p.key) == self.job_id
            if mine and tid not in self.member:
                self._join(row, p)
            elif not mine and tid in self.member:
                self._leave(tid)

    def _owner(self, key: Any) -> int | None:
        if key not in self._owners:
            self._owners[key] = owners.owner(key, self.live)
        return self._owners[key]

    def _forget(self, tid: int) -> None:
        """No slotless instance of the pool holds it any more (resumed, cleared, or taken
        by another kind of triggerer)."""
        self.known.pop(tid, None)
        if tid in self.member:
            self._leave(tid)

    async def _submitting(self) -> None:
        while True:
            pending = [await self.outbox.get()]
            while not self.outbox.empty():
                pending.append(self.outbox.get_nowait())
            for batch in in_batches(pending, SUBMIT_IDS):
                await self._submit(batch)

    async def _submit(self, batch: list[Outcome]) -> None:
        while True:
            try:
                skipped = await to_thread(self.rows.submit, batch)
            except Exception as exc:
                log.warning(
                    "submitting %d outcomes failed (%s); again in 1 s", len(batch), first_line(exc)
                )
                await asyncio.sleep(1.0)
                continue
            for o in batch:
                if any(o is s for s in skipped):
                    # Another instance checks this condition now: its rows are loaded
                    # again, and checked wherever they are owned.
                    log.info("not written, another instance checks it now: %s", ", ".join(o.names))
                    for tid in o.ids:
                        self.done.discard(tid)
                        self.known.pop(tid, None)
                    continue
                self.submitted["failure" if o.error is not None else "event"] += o.written
            return

    async def _flush(self) -> None:
        """What was found before the stop is still written (the rows would be checked
        again by the next triggerer otherwise: no loss, but a second event)."""
        batch: list[Outcome] = []
        while not self.outbox.empty():
            batch.append(self.outbox.get_nowait())
        if batch:
            with contextlib.suppress(Exception):
                await to_thread(self.rows.submit, batch)

    # -- groups ----------------------------------------------------------------------

    def _join(self, row: Row, p: Plan) -> None:
        group = self.groups.get(p.key)
        if group is None:
            group = Group(p, row.classpath, row.kwargs)
            self.groups[p.key] = group
            group.task = asyncio.create_task(self._check(group), name=f"airflow {row.name}")
        group.rows[row.id] = row
        self.member[row.id] = group
        self.tasklogs.add(
            row.log_path,
            "info",
            f"slotless airflow-triggerer (TriggererJob {self.job_id}) checks this task's "
            f"trigger {row.id}: {group.describe()}, one check for every task instance "
            f"waiting on it ({len(group.rows)} so far)",
        )

    def _leave(self, tid: int) -> None:
        """Not ours any more (its task instance was cleared, or another triggerer took it)."""
        group = self.member.pop(tid)
        group.rows.pop(tid, None)
        if not group.rows:
            self._drop(group)

    def _drop(self, group: Group) -> None:
        if self.groups.get(group.plan.key) is group:
            del self.groups[group.plan.key]
        if group.task is not None and group.task is not asyncio.current_task():
            group.task.cancel()

    async def _stop_groups(self) -> None:
        tasks = [g.task for g in self.groups.values() if g.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.groups.clear()
        self.member.clear()

    async def _check(self, group: Group) -> None:
        try:
            async with contextlib.aclosing(self._events(group)) as events:
                async for event in events:
                    self._fired(group, event)
                    if not group.rows:
                        return
            if group.rows and group.events == 0:
                self._failed(group, f"Trigger {group.classpath} exited without sending an event")
        except asyncio.CancelledError:
            raise
        except (native_s3.S3Failed, native_sftp.SFTPFailed) as exc:
            # Its one line, not this process's stack, is what the task's failure says.
            self._failed(group, type(exc)(str(exc)))
        except Exception as exc:
            self._failed(group, exc)
        finally:
            # Rows still here (an asset watcher's, after its run() ended) join a check
            # again at the next cycle: a watcher keeps watching, as in Airflow.
            for tid in list(group.rows):
                self.member.pop(tid, None)
                self._rejoin.add(tid)
            self._drop(group)

    def _fired(self, group: Group, event: Any) -> None:
        group.events += 1
        group.last_check, group.last_result = time.time(), "fired"
        ids = list(group.rows)
        names = [r.name for r in group.rows.values()]
        said = f"{group.describe()} fired: event {_payload(event)}"
        for row in group.rows.values():
            self.tasklogs.add(row.log_path, "info", said)
        for tid in [t for t, r in group.rows.items() if r.for_task]:
            del group.rows[tid]
            self.member.pop(tid, None)
            self.known.pop(tid, None)
            self.done.add(tid)
        log.info("%s fired for %d trigger(s): %s", group.describe(), len(ids), ", ".join(names))
        self._recent(group, "event", names, said)
        self.outbox.put_nowait(Outcome(ids, event=event, names=names, key=group.plan.key))

    def _failed(self, group: Group, error: BaseException | str) -> None:
        ids = list(group.rows)
        names = [r.name for r in group.rows.values()]
        said = f"{group.describe()} failed: {error}"
        for row in group.rows.values():
            self.tasklogs.add(row.log_path, "error", said)
        for tid in ids:
            self.member.pop(tid, None)
            self.known.pop(tid, None)
            self.done.add(tid)
        group.rows.clear()
        group.last_check, group.last_result = time.time(), "failed"
        log.warning("%s failed for %s: %s", group.describe(), ", ".join(names), error)
        self._recent(group, "failure", names, said)
        self.outbox.put_nowait(Outcome(ids, error=error, names=names, key=group.plan.key))

    def _recent(self, group: Group, outcome: str, names: list[str], said: str) -> None:
        self.recent.append(
            {
                "at": time.time(),
                "outcome": outcome,
                "check": group.describe(),
                "classpath": group.classpath,
                "trigger_count": len(names),
                "tasks": names[:TASKS_SHOWN],
                "said": said,
            }
        )

    def _events(self, group: Group) -> AsyncGenerator[Any, None]:
        if group.plan.kind == "file":
            _, path, recursive = group.plan.key
            return native_files.file_events(
                self.files,
                path,
                recursive,
                functools.partial(self._file_interval, group),
                functools.partial(self._native_check, group, "file"),
            )
        if group.plan.kind == "s3":
            return native_s3.key_events(
                self.s3,
                group.plan.key,
                functools.partial(self._file_interval, group),
                functools.partial(self._native_check, group, "s3"),
                functools.partial(self._adapted, group),
            )
        if group.plan.kind == "sftp":
            return native_sftp.sftp_events(
                self.sftp,
                group.plan.key,
                group.kwargs,
                functools.partial(self._file_interval, group),
                functools.partial(self._native_check, group, "sftp"),
                functools.partial(self._adapted, group),
            )
        if group.plan.kind == "external":
            return native_external.external_events(
                self.external,
                group.plan.key,
                group.kwargs,
                lambda: native_external.interval(
                    group.plan.key, (r.kwargs for r in group.rows.values())
                ),
                functools.partial(self._native_check, group, "external"),
            )
        if group.plan.kind == "time":
            end = bool(group.plan.key[2])
            return native_time.time_events(self.timers, group.kwargs["moment"], end)
        return self._adapted(group)

    def _file_interval(self, group: Group) -> float:
        """A file's or an S3 key's check: the shortest ``poke_interval`` of its rows."""
        return min((poke_interval(r.kwargs) for r in group.rows.values()), default=5.0)

    def _native_check(self, group: Group, kind: str, result: str = "no match yet") -> None:
        self.checks[kind] += 1
        if group.last_check is None:
            self.first_checks += 1
        # Said before the event is yielded: a check that finds its condition fires at once
        # (and its result becomes "fired"), so a result kept here is one that found nothing.
        group.last_check, group.last_result = time.time(), result

    async def _adapted(self, group: Group) -> AsyncGenerator[Any, None]:
        """Any other class, unmodified, through the adapter: its own ``run()``, held."""
        cls = await self._class(group.classpath)
        # Its own log lines go to the log of every task instance it serves, as well.
        tasklogs.SINK.set(functools.partial(self._trigger_said, group))
        await comms.portal()
        trigger = cls(**group.kwargs)
        # What Airflow's runner sets on an instance before run(); one instance serves
        # every row of the group, so it carries the first row's id.
        trigger.trigger_id = next(iter(group.rows))
        trigger.triggerer_job_id = self.job_id
        trigger.task_instance = None
        async with contextlib.aclosing(airflow_events(trigger, group.classpath)) as events:
            async for event in events:
                yield event

    def _trigger_said(self, group: Group, level: str, text: str) -> None:
        for row in list(group.rows.values()):
            self.tasklogs.add(row.log_path, level, text)

    async def _class(self, classpath: str) -> type:
        cls = self._classes.get(classpath)
        if cls is None:
            module = classpath.rpartition(".")[0]
            load = functools.partial(airflow_trigger_class, classpath)
            cls = self._classes[classpath] = await in_import_thread(module, load)
        return cls

    # -- what it holds ---------------------------------------------------------------

    def held(self) -> dict[str, int]:
        kinds: Counter[str] = Counter(g.plan.kind for g in self.groups.values())
        return {
            "triggers": len(self.member),
            "checks": len(self.groups),
            **{f"checks_{k}": n for k, n in kinds.items()},
        }


def first_line(exc: BaseException) -> str:
    """An exception as one short line: SQLAlchemy's messages carry the whole statement and
    its parameters (a 100,000-id statement printed in every retry filled 359 MB of log in
    five minutes)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"
