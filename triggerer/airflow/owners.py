"""Which live ``slotless airflow-triggerer`` instance checks a condition.

Airflow assigns trigger rows to triggerers arbitrarily (``Trigger.assign_unassigned`` takes
whatever is unassigned, up to a capacity), so equal rows land on different instances. The
rows stay where Airflow puts them (Airflow's view of which triggerer holds what, and its
health threshold, are unchanged); what is decided here is only which instance *checks* a
condition, and so submits its outcome to every trigger id waiting on it, wherever each id
is assigned:

- the candidates are the slotless instances serving the same trigger queues (their
  TriggererJob rows carry :func:`mark` in ``executor_class``, a column Airflow's triggerer
  leaves empty), running, whose ``latest_heartbeat`` is younger than :data:`LIVE_S`. They
  heartbeat every :data:`BEAT_S`, far more often than Airflow's ``job_heartbeat_sec``, so a
  killed instance stops being a candidate within :data:`LIVE_S`, while Airflow's own test
  (30 s by default) still counts it alive and leaves its rows assigned to it;
- a condition's owner is the candidate with the highest rendezvous weight for its key: each
  instance computes the same owner from the same Job rows, and an instance joining or
  leaving moves only the keys it wins or held.

Pure functions, no Airflow: the engine feeds them the Job rows it read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# A slotless instance's Job heartbeat period, and the age after which the others stop
# counting it as a candidate (its conditions go to them; Airflow's row assignment is not
# touched). Three beats may be missed before a busy instance loses its conditions.
BEAT_S = 0.5
LIVE_S = 1.5
# Job rows of slotless instances looked at: a killed instance's rows stay assigned to its
# Job until Airflow's health threshold hands them to another triggerer; an hour covers any
# threshold in use (Airflow's default is 30 s).
RECENT_S = 3600.0

MARK = "slotless airflow-triggerer"


def mark(queues: Iterable[str] | None) -> str:
    """What a slotless instance writes in its Job's ``executor_class``: instances serving
    other trigger queues are other pools, never candidates for these rows."""
    served = sorted(set(queues or ()))
    text = MARK if not served else f"{MARK} queues={','.join(served)}"
    if len(text) > 500:  # Job.executor_class's width: the queues' digest instead
        digest = hashlib.blake2b(",".join(served).encode(), digest_size=16).hexdigest()
        text = f"{MARK} queues#{digest}"
    return text


@dataclass(frozen=True)
class Peer:
    """A slotless instance's TriggererJob, as read from Airflow's job table."""

    job_id: int
    beat: float  # latest_heartbeat, seconds since the epoch
    running: bool  # state running and no end_date


def candidates(peers: Iterable[Peer], now: float, live_s: float = LIVE_S) -> list[int]:
    """The instances that check conditions now: running, and heard from within ``live_s``."""
    return sorted(p.job_id for p in peers if p.running and now - p.beat < live_s)


def weight(key: Any, job_id: int) -> int:
    """The rendezvous weight of ``key`` on ``job_id``: equal in every process (no
    ``hash()``, which is salted per process)."""
    digest = hashlib.blake2b(f"{job_id}\x00{key!r}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(key: Any, among: Sequence[int]) -> int | None:
    """The candidate that checks ``key`` (None when there is none)."""
    if not among:
        return None
    return max(among, key=lambda job_id: (weight(key, job_id), job_id))
