"""S3 waits woken by the bucket's event notifications through SQS, on moto's real server:
one consumer per queue, no LIST while idle, and a queue that disappears or sends garbage
fails nothing (polling takes over, with a log line)."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.helpers import async_wait_until
from support.servers import MotoS3Server, s3_conn_uri
from support.triggers import serving, task_row, task_rows

from executor import DAG
from triggers.s3 import S3KeyTrigger
from triggers.s3_events import NotS3Event, event_objects, event_topics

DAY = date(2026, 4, 25)
HOUR = 3600.0

pytestmark = pytest.mark.usefixtures("fresh_triggers")


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3Server]:
    server = MotoS3Server().start()
    yield server
    server.stop()


def sqs(moto: MotoS3Server) -> Any:
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=moto.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


def notifying_bucket(moto: MotoS3Server) -> tuple[str, str]:
    """A new bucket that publishes ObjectCreated events to a new queue: (bucket, queue url)."""
    bucket, queue = "b-" + secrets.token_hex(6), "q-" + secrets.token_hex(6)
    moto.client().create_bucket(Bucket=bucket)
    q = sqs(moto)
    url = q.create_queue(QueueName=queue)["QueueUrl"]
    arn = q.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    moto.client().put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]
        },
    )
    q.purge_queue(QueueUrl=url)  # the test event sent on configuration
    moto.reset()
    return bucket, url


@pytest.fixture
def events(moto: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Connection ``s3e``: moto, and the queue its new bucket notifies."""
    moto.faults.status, moto.faults.delay = None, 0.0
    bucket, url = notifying_bucket(moto)
    uri = s3_conn_uri(moto.endpoint) + f"&events_queue={quote(url, safe='')}&events_wait=1"
    monkeypatch.setenv("SLOTLESS_CONN_S3E", uri)
    return bucket, url


def s3_waits(dag_id: str, bucket: str, keys: list[str], interval: float = HOUR) -> DAG:
    dag = DAG(dag_id)

    @dag.task
    def items(ctx):
        return keys

    @dag.task(expand=items)
    def wait(ctx):
        trig = S3KeyTrigger(bucket=bucket, key=ctx.item, conn_id="s3e", poke_interval=interval)
        ctx.defer(trig, method="done")

    @wait.method
    def done(ctx):
        return ctx.event

    return dag


# A resting S3 check is next due at the safety interval's next grid point (triggers/s3.py
# puts checks on a grid so that one listing serves them all): anywhere from 0 s to the
# whole interval away, depending on the wall clock. A woken check is due within a second
# (its push's recheck). More than this apart, it rests, and the few long polls a test
# watches next cannot meet its grid point.
RESTING_S = 5.0


def checked_and_resting(trig: Any) -> bool:
    """No check running, and each next due on the slow safety interval, not soon: the
    checks a push or the source's start asked for have all been made."""
    return all(
        not c.running and c.due - trig.clock() > RESTING_S for c in trig.table.by_hash.values()
    )


def not_resting(trig: Any) -> str:
    """What keeps :func:`checked_and_resting` false, for a failure to say."""
    now = trig.clock()
    busy = [
        f"{c.poke_hash[:8]} running={c.running} due_in={c.due - now:.2f} failures={c.failures}"
        for c in trig.table.by_hash.values()
        if c.running or c.due - now <= RESTING_S
    ]
    return f"{len(busy)} checks not resting ({'; '.join(busy[:5])}); sources {trig.push.sources}"


