"""Waitlist: what is being waited on right now, one entry per distinct condition (poke hash),
and the triggerers' last hour. Read-only, for the waits page and its API.

Tasks that wait on equal conditions share one check in the triggerer (one poke hash, so
one shard and one triggerer), so the page groups by it: ``waits_by_check`` is one grouped
pass over the DEFERRED tasks' trigger rows, filtered by class and DAG in SQL, paged
(``limit``, most waiters or oldest first) and counting what the page leaves out in the same
pass. What is read per shown condition (its first waiters, the one whose timeout comes
first, its last logged check) reads only the rows of the conditions shown.

The last check is the newest *sampled* check line in the first waiter's log
(triggerer/settling.py writes checks 1, 2, 4, 8, ... and every change of result): the
triggerer writes nothing per check for this page, so a condition's last check is at least
that recent, and its result is the last result that changed (docs/operations.md, "The
waits page").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ..driver.db import Tx
from .part import Part

ORDERS = ("waiters", "oldest")
MAX_LIMIT = 500  # conditions on one page
FIRST_WAITERS = 5  # waiters listed per condition (the rest: "and N more")
HISTORY = 3600.0  # seconds of triggerer samples read (triggerer/sampling.py keeps an hour)


@dataclass(frozen=True, slots=True)
class WaitFilter:
    """What the page asks for: a trigger class and a DAG ('' for any), the order, the page."""

    classpath: str = ""
    dag_id: str = ""
    order: str = "waiters"  # or "oldest"
    limit: int = 50


@dataclass(frozen=True, slots=True)
class Waiter:
    """One task waiting on a condition."""

    run_id: str
    task_id: str
    map_index: int
    dag_id: str
    wait_started_at: float | None
    wait_timeout_at: float | None


@dataclass(frozen=True, slots=True)
class WaitGroup:
    """One distinct condition and the tasks waiting on it (within the filter)."""

    poke_hash: str
    classpath: str
    shard: int
    waiters: int
    since: float | None  # the oldest wait's start
    timeout_at: float | None  # the nearest timeout (None: no waiter has one)
    timeout_share: float | None  # share of the nearest timeout's own span already used
    worst_share: float | None  # the largest share any waiter has used of its own
    owner: str | None  # the triggerer leasing its shard (None: nobody)
    lease_expires_at: float | None
    kwargs: str  # its first waiter's trigger kwargs (JSON)
    description: str | None  # ... and its describe(): what is waited for, in words
    listed_kwargs: tuple[str, ...]  # the listed waiters' kwargs (their intervals may differ)
    first: tuple[Waiter, ...]  # the first FIRST_WAITERS waiters, by task row
    last_check_at: float | None = None  # the newest sampled check line's time
    last_check: str | None = None  # ... and what it said

    @property
    def more(self) -> int:
        """Waiters not listed."""
        return self.waiters - len(self.first)


@dataclass(frozen=True, slots=True)
class WaitList:
    """A page of conditions, and how many match the filter in all."""

    now: float
    filter: WaitFilter
    groups: list[WaitGroup]
    conditions: int  # distinct conditions matching the filter
    waits: int  # tasks waiting on them


@dataclass(frozen=True, slots=True)
class Sample:
    """One of a triggerer's samples (schema 024_waits_page.sql)."""

    at: float
    checks_per_s: float
    lag_p99_ms: float | None
    lag_max_ms: float | None
    waits: int
    checks: int
    shards: int


@dataclass(frozen=True, slots=True)
class TriggererHistory:
    """A triggerer: listed (heartbeating) or only seen in the last hour's samples (gone)."""

    id: str
    listed: bool  # in the triggerer table (it left or was forgotten if not)
    seen_at: float | None
    started_at: float | None
    waits: int | None  # waits held at its last heartbeat
    loop_lag_ms: float | None  # p99 at its last heartbeat
    shards: tuple[int, ...]  # shards it leases now (live or expired leases)
    samples: tuple[Sample, ...] = field(default=())


