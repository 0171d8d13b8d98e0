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
