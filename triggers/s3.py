"""S3KeyTrigger: an S3 key exists (batched: one paginated listing per bucket and prefix).

Checked with aiobotocore, one client per connection id for the triggerer's lifetime. All
the waiting keys under one bucket and prefix are answered by one ``ListObjectsV2``
(paginated, 1,000 keys a page) instead of a ``HEAD`` per key: 10,000 sensors over 10
prefixes cost 10 requests a cycle, not 10,000.

The connection (``SLOTLESS_CONN_<ID>``) is a URI such as
``s3://ACCESS_KEY:SECRET@?endpoint_url=http://127.0.0.1:9000&region_name=eu-west-1``
(percent-encode ``/`` and ``+`` in the secret). Extras: ``endpoint_url``, ``region_name``,
``aws_session_token``, ``addressing_style`` (path / virtual / auto), ``verify`` (false to
skip TLS verification), ``connect_timeout``, ``read_timeout``, ``max_attempts``. Without
a key and secret, botocore's usual chain (environment, profile, instance role) is used.
The credentials need ``s3:ListBucket`` on the bucket.

Pushed where the bucket publishes event notifications to an SQS queue that the connection
names (``events_queue``; triggers/s3_events.py): then idle waits make no LIST but a slow
safety poll.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import Sequence
from functools import partial
from typing import Any

from pydantic import field_validator

from .base import BaseTrigger, TransientError, TriggerEvent, unbatched
from .context import TriggerContext
from .listing import SingleFlight, check_glob, compile_glob, has_magic, literal_prefix, on_grid
from .push import PushInterest
from .s3_events import Heard, SqsEventQueue, aws_client, buckets_of

# Error codes S3 (and S3-compatible servers) use for a passing condition: retried.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "RequestLimitExceeded",
        "RequestTimeout",
        "ServiceUnavailable",
        "InternalError",
        "500",
        "502",
        "503",
        "504",
    }
)
# Codes that say the credentials were refused: retrying will not help.
CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "AllAccessDisabled",
        "AccountProblem",
        "403",
    }
)
MAX_PAYLOAD_KEYS = 1000
_BUCKET = re.compile(r"^[A-Za-z0-9.\-_{} ]{1,255}$")


class S3CheckError(RuntimeError):
    """A check that cannot succeed as things are (no such bucket, credentials refused)."""


class S3KeyTrigger(BaseTrigger):
    """Fires when ``key`` exists in ``bucket``.

    ``key`` is an exact key (``in/2024-01-01.csv``), a glob (``in/*.csv``; ``*`` and ``?``
    stop at ``/``, ``**`` crosses it) or a prefix ending in ``/`` (any object under it).
    ``min_size`` (bytes) waits until a matching object is at least that large. The event's
    payload is ``{"bucket": ..., "keys": [matching keys, sorted, at most 1,000]}``.
    """

    bucket: str
    key: str
    min_size: int = 0
    conn_id: str = "aws_default"

    @field_validator("bucket")
    @classmethod
    def _valid_bucket(cls, value: str) -> str:
        if not _BUCKET.match(value) or "/" in value:
            raise ValueError(f"invalid bucket name {value!r}")
        return value

    @field_validator("key")
    @classmethod
    def _valid_key(cls, value: str) -> str:
        if not value:
            raise ValueError("key must not be empty (use a prefix ending in '/' or a glob)")
        if value.startswith("/"):
            raise ValueError(f"key {value!r} must not start with '/' (S3 keys are relative)")
        check_glob(value)  # ValueError names what is malformed
        return value

    @field_validator("min_size")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("min_size must be >= 0")
        return value

    def next_check_at(self, now: float, interval: float) -> float:
        return on_grid(now, interval)  # checks of one cycle fall due together: one request

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    # -- what to list -----------------------------------------------------------------

    @property
    def is_prefix(self) -> bool:
        return self.key.endswith("/") and not has_magic(self.key)

    @property
    def directory(self) -> str:
        """The listing prefix shared by every key in the same "folder" (ends in '/')."""
        lit = literal_prefix(self.key)
        return lit[: lit.rfind("/") + 1]

    @property
    def recursive(self) -> bool:
        """Whether a listing must descend below ``directory`` (no '/' delimiter)."""
        if self.is_prefix:
            return True
        rest = self.key[len(self.directory) :]
        return "/" in rest or "**" in rest

    def _tight_prefix(self) -> str:
        return self.key if self.is_prefix else literal_prefix(self.key)

    def match(self, listing: dict[str, int]) -> TriggerEvent | None:
        """Answer this trigger from a listing (key -> size) that covers it."""
        if self.is_prefix:
            found = [k for k, s in listing.items() if k.startswith(self.key) and k != self.key]
        elif has_magic(self.key):
            rx = compile_glob(self.key)
            found = [k for k in listing if rx.match(k)]
        else:
            found = [self.key] if self.key in listing else []
        found = sorted(k for k in found if listing[k] >= self.min_size)
        if not found:
            return None
        return TriggerEvent(
            payload={"bucket": self.bucket, "keys": found[:MAX_PAYLOAD_KEYS], "count": len(found)}
        )

    def run_requests(self, payload: Any) -> list[tuple[str | None, Any]]:
        """As a start condition, a glob or a prefix starts one run per matching object,
        keyed ``s3://bucket/key`` (``ctx.start_event``: ``{"bucket", "key"}``), so each
        object that lands starts its run once; an exact key starts one run per date."""
        if not (self.is_prefix or has_magic(self.key)):
            return [(None, payload)]
        bucket = payload["bucket"]
        return [(f"s3://{bucket}/{k}", {"bucket": bucket, "key": k}) for k in payload["keys"]]

    def push_interest(self, ctx: TriggerContext) -> PushInterest | None:
        """Woken by the bucket's event notifications when its connection names a queue
        (``events_queue``; triggers/s3_events.py): one consumer per queue."""
        try:
            conn = ctx.connection(self.conn_id)
        except Exception:  # unknown connection: the check says so, polled
            return None
        queue = conn.extra.get("events_queue")
        if not queue:
            return None
        buckets = set(buckets_of(conn.extra))
        if buckets and self.bucket not in buckets:
            return None
        key = ("sqs", self.conn_id, queue)
        opener = partial(SqsEventQueue, self.conn_id, queue)
        if self.is_prefix:
            return PushInterest(key, opener, pattern=re.escape(f"{self.bucket}/{self.key}") + ".")
        if has_magic(self.key):
            pattern = re.escape(f"{self.bucket}/") + compile_glob(self.key).pattern
            return PushInterest(key, opener, pattern=pattern)
        return PushInterest(key, opener, topic=f"{self.bucket}/{self.key}")

    # -- checking -----------------------------------------------------------------------

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        """One check on its own: one listing of the tightest prefix that covers the key."""
        return unbatched((await _answer(ctx, [self], tight=True))[0])

    @classmethod
    async def poke_many(
        cls, triggers: Sequence[BaseTrigger], ctx: TriggerContext
    ) -> Sequence[TriggerEvent | BaseException | None]:
        return await _answer(ctx, triggers, tight=False)


async def _answer(
    ctx: TriggerContext, triggers: Sequence[BaseTrigger], *, tight: bool
) -> list[TriggerEvent | BaseException | None]:
    groups: dict[tuple[str, str, str], list[S3KeyTrigger]] = defaultdict(list)
    heard: dict[str, Heard] = {}
    results: dict[int, TriggerEvent | BaseException | None] = {}
    for t in triggers:
        assert isinstance(t, S3KeyTrigger)
        h = heard.get(t.conn_id)
        if h is None:
            h = heard[t.conn_id] = await ctx.shared(f"s3-heard:{t.conn_id}", Heard.create)
        prefix = t._tight_prefix() if tight else t.directory
        topic = f"{t.bucket}/{t.key}"
        if topic in h.keys and not (t.is_prefix or has_magic(t.key)):
            # Woken by a notification naming its key: the notification's size answers
            # it (the object was created); without one that key alone is listed, not
            # its folder (a burst of puts would otherwise list the folder per wake).
            size = h.keys.pop(topic)
            if size is not None and size >= t.min_size:
                results[id(t)] = t.match({t.key: size})
                continue
            prefix = t.key
        groups[(t.conn_id, t.bucket, prefix)].append(t)

    async def one(conn_id: str, bucket: str, prefix: str, group: list[S3KeyTrigger]) -> None:
        recursive = any(t.recursive for t in group)
        fresh_after = heard[conn_id].buckets.get(bucket, 0.0)
        try:
            listing = await list_prefix(
                ctx, conn_id, bucket, prefix, recursive=recursive, fresh_after=fresh_after
            )
        except Exception as exc:  # each group fails alone; UnknownConnection included
            for t in group:
                results[id(t)] = exc
            return
        for t in group:
            results[id(t)] = t.match(listing)

    await asyncio.gather(*(one(*key, group) for key, group in groups.items()))
    return [results[id(t)] for t in triggers]


async def list_prefix(
    ctx: TriggerContext,
    conn_id: str,
    bucket: str,
    prefix: str,
    *,
    recursive: bool,
    fresh_after: float = 0.0,
) -> dict[str, int]:
    """``{key: size}`` under ``prefix`` (direct children only unless ``recursive``).

    Concurrent callers asking for the same listing share one paginated request, if it
    began after ``fresh_after`` (when a notification about the bucket was last heard).
    """
    link = await _link(ctx, conn_id)
    return await link.flights.run(
        (bucket, prefix, recursive),
        lambda: link.list(bucket, prefix, recursive),
        fresh_after=fresh_after,
    )


async def _link(ctx: TriggerContext, conn_id: str) -> _S3Link:
    conn = ctx.connection(conn_id)  # UnknownConnection: fails the waiting tasks

    async def factory() -> _S3Link:
        return await _S3Link.open(conn)

    return await ctx.shared(f"s3:{conn_id}", factory)


class _S3Link:
    """One aiobotocore client per connection id, plus its in-flight listings."""

    def __init__(self, conn: Any, client: Any, cm: Any) -> None:
        self.conn = conn
        self.client = client
        self._cm = cm
        # A cycle's calls share its listings however long they take; a check woken by a
        # notification shares none sent before it was heard (list_prefix's fresh_after).
        self.flights = SingleFlight()

    @classmethod
    async def open(cls, conn: Any) -> _S3Link:
        if conn.scheme not in ("s3", "aws"):
            raise S3CheckError(
                f"connection {conn.conn_id!r} is {conn.redacted()}: an S3 connection "
                "must be an s3:// URI"
            )
        options: dict[str, Any] = {"max_pool_connections": 50}
        if "addressing_style" in conn.extra:
            options["s3"] = {"addressing_style": conn.extra["addressing_style"]}
        cm = await aws_client(conn, "s3", options)
        client = await cm.__aenter__()
        return cls(conn, client, cm)

    async def list(self, bucket: str, prefix: str, recursive: bool) -> dict[str, int]:
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if not recursive:
            kwargs["Delimiter"] = "/"
        out: dict[str, int] = {}
        try:
            async for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                for obj in page.get("Contents", ()):
                    out[obj["Key"]] = obj["Size"]
        except ClientError as exc:
            raise _classify(exc, self.conn, bucket) from exc
        except BotoCoreError as exc:
            raise _botocore_error(exc, self.conn) from exc
        except (OSError, TimeoutError) as exc:
            raise TransientError(f"S3 unreachable via {self._where()}: {exc}") from exc
        return out

    def _where(self) -> str:
        return f"connection {self.conn.conn_id!r} ({self.conn.redacted()})"

    async def close(self) -> None:
        await self._cm.__aexit__(None, None, None)


def _classify(exc: Any, conn: Any, bucket: str) -> Exception:
    err = exc.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    where = f"connection {conn.conn_id!r}"
    detail = f"{code}: {err.get('Message', '')}".rstrip(": ")
    if code == "NoSuchBucket":
        return S3CheckError(f"S3 bucket {bucket!r} does not exist ({where})")
    if code in CREDENTIAL_CODES or status == 403:
        return S3CheckError(
            f"S3 refused the credentials of {where} for bucket {bucket!r}: {detail}"
        )
    if code in TRANSIENT_CODES or status >= 500 or status == 429:
        return TransientError(f"S3 error for bucket {bucket!r} ({where}), will retry: {detail}")
    return S3CheckError(f"S3 error for bucket {bucket!r} ({where}): {detail}")


def _botocore_error(exc: Exception, conn: Any) -> Exception:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import (
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    where = f"connection {conn.conn_id!r} ({conn.redacted()})"
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return S3CheckError(f"no usable S3 credentials for {where}: {exc}")
    if isinstance(exc, BotoConnectionError | HTTPClientError):  # refused, timeouts, closed
        return TransientError(f"S3 unreachable via {where}: {exc}")
    return S3CheckError(f"S3 client error for {where}: {exc}")
