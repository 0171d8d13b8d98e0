"""Task states and the transitions allowed between them.

The table below is the whole state machine; :func:`executor.statemachine.transition`
refuses anything it does not list.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class State(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    UPSTREAM_FAILED = "UPSTREAM_FAILED"
    SKIPPED = "SKIPPED"
    RETRYING = "RETRYING"
    SENSING = "SENSING"
    DEFERRED = "DEFERRED"


TERMINAL = frozenset({State.SUCCESS, State.FAILED, State.UPSTREAM_FAILED, State.SKIPPED})

# Waiting states a worker may claim from once their ready time has come.
CLAIMABLE = frozenset({State.PENDING, State.RETRYING, State.SENSING})

ALLOWED: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.RUNNING, State.SKIPPED, State.UPSTREAM_FAILED, State.FAILED}),
    State.RUNNING: frozenset(
        {
            State.SUCCESS,
            State.FAILED,
            State.RETRYING,
            State.SENSING,
            State.DEFERRED,
            State.SKIPPED,
            State.UPSTREAM_FAILED,  # a mapped task's template when its instances failed upstream
        }
    ),
    State.RETRYING: frozenset({State.RUNNING, State.FAILED}),
    State.SENSING: frozenset({State.RUNNING, State.FAILED, State.SKIPPED}),
    State.DEFERRED: frozenset(
        {State.PENDING, State.SUCCESS, State.FAILED, State.SKIPPED, State.RETRYING}
    ),
    State.SUCCESS: frozenset(),
    State.FAILED: frozenset(),
    State.UPSTREAM_FAILED: frozenset(),
    State.SKIPPED: frozenset(),
}

# What operators may do besides (executor/store/control.py), each a compare-and-set too:
# clear (back to PENDING with fresh attempts; RUNNING only with force, its attempt taken
# back like a lost worker's), mark (an outcome set by hand) and cancel (what has not
# ended is SKIPPED, a running attempt FAILED).
_OPERATOR: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.SUCCESS, State.SKIPPED}),
    State.RUNNING: frozenset({State.PENDING}),
    State.RETRYING: frozenset({State.PENDING, State.SUCCESS, State.SKIPPED}),
    State.SENSING: frozenset({State.PENDING, State.SUCCESS}),
    State.DEFERRED: frozenset(),  # PENDING, SUCCESS, FAILED, SKIPPED: allowed already
    State.SUCCESS: frozenset({State.PENDING}),
    State.FAILED: frozenset({State.PENDING}),
    State.UPSTREAM_FAILED: frozenset({State.PENDING}),
    State.SKIPPED: frozenset({State.PENDING}),
}
ALLOWED = {state: ALLOWED[state] | _OPERATOR[state] for state in State}


class RunState(StrEnum):
    """A run's states: QUEUED (created over its DAG's max_active_runs, nothing claimable)
    -> RUNNING -> SUCCESS or FAILED when its last task ends; CANCELLED by an operator (or
    its dagrun_timeout); PAUSED at its first failed task under ``on_task_failure="pause"``
    (nothing new starts until ``slotless resume`` or ``clear``: it needs a person)."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


RUN_TERMINAL = frozenset({RunState.SUCCESS, RunState.FAILED, RunState.CANCELLED})

# An ended run goes back to RUNNING when an operator clears some of its tasks. A run
# PAUSED by its failure policy goes on (RUNNING) when resumed or cleared, or is cancelled
# (by an operator or its dagrun_timeout); fail_fast ends a RUNNING run FAILED at once.
RUN_ALLOWED: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.RUNNING, RunState.CANCELLED}),
    RunState.RUNNING: frozenset(
        {RunState.SUCCESS, RunState.FAILED, RunState.CANCELLED, RunState.PAUSED}
    ),
    RunState.PAUSED: frozenset({RunState.RUNNING, RunState.CANCELLED}),
    RunState.SUCCESS: frozenset({RunState.RUNNING}),
    RunState.FAILED: frozenset({RunState.RUNNING}),
    RunState.CANCELLED: frozenset({RunState.RUNNING}),
}


class IllegalTransition(ValueError):
    """A transition the state machine does not allow (a bug in the caller, never user input)."""


def check_transition(expected: State | RunState, new: State | RunState) -> None:
    table: Mapping[Any, frozenset[Any]] = ALLOWED if isinstance(expected, State) else RUN_ALLOWED
    if new not in table[expected]:
        raise IllegalTransition(f"illegal transition {expected} -> {new}")
