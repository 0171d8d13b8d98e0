"""The triggerer's settings (triggerer/service.py): its loops' periods and its bounds."""

from __future__ import annotations

from dataclasses import dataclass

from executor.store.events import RETENTION


@dataclass
class TriggererConfig:
    lease_ttl: float = 15.0  # a hung triggerer's shards are taken after this
    lease_every: float = 3.0
    liveness_every: float = 0.5  # a killed triggerer's shards are taken within about this
    sync_every: float = 1.0  # how often new waits are read (a wake-up shortens it)
    reload_every: float = 60.0  # full reconcile with the rows
    timeouts_every: float = 1.0
    cleanup_every: float = 60.0
    flush_every: float = 0.05
    check_tick: float = 0.01  # due checks are gathered this long (a check may be this late)
    max_concurrency: int = 256  # checks in flight at once
    wave: int = 32  # check calls started per round of the loop
    batch_size: int = 1000  # triggers per poke_many call
    load_shards_per_query: int = 4  # a full reload reads this many shards at a time
    check_timeout: float = 60.0  # a check that takes longer is cancelled and retried
    max_backoff: float = 300.0
    event_retention: float = RETENTION  # events older than this are pruned (seconds)
    # Wake checks from push sources (inotify, S3 event queues, NOTIFY); polled otherwise.
    push: bool = True
    push_safety_interval: float = 300.0  # how often a check whose source is live is polled
    push_retry: float = 30.0  # a source that failed is tried again after this (doubling)
    # A sample of checks/s, loop lag and what it holds for the waits page, written at the
    # first heartbeat after this many seconds (triggerer/sampling.py); kept an hour.
    sample_every: float = 30.0
