"""Task states and the transitions allowed between them.

The table below is the whole state machine; :func:`executor.statemachine.transition`
refuses anything it does not list.
"""

from __future__ import annotations

from enum import StrEnum


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


class IllegalTransition(ValueError):
    """A transition the state machine does not allow (a bug in the caller, never user input)."""


def check_transition(expected: State, new: State) -> None:
    if new not in ALLOWED[expected]:
        raise IllegalTransition(f"illegal transition {expected} -> {new}")
