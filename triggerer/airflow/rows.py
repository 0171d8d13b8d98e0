"""The blocking calls into Airflow's own models: the only way this triggerer touches
Airflow's metadata database. Each method blocks (SQLAlchemy sessions); the engine calls
them in a thread, never on its event loop.

Airflow's triggerer does the same sequence in its ``TriggerRunnerSupervisor``
(``load_triggers``, ``handle_events``, ``handle_failed_triggers``, ``clean_unused``,
``heartbeat``): this is that sequence, without its runner subprocess.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .owners import BEAT_S, RECENT_S, Peer, candidates, mark, owner
from .submitting import Write, write

log = logging.getLogger("slotless.airflow")

# Trigger rows fetched per bulk_fetch statement (see load).
FETCH_PIECE = 5_000


@dataclass(frozen=True)
class Row:
    """A trigger row as the engine holds it: its class, its kwargs decrypted and decoded as
    Airflow's triggerer decodes them, and whom it serves."""

    id: int
    classpath: str
    kwargs: dict[str, Any]
    # A task instance waits on it (its first event resumes the task and ends the trigger);
    # otherwise an asset watcher's or a callback's, which Airflow keeps running.
    for_task: bool
    name: str  # dag/run/task/map/try (ID n), as Airflow's triggerer names it in its log
    dag_id: str | None = None  # the waiting task instance's DAG (None: not a task's)
    # The rest of the task instance's key, for `slotless status --airflow`.
    task_id: str | None = None
    run_id: str | None = None
    map_index: int = -1
    try_number: int = 0
    since: float | None = None  # when the trigger row was made (the deferral), epoch s
    # The task instance's log file, relative to [logging] base_log_folder, as Airflow's
    # log_filename_template renders it (its trigger log is this plus .trigger.<job>.log).
    log_path: str | None = None


@dataclass
class Outcome:
    """What a check found, for these trigger ids: an event, or a failure."""

    ids: list[int]
    event: Any = None
    error: BaseException | str | None = None
    names: list[str] = field(default_factory=list)
    # The condition's key (who checks it, :mod:`.owners`); None: submitted whoever owns it.
    key: Any = None
    written: int = 0  # trigger ids it was written to (set by AirflowRows.submit)


def in_batches(outcomes: Sequence[Outcome], most: int) -> list[list[Outcome]]:
    """``outcomes`` as transactions of at most ``most`` trigger ids each, in order; an
    outcome with more ids than that is cut into parts (its names follow its ids).

    One transaction per burst would hold every row lock while thousands of
    ``submit_event`` calls run, and bind more ids than PostgreSQL's 65,535 parameters in
    its lock statement: a burst of 100,000 would never be written at all.
    """
    batches: list[list[Outcome]] = []
    batch: list[Outcome] = []
    room = most
    for o in outcomes:
        start = 0
        while True:
            take = min(room, len(o.ids) - start)
            whole = take == len(o.ids)
            names = o.names[start : start + take] if len(o.names) == len(o.ids) else o.names
            end = start + take
            batch.append(o if whole else Outcome(o.ids[start:end], o.event, o.error, names, o.key))
            room, start = room - take, end
            if room == 0:
                batches.append(batch)
                batch, room = [], most
            if start >= len(o.ids):
                break
    if batch:
        batches.append(batch)
    return batches


@dataclass
class Seen:
    """One cycle's look at Airflow's tables: the trigger ids held by slotless instances of
    this pool (id -> its triggerer's Job id), and those instances' Job rows. ``full``:
    every id they hold; else only those above the id the look started from."""

    held: dict[int, int]
    peers: list[Peer]
    now: float
    full: bool = True


class UndecryptableKwargs(ValueError):
    """A trigger row's kwargs cannot be decrypted (or decoded) with this Fernet key."""


