"""The waits page's JSON: ``GET /api/v1/waits`` (the conditions waited on, grouped by poke
hash, filtered and paged as the page is) and ``GET /api/v1/triggerers/history`` (each
triggerer's samples of the last hour). Registered with :func:`.api.route`, so both are in
the OpenAPI document; read-only, no token needed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from executor.store.waitlist import MAX_LIMIT

from .api import ApiError, Call, route
from .waits_page import DEFAULT_LIMIT, BadFilter, cards, how_checked, parse_filter


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WaiterOut(_Out):
    run_id: str
    task_id: str
    map_index: int
    dag_id: str
    wait_started_at: float | None
    wait_timeout_at: float | None


class WaitOut(_Out):
    poke_hash: str
    classpath: str
    description: str | None
    shard: int
    triggerer: str | None  # the holder of its shard's lease (None: nobody)
    lease_live: bool  # that lease has not expired
    waiters: int
    since: float | None
    timeout_at: float | None  # the nearest timeout
    timeout_share: float | None  # share of that wait's own timeout span used
    worst_share: float | None  # the largest share any waiter has used of its own
    interval: float | None  # seconds between polls (None: held, or the class is unknown)
    push: str | None  # what pushes it (None: polled only)
    how: str  # how it is checked, in words
    last_check_at: float | None  # its newest sampled check line (at least this recent)
    last_check: str | None
    tasks: list[WaiterOut]  # the first few waiters, by task row
    more: int  # waiters not listed


class WaitsOut(_Out):
    now: float
    conditions: int  # distinct conditions matching the filters
    waits: int  # tasks waiting on them
    items: list[WaitOut]  # at most `limit`


class SampleOut(_Out):
    at: float
    checks_per_s: float
    lag_p99_ms: float | None
    lag_max_ms: float | None
    waits: int
    checks: int
    shards: int


class TriggererHistoryOut(_Out):
    id: str
    live: bool  # heartbeating now
    seen_at: float | None
    started_at: float | None
    waits: int | None  # held at its last heartbeat
    loop_lag_ms: float | None
    shards: list[int]
    samples: list[SampleOut]  # the last hour, oldest first


class TriggerersOut(_Out):
    now: float
    triggerers: list[TriggererHistoryOut]


@route(
    "GET",
    "/waits",
    summary="The conditions tasks wait on now, one per distinct check (poke hash)",
    response=WaitsOut,
    query={
        "class": "a trigger's class path (module.Class): only its conditions",
        "dag": "a DAG id: only its tasks' waits (counts too)",
        "order": "waiters (most first, the default) or oldest",
        "limit": f"conditions returned, 1-{MAX_LIMIT} ({DEFAULT_LIMIT})",
    },
    errors=(400,),
)
async def waits(call: Call) -> tuple[int, BaseModel]:
    try:
        f = parse_filter(call.request.query)
    except BadFilter as exc:
        raise ApiError(400, str(exc), exc.field) from None
    listed = await call.store.waitlist.conditions(f)
    how = await how_checked(listed.groups)
    items = []
    for g in listed.groups:
        h = how[g.poke_hash]
        items.append(
            WaitOut(
                poke_hash=g.poke_hash, classpath=g.classpath, description=g.description,
                shard=g.shard, triggerer=g.owner,
                lease_live=g.lease_expires_at is not None and g.lease_expires_at > listed.now,
                waiters=g.waiters, since=g.since, timeout_at=g.timeout_at,
                timeout_share=g.timeout_share, worst_share=g.worst_share,
                interval=h.interval, push=h.push, how=h.note,
                last_check_at=g.last_check_at, last_check=g.last_check,
                tasks=[WaiterOut(
                    run_id=w.run_id, task_id=w.task_id, map_index=w.map_index,
                    dag_id=w.dag_id, wait_started_at=w.wait_started_at,
                    wait_timeout_at=w.wait_timeout_at) for w in g.first],
                more=g.more,
            )
        )  # fmt: skip
    return 200, WaitsOut(
        now=listed.now, conditions=listed.conditions, waits=listed.waits, items=items
    )


@route(
    "GET",
    "/triggerers/history",
    summary="Each triggerer's shards and its samples of the last hour",
    response=TriggerersOut,
)
async def triggerers_history(call: Call) -> tuple[int, BaseModel]:
    waitlist = call.store.waitlist
    history = await waitlist.triggerers()
    now = waitlist.clock()
    return 200, TriggerersOut(
        now=now,
        triggerers=[
            TriggererHistoryOut(
                id=c.t.id, live=c.live, seen_at=c.t.seen_at, started_at=c.t.started_at,
                waits=c.t.waits, loop_lag_ms=c.t.loop_lag_ms, shards=list(c.t.shards),
                samples=[SampleOut(
                    at=p.at, checks_per_s=p.checks_per_s, lag_p99_ms=p.lag_p99_ms,
                    lag_max_ms=p.lag_max_ms, waits=p.waits, checks=p.checks,
                    shards=p.shards) for p in c.t.samples],
            )
            for c in cards(history, now)
        ],
    )  # fmt: skip
