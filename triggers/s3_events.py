"""S3 waits pushed by the bucket's event notifications, read from an SQS queue.

A bucket that publishes ``s3:ObjectCreated:*`` notifications to an SQS queue (directly,
or through an SNS topic with raw delivery off or on) lets the triggerer hear of a new
object instead of listing for it. The S3 connection names the queue in its extras, so
no DAG changes::

    SLOTLESS_CONN_LAKE='s3://KEY:SECRET@?region_name=eu-west-1&events_queue=https%3A%2F%2Fsqs...%2Flake-events'

* ``events_queue``: the queue's URL (or its name, looked up with ``GetQueueUrl``);
* ``events_buckets``: the buckets that publish to it, comma separated (default: every
  bucket reached through this connection);
* ``events_wait``: seconds a receive may wait for a message (long poll; default 20, the
  most SQS allows);
* ``events_receivers``: receives in flight at once (default 4, at most 10): one receive
  takes at most 10 messages, so a burst of puts drains that many times faster.

One consumer per queue (per connection id and queue), however many waits: long polls of
up to 10 messages at a time, each message's objects wake the waits on that bucket and key
(a glob or prefix wait: any key it matches), then the batch is deleted. The credentials
need ``sqs:ReceiveMessage``, ``sqs:DeleteMessage`` and ``sqs:GetQueueUrl`` besides S3's.

A queue that does not exist (or disappears), refuses the credentials, or sends a message
that is not an S3 event notification stops the consumer with
:class:`~triggers.push.PushUnavailable`: the triggerer logs why, polls the waits at their
own interval and opens the consumer again later. Each message is consumed once, so each
triggerer needs a queue of its own (SNS fan-out to one queue per triggerer; the queue is
read from the triggerer's environment, so each may name its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_plus

from .push import PushSource, PushUnavailable, Wake

MAX_GARBAGE_SHOWN = 200  # characters of a bad message quoted in the log line
TRANSIENT_RETRIES = 5  # a receive failing with a 5xx or throttling is retried this often
HEARD_KEYS = 100_000  # notified keys remembered until their wait is checked (Heard)


class NotS3Event(ValueError):
    """A message on the queue that is not an S3 event notification."""


def event_topics(body: str) -> list[str]:
    """``bucket/key`` of every object an S3 notification (or its SNS envelope) names.

    A test event (sent when notifications are configured) names none. Raises
    :class:`NotS3Event` for anything else.
    """
    return [topic for topic, _ in event_objects(body)]


def event_objects(body: str) -> list[tuple[str, int | None]]:
    """``(bucket/key, size)`` of every object a notification names; the size only for an
    ``ObjectCreated`` record that gives one (any other event says nothing of the object
    being there). Raises :class:`NotS3Event` as :func:`event_topics` does."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise NotS3Event(f"not JSON ({exc})") from None
    if isinstance(doc, dict) and doc.get("Type") == "Notification" and "Message" in doc:
        return event_objects(str(doc["Message"]))  # an SNS envelope around the event
    if not isinstance(doc, dict):
        raise NotS3Event("not a JSON object")
    if doc.get("Event") == "s3:TestEvent":
        return []
    records = doc.get("Records")
    if not isinstance(records, list):
        raise NotS3Event("no Records")
    objects: list[tuple[str, int | None]] = []
    for rec in records:
        try:
            bucket = rec["s3"]["bucket"]["name"]
            key = rec["s3"]["object"]["key"]
        except (KeyError, TypeError):
            raise NotS3Event("a record without s3.bucket.name and s3.object.key") from None
        if not isinstance(bucket, str) or not isinstance(key, str):
            raise NotS3Event("a record whose bucket or key is not a string")
        size = rec["s3"]["object"].get("size")
        created = str(rec.get("eventName", "")).startswith("ObjectCreated")
        known = size if created and isinstance(size, int) and not isinstance(size, bool) else None
        # Keys arrive URL-encoded, spaces as '+' (as S3 sends them).
        objects.append((f"{bucket}/{unquote_plus(key)}", known))
    return objects