async def wait_resting(trig: Any, moto: MotoS3Server, what: str) -> None:
    try:
        await async_wait_until(lambda: checked_and_resting(trig), what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {not_resting(trig)}; moto saw {moto.counts()}") from None


def all_in(db_path: Path, run_id: str, state: str, n: int) -> bool:
    rows = [r for r in task_rows(db_path, run_id, "wait") if r["map_index"] >= 0]
    return len(rows) == n and all(r["state"] == state for r in rows)


def test_notifications_name_their_objects_and_garbage_is_told_apart() -> None:
    body = {"Records": [{"s3": {"bucket": {"name": "b"}, "object": {"key": "in/a+b%3D.csv"}}}]}
    assert event_topics(json.dumps(body)) == ["b/in/a b=.csv"]
    sns = {"Type": "Notification", "Message": json.dumps(body)}
    assert event_topics(json.dumps(sns)) == ["b/in/a b=.csv"]
    assert event_topics(json.dumps({"Event": "s3:TestEvent", "Bucket": "b"})) == []
    # Only a creation with a size says the object is there, that large.
    created = {
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": "b"}, "object": {"key": "k", "size": 5}},
    }
    removed = {**created, "eventName": "ObjectRemoved:Delete"}
    assert event_objects(json.dumps({"Records": [created, removed]})) == [("b/k", 5), ("b/k", None)]
    for bad in ("hello", "[1]", "{}", json.dumps({"Records": [{"s3": {}}]})):
        with pytest.raises(NotS3Event):
            event_topics(bad)


async def test_one_consumer_wakes_every_wait_and_no_listing_while_idle(
    moto, events, store, db_path
) -> None:
    bucket, _ = events
    n = 40
    keys = [f"in/{i:03d}.csv" for i in range(n - 2)] + ["glob/*.csv", "pre/"]
    dag = s3_waits("push_s3", bucket, keys)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", n), what="deferred")
        key = ("sqs", "s3e", events[1])
        await async_wait_until(lambda: trig.push.live(key), what="the consumer is live")
        assert list(trig.push.sources) == [key]  # one consumer for 40 waits
        # After the checks the source's start asked for, nothing lists: idle is silent.
        await wait_resting(trig, moto, "the start's checks")
        listed, polls = moto.count("ListObjectsV2"), moto.count("sqs:ReceiveMessage")
        await async_wait_until(
            lambda: moto.count("sqs:ReceiveMessage") >= polls + 2, what="two more long polls"
        )
        assert moto.count("ListObjectsV2") == listed
        for k in keys[:-2]:
            moto.put(bucket, k)
        moto.put(bucket, "glob/x.csv")
        moto.put(bucket, "pre/deep/y")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", n), what="all woken")
        await async_wait_until(lambda: not trig.push.sources, what="consumer closed")


async def test_a_notified_key_is_answered_by_its_notification_not_a_listing(
    moto, events, store, db_path
) -> None:
    bucket, _ = events
    moto.seed(bucket, [f"in/other-{i:03d}.csv" for i in range(50)])  # beside the waits
    keys = [f"in/{i:02d}.csv" for i in range(10)]
    dag = s3_waits("push_s3_exact", bucket, keys)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", 10), what="deferred")
        key = ("sqs", "s3e", events[1])
        await async_wait_until(lambda: trig.push.live(key), what="the consumer is live")
        q, url = sqs(moto), events[1]

        async def drained() -> bool:  # the seed's notifications read
            names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
            # In a thread: a blocking call on the loop would starve the triggerer it watches.
            got = await asyncio.to_thread(
                q.get_queue_attributes, QueueUrl=url, AttributeNames=names
            )
            return all(int(got["Attributes"][n]) == 0 for n in names)

        await async_wait_until(drained, what="the seed's notifications read")
        await wait_resting(trig, moto, "idle")  # every wait checked since
        moto.reset()
        moto.put(bucket, keys[3])
        await async_wait_until(
            lambda: task_row(db_path, run_id, "wait", 3)["state"] == "SUCCESS", what="woken"
        )
        listed = [r.query.get("prefix") for r in moto.requests if r.operation == "ListObjectsV2"]
        # The notification (ObjectCreated, with the object's size) answered the woken wait:
        # no page of the folder's 60 objects, no request at all.
        assert listed == []
        rows = [r for r in task_rows(db_path, run_id, "wait") if r["map_index"] >= 0]
        assert sorted(r["state"] for r in rows) == ["DEFERRED"] * 9 + ["SUCCESS"]


async def test_a_queue_that_disappears_falls_back_to_polling(
    moto, events, store, db_path, caplog
) -> None:
    bucket, url = events
    caplog.set_level(logging.WARNING, logger="slotless.triggerer.push")
    dag = s3_waits("push_s3_gone", bucket, ["a.csv"], interval=0.3)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True, "push_retry": 60.0}) as h:
        trig = h.triggerer
        assert trig is not None
        key = ("sqs", "s3e", url)
        await async_wait_until(lambda: trig.push.live(key), what="the consumer is live")
        sqs(moto).delete_queue(QueueUrl=url)
        await async_wait_until(lambda: "does not exist" in caplog.text, what="the fallback")
        assert not trig.push.live(key)
        moto.put(bucket, "a.csv")  # no queue to tell: polling finds it
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 1), what="polled")
        assert moto.count("ListObjectsV2") >= 1


async def test_garbage_on_the_queue_fails_nothing_and_falls_back_to_polling(
    moto, events, store, db_path, caplog
) -> None:
    bucket, url = events
    caplog.set_level(logging.WARNING, logger="slotless.triggerer.push")
    dag = s3_waits("push_s3_garbage", bucket, ["a.csv", "b.csv"], interval=0.3)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True, "push_retry": 60.0}) as h:
        trig = h.triggerer
        assert trig is not None
        key = ("sqs", "s3e", url)
        await async_wait_until(lambda: trig.push.live(key), what="the consumer is live")
        sqs(moto).send_message(QueueUrl=url, MessageBody="this is not an S3 event")
        await async_wait_until(
            lambda: "not an S3 event notification" in caplog.text, what="the fallback"
        )
        assert not trig.push.live(key)
        assert all_in(db_path, run_id, "DEFERRED", 2)  # nothing failed
        # The garbage was deleted, not left to come back.
        attrs = sqs(moto).get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "0"
        moto.seed(bucket, ["a.csv", "b.csv"])  # straight into the backend: no notification
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 2), what="polled")


async def test_an_aws_client_reads_botocore_data_files_off_the_loop(moto, monkeypatch) -> None:
    """Creating a client reads botocore's models (~0.25 s of disk and JSON): the shared
    loader reads them in a thread the first time, so the loop reads none, then or later."""
    import threading

    from triggers import s3_events
    from triggers.connections import parse_connection

    monkeypatch.setattr(s3_events, "_LOADER", None)
    monkeypatch.setattr(s3_events, "_WARMED", set())
    loader = s3_events._session().get_component("data_loader")
    loop_thread, on_loop, anywhere = threading.get_ident(), [], []
    real = loader.file_loader.load_file

    def load_file(path: str) -> Any:
        anywhere.append(path)
        if threading.get_ident() == loop_thread:
            on_loop.append(path)
        return real(path)

    monkeypatch.setattr(loader.file_loader, "load_file", load_file)
    conn = parse_connection("aws", s3_conn_uri(moto.endpoint))
    for service in ("sqs", "s3", "s3"):
        cm = await s3_events.aws_client(conn, service, {})
        async with cm as client:
            if service == "sqs":
                await client.list_queues()
            else:
                await client.list_buckets()
    assert anywhere, "the spy saw no file read: it does not watch the loader"
    assert on_loop == []
