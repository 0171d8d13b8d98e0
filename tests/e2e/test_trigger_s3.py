"""S3KeyTrigger against moto's real HTTP server on 127.0.0.1, counting its requests."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from datetime import date
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError
from support.exchanging import run_counts
from support.helpers import async_wait_until
from support.servers import MotoS3Server, all_events_text, run_dag, s3_conn_uri, task_log

from executor import DAG
from executor.templating import Scope, render_trigger
from triggerer.settling import TRANSIENT
from triggers.base import TransientError, TriggerEvent
from triggers.checking import CheckContext
from triggers.connections import UnknownConnection
from triggers.listing import compile_glob
from triggers.registry import TriggerLoadError, load_trigger
from triggers.s3 import S3CheckError, S3KeyTrigger

SECRET = "s3cr3t/" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3Server]:
    server = MotoS3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3(moto: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> MotoS3Server:
    """The shared server, clean counters and faults, and connection ``s3t`` pointing at it."""
    if moto._server is None:
        moto.restart()
    moto.faults.status, moto.faults.delay = None, 0.0
    moto.reset()
    monkeypatch.setenv("SLOTLESS_CONN_S3T", s3_conn_uri(moto.endpoint, secret=SECRET))
    return moto


def bucket_name() -> str:
    return "b-" + secrets.token_hex(6)


async def in_chunks(triggers: list[S3KeyTrigger], ctx, size: int = 1000) -> list:
    """What the triggerer does with a batched class: concurrent calls of at most ``size``."""
    parts = await asyncio.gather(
        *(
            S3KeyTrigger.poke_many(triggers[i : i + size], ctx)
            for i in range(0, len(triggers), size)
        )
    )
    return [r for part in parts for r in part]


# -- batching ---------------------------------------------------------------------------


async def test_one_listing_per_prefix_per_cycle_instead_of_one_request_per_key(s3):
    bucket = bucket_name()
    present = {f"p{p}/k{k:04d}.csv" for p in range(3) for k in range(0, 700, 2)}
    s3.make_bucket(bucket, sorted(present))
    triggers = [
        S3KeyTrigger(bucket=bucket, key=f"p{p}/k{k:04d}.csv", conn_id="s3t")
        for p in range(3)
        for k in range(700)
    ]  # 2,100 sensors: three chunks of the triggerer's batch size, each spanning prefixes
    ctx = CheckContext()
    try:
        results = await in_chunks(triggers, ctx)
        assert s3.counts() == {"ListObjectsV2": 3}  # one listing per prefix, not 2,100
        fired = {t.key for t, r in zip(triggers, results, strict=True) if r is not None}
        assert fired == present
        assert all(isinstance(r, TriggerEvent) or r is None for r in results)

        # The next cycle lists again (fresh answers), and sees a key that appeared.
        s3.put(bucket, "p1/k0001.csv")
        s3.reset()
        results = await in_chunks(triggers, ctx)
        assert s3.counts() == {"ListObjectsV2": 3}
        assert results[700 + 1] is not None

        # Unbatched, each check is its own request: one per key.
        s3.reset()
        sample = triggers[:200]
        for t in sample:
            await t.poke(ctx)
        assert s3.count() == len(sample)
        assert s3.count("ListObjectsV2") == len(sample)
    finally:
        await ctx.aclose()


async def test_paginated_listing_of_a_large_prefix(s3):
    bucket = bucket_name()
    s3.make_bucket(bucket, [f"big/k{i:05d}" for i in range(2500)])
    triggers = [S3KeyTrigger(bucket=bucket, key=f"big/k{i:05d}", conn_id="s3t") for i in (0, 2499)]
    ctx = CheckContext()
    try:
        results = await S3KeyTrigger.poke_many(triggers, ctx)
        assert all(r is not None for r in results)
        assert s3.count("ListObjectsV2") == 3  # 1,000 keys a page
    finally:
        await ctx.aclose()


async def test_globs_prefixes_and_min_size(s3):
    bucket = bucket_name()
    s3.make_bucket(bucket, ["in/a.csv", "in/b.txt", "in/sub/c.csv", "deep/x/y/z.parquet"])
    s3.put(bucket, "in/big.csv", b"y" * 2048)
    ctx = CheckContext()

    def t(key: str, **kw) -> S3KeyTrigger:
        return S3KeyTrigger(bucket=bucket, key=key, conn_id="s3t", **kw)

    cases = {
        t("in/*.csv"): ["in/a.csv", "in/big.csv"],  # '*' stops at '/'
        t("in/**.csv"): ["in/a.csv", "in/big.csv", "in/sub/c.csv"],
        t("in/?.txt"): ["in/b.txt"],
        t("in/[ab].*"): ["in/a.csv", "in/b.txt"],
        t("in/[!a]*.csv"): ["in/big.csv"],
        t("in/sub/"): ["in/sub/c.csv"],  # a prefix: anything under it
        t("deep/"): ["deep/x/y/z.parquet"],
        t("deep/*/y/*.parquet"): ["deep/x/y/z.parquet"],
        t("in/*.csv", min_size=1024): ["in/big.csv"],
        t("in/a.csv", min_size=1024): None,
        t("in/*.json"): None,
        t("nothing/"): None,
    }
    try:
        for batched in (True, False):
            triggers = list(cases)
            if batched:
                results = await S3KeyTrigger.poke_many(triggers, ctx)
            else:
                results = [await x.poke(ctx) for x in triggers]
            for trig, result in zip(triggers, results, strict=True):
                want = cases[trig]
                got = None if result is None else result.payload["keys"]
                assert got == want, (trig.key, batched)
                if result is not None:
                    assert result.payload["bucket"] == bucket
    finally:
        await ctx.aclose()


def test_malformed_glob_is_refused_with_a_clear_message():
    for bad in ("in/[abc.csv", "in/a].csv", "in/[].csv", "in/[a/b].csv"):
        with pytest.raises(ValidationError, match="malformed glob"):
            S3KeyTrigger(bucket="bkt", key=bad)
    # A row written with a bad glob fails to load, so its tasks fail (not the triggerer).
    with pytest.raises(TriggerLoadError, match="malformed glob"):
        load_trigger("triggers.s3.S3KeyTrigger", {"bucket": "bkt", "key": "in/[x"})
    with pytest.raises(ValidationError, match="must not start with '/'"):
        S3KeyTrigger(bucket="bkt", key="/abs")


def test_a_literal_key_is_validated_without_compiling_a_pattern():
    # Every check rebuilds its trigger: 10,000 distinct keys compiled at each build cost
    # a second of the loop per safety poll and evicted the real globs from the cache.
    before = compile_glob.cache_info()
    for i in range(100):
        S3KeyTrigger(bucket="bkt", key=f"in/p{i:02d}/obj-{i:05d}.csv")
    after = compile_glob.cache_info()
    assert (after.hits, after.misses) == (before.hits, before.misses)


def test_describe_and_serialize_carry_no_secret(s3):
    t = S3KeyTrigger(bucket="bkt", key="in/{{ ds }}.csv", conn_id="s3t")
    assert t.describe() == "s3://bkt/in/{{ ds }}.csv"
    on = Scope.for_date("d", date(2024, 1, 2), ZoneInfo("UTC"))
    assert render_trigger(t, on).describe() == "s3://bkt/in/2024-01-02.csv"
    classpath, kwargs = t.serialize()
    assert classpath == "triggers.s3.S3KeyTrigger"
    assert SECRET not in repr(kwargs)
    from triggers.connections import get_connection

    conn = get_connection("s3t")
    assert SECRET not in conn.redacted() and SECRET not in repr(conn)


# -- one client per connection ------------------------------------------------------------


async def test_one_client_per_connection_reused_across_checks(s3, monkeypatch):
    bucket = bucket_name()
    s3.make_bucket(bucket, ["k"])
    monkeypatch.setenv("SLOTLESS_CONN_S3OTHER", s3_conn_uri(s3.endpoint))
    ctx = CheckContext()
    try:
        a = S3KeyTrigger(bucket=bucket, key="k", conn_id="s3t")
        b = S3KeyTrigger(bucket=bucket, key="k", conn_id="s3other")
        await S3KeyTrigger.poke_many([a, b], ctx)
        first = ctx._shared["s3:s3t"].client
        for _ in range(3):
            await S3KeyTrigger.poke_many([a, b], ctx)
        assert ctx._shared["s3:s3t"].client is first
        assert sorted(k for k in ctx._shared if k.startswith("s3:")) == ["s3:s3other", "s3:s3t"]
        assert s3.count("ListObjectsV2") == 8  # each connection lists for itself
    finally:
        await ctx.aclose()


# -- faults, unit level ---------------------------------------------------------------------


async def test_missing_bucket_fails_only_its_checks(s3):
    bucket = bucket_name()
    s3.make_bucket(bucket, ["in/a.csv"])
    ctx = CheckContext()
    try:
        good = S3KeyTrigger(bucket=bucket, key="in/a.csv", conn_id="s3t")
        bad = S3KeyTrigger(bucket="no-such-bucket-" + bucket, key="in/a.csv", conn_id="s3t")
        r_good, r_bad = await S3KeyTrigger.poke_many([good, bad], ctx)
        assert isinstance(r_good, TriggerEvent)
        assert isinstance(r_bad, S3CheckError)
        assert not isinstance(r_bad, TRANSIENT)  # the triggerer fails the tasks at once
        assert "does not exist" in str(r_bad) and bad.bucket in str(r_bad)
    finally:
        await ctx.aclose()


async def test_refused_credentials_fail_with_a_clear_message(s3):
    bucket = bucket_name()
    s3.make_bucket(bucket, ["k"])
    ctx = CheckContext()
    s3.enforce_auth(True)  # moto now checks keys; ours is unknown to its IAM
    try:
        (result,) = await S3KeyTrigger.poke_many(
            [S3KeyTrigger(bucket=bucket, key="k", conn_id="s3t")], ctx
        )
    finally:
        s3.enforce_auth(False)
        await ctx.aclose()
    assert isinstance(result, S3CheckError) and not isinstance(result, TRANSIENT)
    assert "refused the credentials" in str(result) and "InvalidAccessKeyId" in str(result)
    assert SECRET not in str(result)


async def test_server_errors_and_slowness_are_transient(s3, monkeypatch):
    bucket = bucket_name()
    s3.make_bucket(bucket, ["k"])
    ctx = CheckContext()
    trig = S3KeyTrigger(bucket=bucket, key="k", conn_id="s3t")
    try:
        for status, code in ((503, "SlowDown"), (500, "InternalError"), (429, "TooManyRequests")):
            s3.faults.status, s3.faults.code = status, code
            (result,) = await S3KeyTrigger.poke_many([trig], ctx)
            assert isinstance(result, TransientError), (status, result)
            assert code in str(result)
        s3.faults.status = None

        # Slow: the server takes longer than the connection's read timeout.
        monkeypatch.setenv(
            "SLOTLESS_CONN_S3SLOW",
            s3_conn_uri(s3.endpoint).replace("read_timeout=5", "read_timeout=0.3"),
        )
        s3.faults.delay = 1.0
        (result,) = await S3KeyTrigger.poke_many(
            [S3KeyTrigger(bucket=bucket, key="k", conn_id="s3slow")], ctx
        )
        assert isinstance(result, TransientError), result
        s3.faults.delay = 0.0
        (result,) = await S3KeyTrigger.poke_many([trig], ctx)
        assert isinstance(result, TriggerEvent)  # and the same client works again
    finally:
        s3.faults.status, s3.faults.delay = None, 0.0
        await ctx.aclose()


async def test_server_down_is_transient_and_the_client_recovers(s3):
    bucket = bucket_name()
    s3.make_bucket(bucket, ["k"])
    ctx = CheckContext()
    trig = S3KeyTrigger(bucket=bucket, key="k", conn_id="s3t")
    try:
        assert isinstance((await S3KeyTrigger.poke_many([trig], ctx))[0], TriggerEvent)
        s3.stop()
        (result,) = await S3KeyTrigger.poke_many([trig], ctx)
        assert isinstance(result, TransientError) and "unreachable" in str(result)
        assert SECRET not in str(result)
        s3.restart()
        assert isinstance((await S3KeyTrigger.poke_many([trig], ctx))[0], TriggerEvent)
    finally:
        if s3._server is None:
            s3.restart()
        await ctx.aclose()


async def test_unknown_connection_is_not_transient(s3):
    ctx = CheckContext()
    try:
        (result,) = await S3KeyTrigger.poke_many(
            [S3KeyTrigger(bucket="bkt", key="k", conn_id="nowhere")], ctx
        )
    finally:
        await ctx.aclose()
    assert isinstance(result, UnknownConnection) and not isinstance(result, TRANSIENT)
    assert "SLOTLESS_CONN_NOWHERE" in str(result)


# -- end to end: a DAG run with a deferrable sensor ------------------------------------------


def sensor_dag(trigger: S3KeyTrigger, timeout: float = 30.0) -> DAG:
    dag = DAG("s3_" + secrets.token_hex(3))
    wait = dag.sensor("wait", trigger, mode="deferrable", timeout=timeout)

    @dag.task(parents=[wait])
    def use(ctx):
        return ctx.inputs["wait"]["keys"]

    return dag


async def deferred(store, run_id: str) -> bool:
    return any(
        t["task_id"] == "wait" and t["state"] == "DEFERRED"
        for t in await store.views.run_tasks(run_id)
    )


async def test_e2e_sensor_fires_when_the_key_lands(s3, store):
    bucket = bucket_name()
    s3.make_bucket(bucket, ["in/other.csv"])
    dag = sensor_dag(
        S3KeyTrigger(bucket=bucket, key="in/{{ ds }}.csv", conn_id="s3t", poke_interval=0.2)
    )

    async def land(run_id: str) -> None:
        await async_wait_until(lambda: deferred(store, run_id), what="the sensor to defer")
        await async_wait_until(lambda: s3.count("ListObjectsV2") >= 2, what="two checks")
        s3.put(bucket, "in/2024-01-02.csv")

    run_id, info = await run_dag(store, dag, during=land, timeout=30)
    assert info["state"] == "SUCCESS", await all_events_text(store, run_id)
    tasks = {t["task_id"]: t for t in await store.views.run_tasks(run_id)}
    assert tasks["use"]["state"] == "SUCCESS"
    log = await task_log(store, run_id, "wait")
    assert "DEFERRED" in log and f"s3://{bucket}/in/2024-01-02.csv" in log
    assert s3.count("HeadObject") == 0


async def test_e2e_reschedule_mode_runs_the_same_check_in_a_worker(s3, store):
    bucket = bucket_name()
    s3.make_bucket(bucket, [])
    dag = DAG("s3_resched_" + secrets.token_hex(3))
    dag.sensor(
        "wait",
        S3KeyTrigger(bucket=bucket, key="in/*.csv", conn_id="s3t", poke_interval=0.2),
        mode="reschedule",
        timeout=30,
    )

    async def land(run_id: str) -> None:
        await async_wait_until(lambda: s3.count("ListObjectsV2") >= 2, what="two checks")
        s3.put(bucket, "in/x.csv")

    run_id, info = await run_dag(store, dag, during=land)
    assert info["state"] == "SUCCESS", await all_events_text(store, run_id)
    assert "SENSING" in await task_log(store, run_id, "wait")


async def test_e2e_300_sensors_make_one_listing_per_prefix_per_cycle(s3, store) -> None:
    """Through the real triggerer: sensors deferred at different moments are checked on a
    grid of their interval, so each cycle is one listing per prefix, not one per sensor."""
    bucket, interval = bucket_name(), 0.5
    s3.make_bucket(bucket, [])
    dag = DAG("s3_many_" + secrets.token_hex(3))
    for p in range(3):
        for k in range(100):
            dag.sensor(
                f"wait_p{p}_k{k:03d}",
                S3KeyTrigger(
                    bucket=bucket, key=f"p{p}/k{k:03d}.csv", conn_id="s3t", poke_interval=interval
                ),
                mode="deferrable",
                timeout=60,
            )
    cycles: dict[int, int] = {}

    async def measure_then_land(run_id: str) -> None:
        async def all_deferred() -> bool:
            return (await run_counts(store, run_id)).get("DEFERRED", 0) == 300

        await async_wait_until(all_deferred, what="300 sensors to defer")
        start = (int(time.time() / interval) + 2) * interval  # a whole cycle from now on

        def listings_by_cycle() -> dict[int, int]:
            out: dict[int, int] = {}
            for r in list(s3.requests):
                if r.operation == "ListObjectsV2" and r.at >= start:
                    out[int(r.at / interval)] = out.get(int(r.at / interval), 0) + 1
            return out

        await async_wait_until(lambda: len(listings_by_cycle()) >= 5, what="five check cycles")
        cycles.update(listings_by_cycle())
        s3.seed(bucket, [f"p{p}/k{k:03d}.csv" for p in range(3) for k in range(100)])

    run_id, info = await run_dag(store, dag, during=measure_then_land, timeout=60, slots=8)
    assert info["state"] == "SUCCESS", await all_events_text(store, run_id)
    full = sorted(cycles)[:-1]  # the last one may still be under way
    assert [cycles[c] for c in full] == [3] * len(full), cycles
    assert s3.count("HeadObject") == 0


async def test_e2e_server_down_retried_logged_until_the_sensor_times_out(store, monkeypatch):
    down = MotoS3Server().start()  # its own server: stopping it disturbs no other test
    down.make_bucket(bucket := bucket_name(), [])
    monkeypatch.setenv("SLOTLESS_CONN_S3DOWN", s3_conn_uri(down.endpoint, secret=SECRET))
    down.stop()
    dag = sensor_dag(
        S3KeyTrigger(bucket=bucket, key="k", conn_id="s3down", poke_interval=0.2), timeout=3
    )
    run_id, info = await run_dag(store, dag, timeout=30)
    assert info["state"] == "FAILED"
    log = await task_log(store, run_id, "wait")
    assert "failed (TransientError: S3 unreachable" in log and "retry 1 in" in log, log
    assert "sensor timeout" in log
    assert log.count("retry ") >= 2  # retried with backoff, each retry in the task's log
    tasks = {t["task_id"]: t["state"] for t in await store.views.run_tasks(run_id)}
    assert tasks == {"wait": "FAILED", "use": "UPSTREAM_FAILED"}
    assert SECRET not in await all_events_text(store, run_id)


async def test_e2e_missing_bucket_fails_at_once_with_a_clear_message(s3, store):
    dag = sensor_dag(
        S3KeyTrigger(bucket="no-such-" + bucket_name(), key="k", conn_id="s3t", poke_interval=0.2),
        timeout=600,
    )
    run_id, info = await run_dag(store, dag, timeout=30)
    assert info["state"] == "FAILED"
    log = await task_log(store, run_id, "wait")
    assert "does not exist" in log and "S3CheckError" in log
    assert "sensor timeout" not in log


async def test_e2e_malformed_glob_after_rendering_fails_the_sensor(s3, store):
    bucket = bucket_name()
    s3.make_bucket(bucket, [])
    dag = sensor_dag(S3KeyTrigger(bucket=bucket, key="in/{{ run_id }}*.csv", conn_id="s3t"))
    run_id, info = await run_dag(store, dag, run_id="batch[7", timeout=30)
    assert info["state"] == "FAILED"
    log = await task_log(store, run_id, "wait")
    assert "cannot render the sensor's trigger" in log and "malformed glob" in log, log
    assert s3.count() == 0  # never checked


async def test_e2e_unknown_connection_and_refused_credentials_fail(s3, store):
    bucket = bucket_name()
    s3.make_bucket(bucket, [])
    dag = sensor_dag(S3KeyTrigger(bucket=bucket, key="k", conn_id="no_such_conn"), timeout=600)
    run_id, info = await run_dag(store, dag, timeout=30)
    assert info["state"] == "FAILED"
    assert "unknown connection id 'no_such_conn'" in await task_log(store, run_id, "wait")

    dag = sensor_dag(S3KeyTrigger(bucket=bucket, key="k", conn_id="s3t"), timeout=600)
    s3.enforce_auth(True)
    try:
        run_id, info = await run_dag(store, dag, timeout=30)
    finally:
        s3.enforce_auth(False)
    assert info["state"] == "FAILED"
    log = await task_log(store, run_id, "wait")
    assert "refused the credentials" in log
    assert SECRET not in await all_events_text(store, run_id)