class Heard:
    """What the queues of one connection said lately, for its checks to act on (shared
    through the trigger context as ``s3-heard:<conn_id>``).

    * ``buckets``: when a notification about each bucket was last read (monotonic): a
      listing sent before that may not show the object, so a check does not share it;
    * ``keys``: exact ``bucket/key`` topics read and not yet checked, with the size an
      ``ObjectCreated`` record gave: a woken exact-key wait is answered from it (the
      object was created, that large) and, without a size, lists that key alone instead
      of its whole folder. At most :data:`HEARD_KEYS` kept.
    """

    def __init__(self) -> None:
        self.buckets: dict[str, float] = {}
        self.keys: dict[str, int | None] = {}

    @classmethod
    async def create(cls) -> Heard:
        return cls()

    def note(self, objects: list[tuple[str, int | None]]) -> None:
        now = time.monotonic()
        for topic, size in objects:
            self.buckets[topic.partition("/")[0]] = now
            self.keys.pop(topic, None)  # moved to the end: the newest
            self.keys[topic] = size
        while len(self.keys) > HEARD_KEYS:  # the oldest first: they were checked long ago
            del self.keys[next(iter(self.keys))]


class SqsEventQueue(PushSource):
    """One long-poll consumer of one queue of S3 event notifications."""

    def __init__(self, conn_id: str, queue: str) -> None:
        self.conn_id = conn_id
        self.queue = queue
        self.received = 0  # messages read (for tests and benchmarks)
        self.requests = 0  # SQS requests made

    def describe(self) -> str:
        return f"S3 event queue {self.queue} (connection {self.conn_id!r})"

    async def run(self, ctx: Any, ready: Callable[[], None], wake: Wake) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        conn = ctx.connection(self.conn_id)
        wait = max(0, min(20, int(float(conn.extra.get("events_wait", 20)))))
        receivers = max(1, min(10, int(conn.extra.get("events_receivers", 4))))
        try:
            cm = await _client(conn)
            client = await cm.__aenter__()
        except Exception as exc:
            raise PushUnavailable(f"cannot open an SQS client: {exc}") from exc
        heard: Heard = await ctx.shared(f"s3-heard:{self.conn_id}", Heard.create)
        try:
            url = await self._resolve(client)
            ready()  # the queue keeps what is sent from now on until it is read
            loops = [
                asyncio.ensure_future(self._consume(client, url, wait, wake, heard))
                for _ in range(receivers)
            ]
            try:
                done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # the first failure, as raised
            finally:
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
        except (ClientError, BotoCoreError) as exc:
            raise PushUnavailable(f"queue {self.queue}: {_why(exc)}") from exc
        except (OSError, TimeoutError) as exc:
            raise PushUnavailable(f"queue {self.queue} unreachable: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                await cm.__aexit__(None, None, None)

    async def _consume(self, client: Any, url: str, wait: int, wake: Wake, heard: Heard) -> None:
        """One receive loop: long polls, each batch deleted while the next is awaited."""
        deleting: asyncio.Task[None] | None = None
        try:
            while True:
                batch = await self._receive(client, url, wait)
                if deleting is not None:
                    await deleting  # at most one delete in flight; its error raises here
                    deleting = None
                if not batch:
                    continue
                bad = self._handle(batch, wake, heard)
                # Deleted while the next receive waits (a round trip saved per batch);
                # garbage too, or it would come back forever.
                deleting = asyncio.ensure_future(self._delete(client, url, batch))
                if bad is not None:
                    await deleting
                    raise PushUnavailable(f"a message that is not an S3 event notification ({bad})")
        finally:
            if deleting is not None and not deleting.done():
                deleting.cancel()

    async def _resolve(self, client: Any) -> str:
        self.requests += 1
        if self.queue.startswith(("http://", "https://")):
            await client.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])
            return self.queue
        return str((await client.get_queue_url(QueueName=self.queue))["QueueUrl"])

    async def _receive(self, client: Any, url: str, wait: int) -> list[dict[str, Any]]:
        resp = await self._call(
            client.receive_message, QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait
        )
        return list(resp.get("Messages", ()))

    async def _call(self, op: Any, **kwargs: Any) -> Any:
        """One SQS request; a passing failure (5xx, throttled) is retried a few times with
        a short backoff before the consumer gives up (one error is no reason to poll)."""
        from botocore.exceptions import ClientError

        attempt = 0
        while True:
            self.requests += 1
            try:
                return await op(**kwargs)
            except ClientError as exc:
                if attempt == TRANSIENT_RETRIES or not _transient(exc):
                    raise
            await asyncio.sleep(0.1 * 2**attempt)
            attempt += 1

    def _handle(self, batch: list[dict[str, Any]], wake: Wake, heard: Heard) -> str | None:
        """Wake the waits the batch names; what was wrong with the first bad message."""
        self.received += len(batch)
        objects: list[tuple[str, int | None]] = []
        bad: str | None = None
        for msg in batch:
            try:
                objects.extend(event_objects(str(msg.get("Body", ""))))
            except NotS3Event as exc:
                if bad is None:
                    shown = str(msg.get("Body", ""))[:MAX_GARBAGE_SHOWN]
                    bad = f"{exc}: {shown!r}"
        if objects:
            heard.note(objects)  # before the wake: the woken checks read it
            wake([topic for topic, _ in objects])
        return bad

    async def _delete(self, client: Any, url: str, batch: list[dict[str, Any]]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)]
        await self._call(client.delete_message_batch, QueueUrl=url, Entries=entries)