class AirflowRows:
    """Airflow's Job and Trigger models, called as Airflow's triggerer calls them."""

    def __init__(self, capacity: int, queues: set[str] | None = None) -> None:
        from airflow.configuration import conf

        self.capacity = capacity
        # Trigger queues served; None: rows without a queue, as Airflow's triggerer does.
        self.queues = queues
        # Seconds without a heartbeat after which Airflow's scheduler and the other
        # triggerers take a triggerer's triggers away (Airflow's own setting).
        self.health_check_threshold = conf.getint("triggerer", "triggerer_health_check_threshold")
        self.job: Any = None
        # How many unassigned rows one of Airflow's assignment queries takes at most.
        self.select_limit = conf.getint("triggerer", "max_trigger_to_select_per_loop", fallback=50)
        # With [core] multi_team on, ids_for_triggerer without a team lists the rows of
        # no team: the same filter for the listing of new rows (:meth:`_above`).
        self.multi_team = conf.getboolean("core", "multi_team", fallback=False)
        # Written in the Job's executor_class (unused by Airflow's triggerer): how slotless
        # instances of one pool find each other among Airflow's TriggererJobs.
        self.mark = mark(queues)

    # -- the job ---------------------------------------------------------------------

    def start_job(self) -> int:
        """A running Job of type TriggererJob, as ``airflow triggerer`` registers."""
        from airflow.jobs.job import Job

        # Airflow's heartrate for a TriggererJob is [triggerer] job_heartbeat_sec (5 s); this
        # one beats every BEAT_S so the other slotless instances notice its death in time
        # to check its conditions within seconds. Airflow's health test is unchanged.
        job = Job(heartrate=BEAT_S, executor_class=self.mark)
        job.job_type = "TriggererJob"
        job.prepare_for_execution()
        self.job = job
        return int(job.id)

    def heartbeat(self) -> list[Peer]:
        """Airflow's heartbeat when one is due (never sleeps), then the pool's Job rows."""
        from airflow.jobs.job import perform_heartbeat

        perform_heartbeat(self.job, heartbeat_callback=_no_callback, only_if_necessary=True)
        return self.peers()

    def peers(self, session: Any = None) -> list[Peer]:
        """The TriggererJobs of this pool's slotless instances heard from recently, alive or
        not (a dead one's rows are still assigned to it until Airflow hands them on)."""
        from airflow._shared.timezones import timezone
        from airflow.jobs.job import Job, JobState
        from airflow.utils.session import create_session
        from sqlalchemy import select  # type: ignore[import-not-found]

        since = timezone.utcnow() - timedelta(seconds=RECENT_S)
        query = select(Job.id, Job.latest_heartbeat, Job.state, Job.end_date).where(
            Job.job_type == "TriggererJob",
            Job.executor_class == self.mark,
            Job.latest_heartbeat > since,
        )
        if session is None:
            with create_session() as own:
                found = own.execute(query).all()
        else:
            found = session.execute(query).all()
        return [
            Peer(
                int(jid),
                beat.timestamp(),
                state == JobState.RUNNING and end is None,
            )
            for jid, beat, state, end in found
        ]

    def end_job(self) -> None:
        """The Job ends (its end_date set): its triggers are free for another triggerer at
        once, without waiting out the health threshold."""
        from airflow.jobs.job import JobState

        if self.job is None:
            return
        self.job.state = JobState.SUCCESS
        self.job.complete_execution()

    # -- the triggers ----------------------------------------------------------------

    def cycle(self, above: int | None = None) -> Seen:
        """Take unassigned (or orphaned) triggers up to capacity, then list the rows every
        slotless instance of this pool holds (ours among them): which of them this
        instance checks is decided by key, not by assignment (:mod:`.owners`).

        ``above``: only the rows with a higher id (new since a full listing), in one
        statement; None: every row, through Airflow's ``ids_for_triggerer`` per instance."""
        from airflow.models.trigger import Trigger
        from airflow.utils.session import create_session

        Trigger.assign_unassigned(
            self.job.id, self.capacity, self.health_check_threshold, queues=self.queues
        )
        held: dict[int, int] = {}
        with create_session() as session:
            peers = self.peers(session)
            if above is not None:
                held = self._above(session, [p.job_id for p in peers], above)
            else:
                for peer in peers:
                    for tid in Trigger.ids_for_triggerer(
                        peer.job_id, queues=self.queues, session=session
                    ):
                        held[int(tid)] = peer.job_id
        return Seen(held, peers, time.time(), full=above is None)

    def _above(self, session: Any, jobs: list[int], above: int) -> dict[int, int]:
        """``ids_for_triggerer``'s rows for every one of ``jobs`` at once, with ids above
        ``above``: its filters (the trigger queues served, no team: ``--team`` is not
        served) and the holder of each."""
        from airflow.models.trigger import Trigger
        from sqlalchemy import select

        if not jobs:
            return {}
        query = select(Trigger.id, Trigger.triggerer_id).where(
            Trigger.triggerer_id.in_(jobs), Trigger.id > above
        )
        if self.queues:
            query = query.where(Trigger.queue.in_(self.queues))
        else:
            query = query.where(Trigger.queue.is_(None))
        if self.multi_team:
            query = query.where(Trigger.team_name.is_(None))
        return {int(tid): int(job) for tid, job in session.execute(query).all()}

    def load(self, ids: Iterable[int]) -> tuple[list[Row], list[Outcome], set[int]]:
        """The rows for ``ids``, decrypted; a row that cannot be is a failure for its own
        task instance. A row nobody waits on any more (resumed meanwhile) is left out, and
        its id returned as gone."""
        from airflow.models.trigger import Trigger
        from airflow.serialization.decoders import smart_decode_trigger_kwargs
        from airflow.utils.helpers import log_filename_template_renderer
        from airflow.utils.session import create_session

        render_log_fname = log_filename_template_renderer()
        rows: list[Row] = []
        bad: list[Outcome] = []
        gone: set[int] = set()
        with create_session() as session:
            others = Trigger.fetch_trigger_ids_with_non_task_associations(session=session)
            fetched: dict[int, Any] = {}
            wanted = sorted(ids)
            # In pieces: bulk_fetch is one `id IN (...)`, and PostgreSQL takes at most
            # 65,535 bound parameters in a statement (an instance joining peers that hold
            # 100,000 rows loads them all in its first cycle).
            for start in range(0, len(wanted), FETCH_PIECE):
                piece = wanted[start : start + FETCH_PIECE]
                fetched.update(Trigger.bulk_fetch(piece, session=session))
            for tid, trigger in fetched.items():
                ti = trigger.task_instance
                if ti is None and tid not in others:
                    gone.add(tid)
                    continue
                name = _name(tid, ti)
                try:
                    raw = Trigger._decrypt_kwargs(trigger.encrypted_kwargs)
                    kwargs = {k: smart_decode_trigger_kwargs(v) for k, v in raw.items()}
                except Exception as exc:
                    error = _undecryptable(trigger.classpath, exc)
                    bad.append(Outcome([tid], error=error, names=[name], key=("bad", tid)))
                    continue
                since = None if trigger.created_date is None else trigger.created_date.timestamp()
                if ti is None:
                    rows.append(Row(tid, trigger.classpath, kwargs, False, name, since=since))
                    continue
                rows.append(
                    Row(
                        tid,
                        trigger.classpath,
                        kwargs,
                        True,
                        name,
                        str(ti.dag_id),
                        str(ti.task_id),
                        str(ti.run_id),
                        int(ti.map_index),
                        int(ti.try_number or 0),
                        since,
                        _log_path(render_log_fname, ti),
                    )
                )
        return rows, bad, gone

    def submit(self, outcomes: Sequence[Outcome]) -> list[Outcome]:
        """Each outcome to each of its trigger ids, in one transaction: an event resumes the
        trigger's task instances (and reaches its assets, its callback); a failure fails
        them, with the error in their log. Returns the outcomes not written because another
        instance checks their condition now.

        The trigger rows are locked first (``FOR UPDATE``, in id order, with Airflow's own
        ``with_row_locks``, as its ``clean_unused`` locks them), so two instances writing
        one trigger id follow each other: the second finds its task instances no longer
        DEFERRED and does nothing to them. (The writes are what ``submit_event`` and
        ``submit_failure`` do per id, done for the whole batch: :mod:`.submitting`.)
        Under the lock, who checks each condition is decided again from the Job rows read
        then, and a row that another kind of triggerer (Airflow's own, in a mixed
        deployment) has taken meanwhile is left to it: Airflow's assignment skips locked
        rows, so it cannot take one mid-write."""
        from airflow.jobs.job import Job
        from airflow.models.trigger import Trigger
        from airflow.utils.session import create_session
        from airflow.utils.sqlalchemy import with_row_locks
        from sqlalchemy import select

        ids = sorted({tid for o in outcomes for tid in o.ids})
        skipped: list[Outcome] = []
        with create_session() as session:
            query = select(Trigger.id, Trigger.triggerer_id).where(Trigger.id.in_(ids))
            locked = {
                int(tid): holder
                for tid, holder in session.execute(
                    with_row_locks(query.order_by(Trigger.id), session, of=Trigger, key_share=False)
                ).all()
            }
            holders = {h for h in locked.values() if h is not None}
            ours = set(
                session.scalars(
                    select(Job.id).where(Job.id.in_(holders), Job.executor_class == self.mark)
                )
            )
            among = candidates(self.peers(session), time.time())
            me = int(self.job.id)
            writes: list[Write] = []
            for outcome in outcomes:
                outcome.written = 0  # a retried batch counts afresh
                # Nobody live at all (this instance's own beat late too): nobody else checks
                # it either, so it is written rather than lost.
                checker = None if outcome.key is None else owner(outcome.key, among)
                if checker is not None and checker != me:
                    skipped.append(outcome)
                    continue
                for tid in outcome.ids:
                    if locked.get(tid) not in ours:
                        continue  # gone, or another kind of triggerer's now
                    writes.append(Write(tid, outcome.event, outcome.error))
                    outcome.written += 1
            # What submit_event / submit_failure do per id, for the whole batch at once.
            write(writes, session)
        return skipped

    def clean_unused(self) -> None:
        from airflow.models.trigger import Trigger

        Trigger.clean_unused()


def _no_callback(session: Any = None) -> None:
    return None


def _name(tid: int, ti: Any) -> str:
    if ti is None:
        return f"ID {tid}"
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}/{ti.try_number} (ID {tid})"


def _log_path(render: Any, ti: Any) -> str | None:
    """The task instance's log path as Airflow's triggerer renders it; None when the
    template cannot be rendered for it (its trigger's lines then stay on stderr only)."""
    try:
        return str(render(ti=ti))
    except Exception as exc:
        log.warning("cannot render the log path of %s: %s", ti, exc)
        return None


def _undecryptable(classpath: str, exc: Exception) -> UndecryptableKwargs:
    # Fernet's InvalidToken says nothing at all: name the likely cause.
    said = str(exc).strip() or "no detail"
    err = UndecryptableKwargs(
        f"cannot decrypt the kwargs of this {classpath} trigger ({type(exc).__name__}: "
        f"{said}); is this triggerer's [core] fernet_key the one the deployment's "
        "scheduler and workers use?"
    )
    err.__cause__ = exc
    return err
