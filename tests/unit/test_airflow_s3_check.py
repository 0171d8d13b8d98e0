"""The native S3KeyTrigger check (triggerer/airflow/native_s3.py) against moto's real S3
server on 127.0.0.1, without Airflow: the connection is given as Airflow's provider would
resolve it, everything from the listing on is the code the airflow-triggerer runs.

What is shown: the provider's answer (a key exists when listed, a list when all its keys
are, a wildcard through ``fnmatch``, whose ``*`` crosses ``/``), many waits under one
directory answered by one ListObjectsV2 per interval (counted by moto), a missing bucket
failing in one line, and S3 answering 503 failing nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.helpers import async_wait_until
from support.servers import MotoS3Server

from triggerer.airflow.native_s3 import NotNative, S3Failed, S3Native, _Conn
from triggerer.airflow.plans import S3KEY, plan


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3Server]:
    server = MotoS3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3(moto: MotoS3Server) -> MotoS3Server:
    moto.faults.status, moto.faults.delay = None, 0.0
    moto.reset()
    return moto


def _native(moto: MotoS3Server) -> S3Native:
    def resolve(conn_id: str | None, region: str | None, verify: bool | None) -> _Conn:
        if conn_id == "assumes":
            raise NotNative("connection 'assumes' assumes a role (role_arn)")
        extra = {"region_name": "us-east-1", "endpoint_url": moto.endpoint, "max_attempts": "1"}
        return _Conn(conn_id or "none", "testing", "testing", extra)

    return S3Native(resolve=resolve)


def _key(bucket: str, key: str | list[str], **kwargs: Any) -> tuple[Any, ...]:
    p = plan(S3KEY, {"bucket_name": bucket, "bucket_key": key, **kwargs})
    assert p.kind == "s3"
    return p.key


async def _first_check(native: S3Native, key: tuple[Any, ...]) -> str:
    """What one check of ``key`` finds ("found", "no match yet")."""
    said: list[str] = []
    task = asyncio.create_task(native.wait(key, lambda: 60.0, said.append))
    try:
        await async_wait_until(lambda: said or task.done(), timeout=10, what="a check")
        return said[0]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_providers_answer_from_a_listing(s3: MotoS3Server) -> None:
    bucket = "native-answers"
    s3.make_bucket(bucket, ["in/a.csv", "in/sub/deep.csv", "in/dir/", "other.csv"])
    native = _native(s3)
    try:
        cases: list[tuple[tuple[Any, ...], str]] = [
            (_key(bucket, "in/a.csv"), "found"),
            (_key(bucket, "in/a"), "no match yet"),  # a prefix of a key is not the key
            (_key(bucket, "in/dir/"), "found"),  # a "folder" object, listed under itself
            (_key(bucket, "in/sub"), "no match yet"),
            (_key(bucket, "other.csv"), "found"),  # at the bucket's root
            (_key(bucket, ["in/a.csv", "other.csv"]), "found"),  # all of them ...
            (_key(bucket, ["in/a.csv", "in/b.csv"]), "no match yet"),  # ... not one of them
            # fnmatch, as the provider: its * crosses "/".
            (_key(bucket, "in/*.csv", wildcard_match=True), "found"),
            (_key(bucket, "in/*/deep.csv", wildcard_match=True), "found"),
            (_key(bucket, "in/s?b/*.csv", wildcard_match=True), "found"),
            (_key(bucket, "in/[!s]*/deep.csv", wildcard_match=True), "no match yet"),
            (_key(bucket, "in/*.txt", wildcard_match=True), "no match yet"),
            (_key(bucket, "in/a.csv", wildcard_match=True), "found"),  # no magic: itself
        ]
        for key, want in cases:
            assert await _first_check(native, key) == want, key
        assert s3.count("HeadObject") == 0
    finally:
        await native.close()


async def test_waits_under_one_directory_share_one_listing_per_interval(
    s3: MotoS3Server,
) -> None:
    bucket = "native-shared"
    s3.make_bucket(bucket, ["elsewhere/x"])
    native = _native(s3)
    keys = [_key(bucket, f"in/k{i}.csv", poke_interval=0.3) for i in range(10)]
    keys.append(_key(bucket, "in/*/late.csv", wildcard_match=True, poke_interval=0.3))
    checks: Counter[tuple[Any, ...]] = Counter()

    def on_check(key: tuple[Any, ...]) -> Callable[[str], None]:
        return lambda result: checks.update([key])

    tasks = [asyncio.create_task(native.wait(k, lambda: 0.3, on_check(k))) for k in keys]
    try:
        await async_wait_until(
            lambda: min(checks[k] for k in keys) >= 5, timeout=20, what="5 checks each"
        )
        listings = s3.count("ListObjectsV2")
        # 11 waits checked 5+ times each (55+ checks) from one listing per interval: a
        # listing per wait per check would be 55 or more.
        assert 5 <= listings <= max(checks.values()) + 1, (listings, checks)
        assert listings == native.listings
        assert s3.count() == listings  # no HEAD, nothing else
        for i in range(10):
            s3.put(bucket, f"in/k{i}.csv")
        assert not any(t.done() for t in tasks)
        s3.put(bucket, "in/deep/late.csv")
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await native.close()


async def test_a_missing_bucket_fails_in_one_line(s3: MotoS3Server) -> None:
    native = _native(s3)
    try:
        with pytest.raises(S3Failed) as info:
            await asyncio.wait_for(native.wait(_key("no-such", "a"), lambda: 0.2, print), 10)
        said = str(info.value)
        assert "'no-such' does not exist" in said and "\n" not in said
    finally:
        await native.close()


async def test_s3_unavailable_is_retried_and_fails_nothing(s3: MotoS3Server) -> None:
    bucket = "native-flaky"
    s3.make_bucket(bucket)
    native = _native(s3)
    said: list[str] = []
    s3.faults.status, s3.faults.code = 503, "ServiceUnavailable"
    task = asyncio.create_task(native.wait(_key(bucket, "in/a"), lambda: 0.2, said.append))
    try:
        await async_wait_until(
            lambda: sum(s.startswith("retrying") for s in said) >= 2 or task.done(),
            timeout=10,
            what="two retries",
        )
        assert not task.done(), said
        s3.faults.status = None
        s3.put(bucket, "in/a")
        await asyncio.wait_for(task, 10)
        assert said[-1] == "found"
    finally:
        s3.faults.status = None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await native.close()


async def test_a_connection_the_native_client_does_not_do_is_said_before_any_check(
    s3: MotoS3Server,
) -> None:
    native = _native(s3)
    with pytest.raises(NotNative, match="role_arn"):
        await native.wait(_key("b", "a", aws_conn_id="assumes"), lambda: 0.2, print)
    assert s3.count() == 0