async def _client(conn: Any) -> Any:
    # A long poll waits up to 20 s: the read timeout must outlast it.
    read_timeout = float(conn.extra.get("read_timeout", 30)) + 20
    return await aws_client(conn, "sqs", {"read_timeout": read_timeout, "total_max_attempts": 2})


async def aws_client(conn: Any, service: str, options: dict[str, Any]) -> Any:
    """An aiobotocore client context for ``service`` from a slotless connection.

    The process's one botocore data loader reads the files for ``service`` (its model,
    endpoints, partitions: ~0.25 s of disk and JSON) in a thread the first time, not on
    the event loop where creating the client would.

    ``options`` overrides the defaults read from the connection's extras (timeouts, the
    number of attempts, ``max_pool_connections``, ``s3`` addressing); the endpoint, region,
    TLS check and credentials come from the connection alone.
    """
    from aiobotocore.config import AioConfig

    extra = conn.extra
    attempts = options.pop("total_max_attempts", int(extra.get("max_attempts", 2)))
    config: dict[str, Any] = {
        "connect_timeout": float(extra.get("connect_timeout", 10)),
        "read_timeout": float(extra.get("read_timeout", 30)),
        # The triggerer retries with backoff and logs it; one quick retry here only.
        "retries": {"mode": "standard", "total_max_attempts": attempts},
        **options,
    }
    kwargs: dict[str, Any] = {
        "region_name": extra.get("region_name", "us-east-1"),
        "config": AioConfig(**config),
    }
    if "endpoint_url" in extra:
        kwargs["endpoint_url"] = extra["endpoint_url"]
    if extra.get("verify", "").lower() in ("false", "0", "no"):
        kwargs["verify"] = False
    if conn.login:
        kwargs["aws_access_key_id"] = conn.login
        kwargs["aws_secret_access_key"] = conn.password or ""
    token = extra.get("aws_session_token") or extra.get("session_token")
    if token:
        kwargs["aws_session_token"] = token
    session = _session()
    if service not in _WARMED:
        await asyncio.to_thread(session.warm_up_loader_caches, service)
        _WARMED.add(service)
    return session.create_client(service, **kwargs)


_LOADER: Any = None  # botocore's data files, read once per process
_WARMED: set[str] = set()  # services whose files _LOADER has read


def _session() -> Any:
    """A new session sharing the process's data loader. Not one shared session: its
    credentials (a refreshable role's lock) would belong to the first event loop."""
    global _LOADER
    from aiobotocore.session import get_session
    from botocore.loaders import create_loader

    if _LOADER is None:
        _LOADER = create_loader()
    session = get_session()
    session.register_component("data_loader", _LOADER)
    # Listings are read for their keys and sizes alone: botocore would parse every
    # object's LastModified with dateutil (~30 us each: 30 ms of the loop per page).
    parsers = session.get_component("response_parser_factory")
    parsers.set_parser_defaults(timestamp_parser=str)
    return session


def buckets_of(extra: dict[str, str]) -> list[str]:
    """The buckets ``events_buckets`` names (empty: every bucket of the connection)."""
    return [b.strip() for b in extra.get("events_buckets", "").split(",") if b.strip()]


def _transient(exc: Any) -> bool:
    """A 5xx, a 429 or a throttling code: worth a quick retry before falling back."""
    from .s3 import TRANSIENT_CODES  # s3 imports this module: read at call time

    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    throttled = code.endswith("RequestThrottled") or status == 429
    return code in TRANSIENT_CODES or throttled or status >= 500


def _why(exc: Exception) -> str:
    """One line from an SQS error: its code and message where the server sent them."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        code, message = error.get("Code"), error.get("Message")
        if code or message:
            return f"{code or 'error'}: {message or ''}".rstrip(": ")
    return str(exc)
