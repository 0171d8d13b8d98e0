"""The blocking calls into Airflow's own models: the only way this triggerer touches
Airflow's metadata database. Each method blocks (SQLAlchemy sessions); the engine calls
them in a thread, never on its event loop.

Airflow's triggerer does the same sequence in its ``TriggerRunnerSupervisor``
(``load_triggers``, ``handle_events``, ``handle_failed_triggers``, ``clean_unused``,
``heartbeat``): this is that sequence, without its runner subprocess.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("slotless.airflow")


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


@dataclass
class Outcome:
    """What a check found, for these trigger ids: an event, or a failure."""

    ids: list[int]
    event: Any = None
    error: BaseException | str | None = None
    names: list[str] = field(default_factory=list)


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

    # -- the job ---------------------------------------------------------------------

    def start_job(self) -> int:
        """A running Job of type TriggererJob, as ``airflow triggerer`` registers."""
        from airflow.jobs.job import Job

        job = Job()
        job.job_type = "TriggererJob"
        job.prepare_for_execution()
        self.job = job
        return int(job.id)

    def heartbeat(self) -> None:
        """Airflow's heartbeat, only when its heartrate says one is due (never sleeps)."""
        from airflow.jobs.job import perform_heartbeat

        perform_heartbeat(self.job, heartbeat_callback=_no_callback, only_if_necessary=True)

    def end_job(self) -> None:
        """The Job ends (its end_date set): its triggers are free for another triggerer at
        once, without waiting out the health threshold."""
        from airflow.jobs.job import JobState

        if self.job is None:
            return
        self.job.state = JobState.SUCCESS
        self.job.complete_execution()

    # -- the triggers ----------------------------------------------------------------

    def assigned(self) -> set[int]:
        """Take unassigned (or orphaned) triggers up to capacity, then list ours."""
        from airflow.models.trigger import Trigger

        Trigger.assign_unassigned(
            self.job.id, self.capacity, self.health_check_threshold, queues=self.queues
        )
        return set(Trigger.ids_for_triggerer(self.job.id, queues=self.queues))

    def load(self, ids: Iterable[int]) -> tuple[list[Row], list[Outcome]]:
        """The rows for ``ids``, decrypted; a row that cannot be is a failure for its own
        task instance. A row nobody waits on any more (resumed meanwhile) is left out."""
        from airflow.models.trigger import Trigger
        from airflow.serialization.decoders import smart_decode_trigger_kwargs
        from airflow.utils.session import create_session

        rows: list[Row] = []
        bad: list[Outcome] = []
        with create_session() as session:
            fetched = Trigger.bulk_fetch(list(ids), session=session)
            others = Trigger.fetch_trigger_ids_with_non_task_associations(session=session)
            for tid, trigger in fetched.items():
                ti = trigger.task_instance
                if ti is None and tid not in others:
                    continue
                name = _name(tid, ti)
                try:
                    raw = Trigger._decrypt_kwargs(trigger.encrypted_kwargs)
                    kwargs = {k: smart_decode_trigger_kwargs(v) for k, v in raw.items()}
                except Exception as exc:
                    bad.append(Outcome([tid], error=_undecryptable(trigger.classpath, exc)))
                    continue
                dag_id = None if ti is None else str(ti.dag_id)
                rows.append(Row(tid, trigger.classpath, kwargs, ti is not None, name, dag_id))
        return rows, bad

    def submit(self, outcomes: Sequence[Outcome]) -> None:
        """Each outcome to each of its trigger ids, in one transaction: an event resumes the
        trigger's task instances (and reaches its assets, its callback); a failure fails
        them, with the error in their log."""
        from airflow.models.trigger import Trigger
        from airflow.utils.session import create_session

        with create_session() as session:
            for outcome in outcomes:
                for tid in outcome.ids:
                    if outcome.error is not None:
                        Trigger.submit_failure(tid, outcome.error, session=session)
                    else:
                        Trigger.submit_event(tid, outcome.event, session=session)

    def clean_unused(self) -> None:
        from airflow.models.trigger import Trigger

        Trigger.clean_unused()


def _no_callback(session: Any = None) -> None:
    return None


def _name(tid: int, ti: Any) -> str:
    if ti is None:
        return f"ID {tid}"
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{ti.map_index}/{ti.try_number} (ID {tid})"


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
