"""Pools and queues: how many tasks of a kind may run at once, and which workers run them.

A **pool** bounds the tasks that hold its slots across every worker: ``DAG.task(...,
pool="warehouse", pool_slots=1)`` with ``slotless pools set warehouse 4`` lets at most four
slots of ``warehouse`` be RUNNING at any instant. ``default`` is the pool of every task that
names none; it is unlimited and never stored. Only RUNNING rows hold slots: a DEFERRED or
SENSING sensor, a RETRYING task, a reaped or cancelled attempt hold none.

A **queue** says which workers may run a task: ``DAG.task(..., queue="gpu")`` runs only on
a worker started with ``slotless worker --queues gpu`` (a worker serves ``default`` unless
told otherwise). A queue other than ``default`` is *known* once declared with ``slotless
queues add NAME``; a pool is known once set. A DAG naming an unknown pool or queue is
refused where it meets the store (a run created, a file catalogued), naming it.

How the claim keeps a pool's bound (:func:`claim_rounds`, inside ``Exchange.exchange``'s one
write transaction): candidates are read (``claim_candidates``: the worker's queues, pools
that exist and were not full when the statement began); the pools they name are locked
(``lock_pools``: on PostgreSQL ``FOR UPDATE SKIP LOCKED`` on the pool rows, so two
claimers of one pool take turns and a claimer never waits for another); the slots in use
are counted under that lock (``pool_running``: under READ COMMITTED this statement sees
every claim committed by whoever held the lock before); :func:`admit` takes candidates in
claim order while they fit. A candidate that does not fit, or whose pool another claimer
holds, stays where it is, and its pool is left out of the next round. On SQLite the write
transaction already excludes every other claimer.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store imports this module: annotations only
    from .driver.db import Row, Tx

DEFAULT = "default"  # the default pool (unlimited) and the default queue
# Names as people type them: a letter or digit first, then letters, digits, _ - . (at most 64).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Rounds of candidates per claim: a round ends when a pool is full, the next leaves it out.
CLAIM_ROUNDS = 4


class PoolError(ValueError):
    """A refused pool or queue operation (a bad name or size, a pool still in use)."""


def check_name(kind: str, name: object) -> str:
    """``name`` if it is a valid pool or queue name, else :class:`PoolError` naming it."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise PoolError(
            f"invalid {kind} name {name!r}: use 1-64 letters, digits, _ - . "
            "(starting with a letter or digit)"
        )
    return name


def check_slots(slots: object) -> int:
    """A pool size: a whole number >= 0 (0 holds every task of the pool back)."""
    if isinstance(slots, str):
        try:
            slots = int(slots)
        except ValueError:
            raise PoolError(f"pool slots must be a whole number >= 0, not {slots!r}") from None
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 0:
        raise PoolError(f"pool slots must be a whole number >= 0, not {slots!r}")
    return slots


def parse_queues(text: str) -> tuple[str, ...]:
    """``"gpu,default"`` -> ``("gpu", "default")``: a worker's ``--queues``."""
    names = tuple(dict.fromkeys(q.strip() for q in text.split(",") if q.strip()))
    if not names:
        raise PoolError(f"--queues names no queue: {text!r}")
    for q in names:
        check_name("queue", q)
    return names


@dataclass(frozen=True, slots=True)
class Candidate:
    id: int
    state: str
    pool: str
    pool_slots: int


def admit(
    candidates: Iterable[Candidate], sizes: Mapping[str, int | None], used: dict[str, int]
) -> tuple[list[Candidate], set[str]]:
    """The candidates that fit, in order, and the pools that turned one away.

    ``sizes`` is each locked pool's size (None: not locked here, another claimer holds it);
    ``used`` its slots in use, updated with what is admitted.
    """
    taken: list[Candidate] = []
    full: set[str] = set()
    for c in candidates:
        if c.pool == DEFAULT:
            taken.append(c)
            continue
        size = sizes.get(c.pool)
        now_used = used.get(c.pool, 0)
        if size is not None and now_used + c.pool_slots <= size:
            used[c.pool] = now_used + c.pool_slots
            taken.append(c)
        else:
            full.add(c.pool)
    return taken, full


class _Rounds:
    """State carried across the rounds of one claim."""

    def __init__(self) -> None:
        self.full: set[str] = set()
        self.sizes: dict[str, int | None] = {}
        self.used: dict[str, int] = {}


async def claim_rounds(
    tx: Tx, now: float, queues: Sequence[str], limit: int, busy: Sequence[int] = ()
) -> AsyncIterator[list[Candidate]]:
    """Up to ``limit`` claimable rows of ``queues`` that fit their pools, in claim order,
    round by round, inside the write transaction that claims them (``Exchange.exchange``).
    Rows in ``busy`` are left to other claimers.
    The caller moves each round's rows to RUNNING before asking for the next, so the next
    round's candidates (read after) do not include them."""
    st = _Rounds()
    left = limit
    for _ in range(CLAIM_ROUNDS):
        if left <= 0:
            return
        rows = await tx.fetch(
            "claim_candidates",
            now=now, n=left, queues=list(queues), full=sorted(st.full), busy=list(busy),
        )  # fmt: skip
        if not rows:
            return
        cands = [Candidate(r["id"], r["state"], r["pool"], r["pool_slots"]) for r in rows]
        new = sorted({c.pool for c in cands if c.pool != DEFAULT and c.pool not in st.sizes})
        if new:
            got = {r["name"]: r["slots"] for r in await tx.fetch("lock_pools", names=new)}
            for name in new:
                st.sizes[name] = got.get(name)  # None: another claimer holds it (or deleted)
            if got:
                for r in await tx.fetch("pool_running", names=sorted(got)):
                    st.used[r["pool"]] = int(r["used"])
        taken, full = admit(cands, st.sizes, st.used)
        st.full |= full
        left -= len(taken)
        if taken:
            yield taken
        if not full:  # every candidate fit: the limit is reached or nothing else is ready
            return


# -- why a ready task is not running (status, the web page) ----------------------------


@dataclass(frozen=True, slots=True)
class PoolUse:
    name: str
    slots: int | None  # None: unlimited (default)
    used: int
    ready: int  # tasks ready to run in it (claimable now)


def held_back(row: Row, pools: Mapping[str, PoolUse], served: set[str]) -> str | None:
    """Why a ready task in a limited pool or another queue is not running, or None (it is
    only waiting for a free worker slot, like any other)."""
    pool = row["pool"]
    if pool != DEFAULT:
        use = pools.get(pool)
        if use is None:
            return f"waiting for pool {pool} (no such pool: slotless pools set {pool} SLOTS)"
        assert use.slots is not None
        if use.used + row["pool_slots"] > use.slots:
            needs = "" if row["pool_slots"] == 1 else f", needs {row['pool_slots']}"
            return f"waiting for pool {pool} ({use.used}/{use.slots} used{needs})"
    queue = row["queue"]
    if queue not in served:
        return f"waiting for a worker of queue {queue} (no live worker serves it)"
    return None


def unknown(
    kind: str, wanted: Mapping[str, Sequence[str]], known: Iterable[str], how: str
) -> str | None:
    """An error naming every unknown pool or queue (``wanted``: name -> tasks naming it)."""
    missing = sorted(set(wanted) - set(known) - {DEFAULT})
    if not missing:
        return None
    parts = [f"{kind} {name!r} (task {', '.join(sorted(wanted[name]))})" for name in missing]
    return f"unknown {'; '.join(parts)}: {how}"