class Waitlist(Part):
    async def conditions(self, f: WaitFilter) -> WaitList:
        """A page of the conditions waited on now (see the module's docstring)."""
        async with self.db.snapshot() as tx:
            return await self._conditions(tx, f)

    async def triggerers(self) -> list[TriggererHistory]:
        """Every triggerer listed or sampled in the last hour, with its samples in time order."""
        async with self.db.snapshot() as tx:
            return await self._triggerers(tx)

    async def page(self, f: WaitFilter) -> tuple[WaitList, list[TriggererHistory]]:
        """Both, read in one transaction (the page shows one moment)."""
        async with self.db.snapshot() as tx:
            return await self._conditions(tx, f), await self._triggerers(tx)

    async def _conditions(self, tx: Tx, f: WaitFilter) -> WaitList:
        if f.order not in ORDERS or not 1 <= f.limit <= MAX_LIMIT:
            raise ValueError(f"order must be one of {ORDERS}, limit 1..{MAX_LIMIT}")
        now = self.clock()
        filters = {"classpath": f.classpath, "dag_id": f.dag_id}
        rows = await tx.fetch("waits_by_check", now=now, order=f.order, n=f.limit, **filters)
        if not rows:
            return WaitList(now, f, [], 0, 0)
        hashes = [r["poke_hash"] for r in rows]
        shards = sorted({r["shard"] for r in rows})
        first: dict[str, list[Waiter]] = defaultdict(list)
        nearest: dict[str, tuple[float | None, float | None]] = {}
        kwargs: dict[str, tuple[str, str | None]] = {}
        first_row: dict[str, int] = {}
        listed_kwargs: dict[str, list[str]] = defaultdict(list)
        for w in await tx.fetch(
            "waiters_of_checks", hashes=hashes, shards=shards, first=FIRST_WAITERS, **filters
        ):
            h = w["poke_hash"]
            if w["by_id"] <= FIRST_WAITERS:
                first[h].append(
                    Waiter(
                        w["run_id"], w["task_id"], w["map_index"], w["dag_id"],
                        w["wait_started_at"], w["wait_timeout_at"],
                    )
                )  # fmt: skip
                listed_kwargs[h].append(w["kwargs"])
            if w["by_id"] == 1:
                kwargs[h] = (w["kwargs"], w["description"])
                first_row[h] = w["id"]
            if w["by_timeout"] == 1:
                nearest[h] = (w["wait_started_at"], w["wait_timeout_at"])
        logs = {
            r["task_row"]: (r["ts"], r["message"])
            for r in await tx.fetch("last_check_logs", rows=list(first_row.values()))
        }
        leases = {r["shard"]: (r["owner"], r["expires_at"]) for r in await tx.fetch("shard_owners")}
        groups = []
        for r in rows:
            h = r["poke_hash"]
            started, timeout_at = nearest.get(h, (None, None))
            share = None
            if started is not None and timeout_at is not None and timeout_at > started:
                share = (now - started) / (timeout_at - started)
            owner, expires = leases.get(r["shard"], (None, None))
            logged = logs.get(first_row.get(h, -1), (None, None))
            groups.append(
                WaitGroup(
                    poke_hash=h,
                    classpath=r["classpath"],
                    shard=r["shard"],
                    waiters=r["waiters"],
                    since=r["since"],
                    timeout_at=r["timeout_at"],
                    timeout_share=share,
                    worst_share=r["worst_share"],
                    owner=owner,
                    lease_expires_at=expires,
                    kwargs=kwargs.get(h, ("{}", None))[0],
                    description=kwargs.get(h, ("{}", None))[1],
                    listed_kwargs=tuple(listed_kwargs.get(h, ())),
                    first=tuple(first.get(h, ())),
                    last_check_at=logged[0],
                    last_check=logged[1],
                )
            )
        return WaitList(now, f, groups, rows[0]["conditions"], int(rows[0]["total_waits"]))

    async def _triggerers(self, tx: Tx) -> list[TriggererHistory]:
        now = self.clock()
        shards: dict[str, list[int]] = defaultdict(list)
        for r in await tx.fetch("shard_owners"):
            shards[r["owner"]].append(r["shard"])
        samples: dict[str, list[Sample]] = defaultdict(list)
        for r in await tx.fetch("triggerer_samples", since=now - HISTORY):
            samples[r["triggerer"]].append(
                Sample(
                    r["at"], r["checks_per_s"], r["lag_p99_ms"], r["lag_max_ms"],
                    r["waits"], r["checks"], r["shards"],
                )
            )  # fmt: skip
        out = []
        listed = await tx.fetch("list_triggerers")
        for r in listed:
            out.append(
                TriggererHistory(
                    r["id"], True, r["seen_at"], r["started_at"], r["triggers"],
                    r["loop_lag_ms"], tuple(shards.get(r["id"], ())),
                    tuple(samples.pop(r["id"], ())),
                )
            )  # fmt: skip
        for gone, points in sorted(samples.items()):
            out.append(
                TriggererHistory(
                    gone, False, points[-1].at, None, None, None,
                    tuple(shards.get(gone, ())), tuple(points),
                )
            )  # fmt: skip
        return out
