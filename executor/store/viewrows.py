"""Typed rows of the read-only views (:mod:`.inspecting`): what ``slotless status``, the
web page and the JSON API read, by attribute.

Each class is built by column name from its query (``schema/common/queries.sql`` names
them), as :mod:`executor.rows` builds task rows, so a column a migration adds breaks none.
Frozen: a view is a snapshot read in one transaction, never a row to write back.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.rows import _FromRow, _typed
from executor.states import RUN_TERMINAL


@_typed
@dataclass(frozen=True, slots=True)
class RunRow(_FromRow):
    """A run as ``list_runs`` and ``run_info`` read it (``SELECT *`` of ``dag_run``)."""

    run_id: str
    dag_id: str
    logical_date: str
    state: str
    state_reason: str | None  # why it paused, failed fast or was cancelled
    created_at: float
    ended_at: float | None
    deadline_at: float | None
    deadline_missed_at: float | None
    conf: str | None  # the JSON object it was triggered with (None: none)
    # Its logical instant (UTC), the zone it is read on, how it started (migration 020;
    # None: written by a process of the previous release). executor.runnames.logical_shown
    # writes it for people; the interval tells a sub-daily run from a day's.
    logical_time: str | None
    timezone: str | None
    run_type: str | None
    data_interval_start: str | None
    data_interval_end: str | None

    @property
    def finished(self) -> bool:
        return self.state in RUN_TERMINAL


@_typed
@dataclass(frozen=True, slots=True)
class AttentionRow(_FromRow):
    """``ops_runs_needing_attention``: a PAUSED run, or one going on past its deadline."""

    run_id: str
    dag_id: str
    state: str
    state_reason: str | None
    deadline_at: float | None


@_typed
@dataclass(frozen=True, slots=True)
class WaitingCount(_FromRow):
    """``ops_waiting_summary``: one waiting state's count, its oldest start, and the largest
    share of its own timeout a wait has used."""

    state: str
    n: int
    oldest: float | None
    timeout_ratio: float | None


@_typed
@dataclass(frozen=True, slots=True)
class DeferredRow(_FromRow):
    """``ops_deferred``: a DEFERRED task with its trigger and the lease of its shard (the
    trigger's columns are None when its row is missing)."""

    run_id: str
    task_id: str
    map_index: int
    state: str
    attempt: int
    max_attempts: int
    updated_at: float
    wait_started_at: float | None
    wait_timeout_at: float | None
    next_method: str | None
    trigger_id: int | None
    classpath: str | None
    poke_hash: str | None
    shard: int | None
    description: str | None
    lease_owner: str | None
    lease_expires_at: float | None


@_typed
@dataclass(frozen=True, slots=True)
class SensingRow(_FromRow):
    """``ops_sensing``: a reschedule-mode sensor between checks, with its last check."""

    run_id: str
    task_id: str
    map_index: int
    state: str
    attempt: int
    max_attempts: int
    updated_at: float
    ready_at: float | None
    wait_started_at: float | None
    wait_timeout_at: float | None
    last_message: str | None


@_typed
@dataclass(frozen=True, slots=True)
class RetryingRow(_FromRow):
    """``ops_retrying``: a task waiting for its next attempt, with its last failure."""

    run_id: str
    task_id: str
    map_index: int
    state: str
    attempt: int
    max_attempts: int
    updated_at: float
    ready_at: float | None
    retrying_since: float | None
    last_error: str | None


WaitingRow = DeferredRow | SensingRow | RetryingRow


@_typed
@dataclass(frozen=True, slots=True)
class TriggererRow(_FromRow):
    """``list_triggerers``: a live or recently seen triggerer."""

    id: str
    seen_at: float
    started_at: float
    triggers: int  # waits it held at its last heartbeat
    loop_lag_ms: float | None
    shards: int  # shard leases it holds, live or not


@_typed
@dataclass(frozen=True, slots=True)
class ShardLease(_FromRow):
    shard: int
    owner: str | None
    expires_at: float | None


@_typed
@dataclass(frozen=True, slots=True)
class MappedRow(_FromRow):
    """``progress_mapped``: a mapped task's template, with its instances ended so far."""

    task_id: str
    state: str
    expand_from: str
    map_total: int | None  # None: not expanded yet
    n_done: int
    n_failed: int


@_typed
@dataclass(frozen=True, slots=True)
class EventRow(_FromRow):
    """``task_events``: one entry of a task's log (``task_event``)."""

    id: int
    ts: float
    kind: str  # transition, log, check, error
    from_state: str | None
    to_state: str | None
    attempt: int | None
    message: str


@_typed
@dataclass(frozen=True, slots=True)
class TriggerRow(_FromRow):
    """``ops_trigger``: a DEFERRED task's trigger, with the lease of its shard."""

    id: int
    classpath: str
    kwargs: str  # JSON
    poke_hash: str
    shard: int
    created_at: float
    description: str | None
    lease_owner: str | None
    lease_expires_at: float | None

    def checked(self, now: float) -> bool:
        """A live triggerer holds its shard's lease."""
        return self.lease_owner is not None and (self.lease_expires_at or 0) >= now


@_typed
@dataclass(frozen=True, slots=True)
class InstanceRow(_FromRow):
    """``ops_task_instances``: one instance of a mapped task."""

    id: int
    map_index: int
    state: str
    attempt: int
    updated_at: float


@_typed
@dataclass(frozen=True, slots=True)
class DagRow(_FromRow):
    """``catalogue_dags``: a catalogued DAG with its newest run's state and its start
    waits (``armed_*``: the schedule's wait the triggerer holds; ``waiting_for``: the
    start condition's)."""

    dag_id: str
    file: str
    schedule: str | None
    timezone: str
    paused: int
    next_logical_date: str | None
    parse_error: str | None
    start_error: str | None
    last_run_state: str | None  # None: it never ran
    armed_logical_date: str | None
    armed_due: str | None
    waiting_for: str | None
    asset_schedule: str | None  # JSON: the asset condition that starts it (executor/assets.py)


@_typed
@dataclass(frozen=True, slots=True)
class RunSquare(_FromRow):
    """``dags_page_runs``: one of a DAG's newest runs, a square on the DAGs page."""

    dag_id: str
    run_id: str
    logical_date: str
    state: str
    created_at: float
    # what executor.runnames.logical_shown reads to name the run for people
    logical_time: str | None
    timezone: str | None
    data_interval_end: str | None

    @property
    def finished(self) -> bool:
        return self.state in RUN_TERMINAL


@_typed
@dataclass(frozen=True, slots=True)
class BrokenFile(_FromRow):
    """``catalogue_broken_files``: a DAG file whose last parse failed."""

    path: str
    parse_error: str


@_typed
@dataclass(frozen=True, slots=True)
class HeldRow(_FromRow):
    """``ops_held_back``: a ready task in a limited pool or a queue other than default."""

    run_id: str
    task_id: str
    map_index: int
    state: str
    ready_at: float | None
    pool: str
    queue: str
