"""The native check for the Amazon provider's ``S3KeyTrigger`` (provider 9.39.0).

The provider's ``run()`` makes one client per row and sends a ``HEAD`` per key (a
``ListObjectsV2`` from the key's literal prefix for a wildcard) every ``poke_interval``.
Here every row waiting on one thing is one group (:mod:`.plans`), and every group waiting
on keys under one (connection, bucket, directory) is answered by ONE paginated listing per
interval: the groups check on a grid of their interval, so the ones due together join the
listing the first of them started (triggers/listing.py's ``SingleFlight``), or take the one
made since the grid point. The listing is recursive while a wildcard waits under it (the
provider's ``fnmatch`` lets ``*`` cross ``/``). One aiobotocore client per (connection,
region, verify) for the process's lifetime, made by slotless's S3 trigger code
(triggers/s3.py's ``_S3Link``) from what the provider's own ``S3Hook(...).conn_config``
resolves, in a thread.

Same answer as the provider: a key exists when it is listed (``HEAD`` finds exactly the
listed keys), a wildcard when a listed key ``fnmatch``es it, a list when all of its keys
do; the event is ``TriggerEvent({"status": "success"})``. Different on purpose: a bucket
that does not exist, refused credentials, or another error S3 will not get over fail the
task instances through ``submit_failure`` with one line (the provider sends an error event
for most of these, and waits out its timeout on a missing bucket's ``HEAD`` 404); S3
unreachable, throttling or a 5xx is retried with backoff and fails nothing.

What it does not do exactly goes through the adapter (the provider's own ``run()``): a
kwarg not in :data:`KWARGS`, ``should_check_fn`` or ``use_regex`` true, ``hook_params`` or
``botocore_config`` given, keys across buckets, an ``https://`` key (:func:`s3_key`); and,
found when the client is made, a connection that assumes a role, names a profile, gives a
CA bundle as ``verify`` or sets botocore ``config_kwargs`` other than the S3 addressing
style (:func:`airflow_connection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import importlib
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Hashable
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from triggers.base import TransientError
from triggers.context import to_thread
from triggers.listing import literal_prefix
from triggers.registry import in_import_thread
from triggers.s3 import S3CheckError, _S3Link

from .grid import SAY_EVERY_S, Clients, NotNative, back_off, grid, next_point, one_line

log = logging.getLogger("slotless.airflow")

S3KEY = "airflow.providers.amazon.aws.triggers.s3.S3KeyTrigger"
HOOK = "airflow.providers.amazon.aws.hooks.s3"

# Every kwarg the provider's S3KeyTrigger.serialize() writes. ``metadata_keys`` only
# shapes the files ``should_check_fn`` sends; without it (the only case served here) the
# provider never reads it.
KWARGS = frozenset(
    {
        "bucket_name",
        "bucket_key",
        "wildcard_match",
        "aws_conn_id",
        "hook_params",
        "poke_interval",
        "should_check_fn",
        "use_regex",
        "region_name",
        "verify",
        "botocore_config",
        "metadata_keys",
    }
)

Where = tuple[str | None, str | None, bool | None]  # aws_conn_id, region_name, verify
Key = tuple[Any, ...]


def s3_key(kwargs: dict[str, Any]) -> Key | None:
    """``("s3", aws_conn_id, region_name, verify, bucket, key, wildcard_match)`` (``key``
    a sorted tuple for a list of several), or None: the native check would not do exactly
    what the provider does, and the row runs through the adapter."""
    k = kwargs.get
    if not set(kwargs) <= KWARGS or "bucket_name" not in kwargs or "bucket_key" not in kwargs:
        return None
    if k("should_check_fn", False) is not False or k("use_regex", False) is not False:
        return None
    if k("hook_params", {}) != {} or k("botocore_config") is not None:
        return None
    meta = k("metadata_keys")
    if meta is not None and not (isinstance(meta, list) and all(isinstance(m, str) for m in meta)):
        return None
    conn, region, verify = k("aws_conn_id", "aws_default"), k("region_name"), k("verify")
    wildcard, interval = k("wildcard_match", False), k("poke_interval", 5.0)
    if not (conn is None or (isinstance(conn, str) and conn)) or not isinstance(wildcard, bool):
        return None
    if not (region is None or isinstance(region, str)) or verify not in (None, True, False):
        return None
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
        return None
    keys = kwargs["bucket_key"]
    keys = [keys] if isinstance(keys, str) else keys
    if not isinstance(keys, list) or not keys:
        return None
    pairs = {_bucket_and_key(kwargs["bucket_name"], key) for key in keys}
    if None in pairs or len({p[0] for p in pairs if p}) != 1:
        return None
    bucket = next(p[0] for p in pairs if p)
    names = tuple(sorted(p[1] for p in pairs if p))
    return ("s3", conn, region, verify, bucket, names[0] if len(names) == 1 else names, wildcard)


def _bucket_and_key(bucket: Any, key: Any) -> tuple[str, str] | None:
    """The provider hook's ``get_s3_bucket_key``: a relative key in ``bucket``, or an
    ``s3://bucket/key`` URL with no bucket; None for what it refuses (or what the adapter
    serves: an ``https://`` URL, an empty bucket it would take from the connection)."""
    if not isinstance(key, str) or not key:
        return None
    try:
        if isinstance(bucket, str) and bucket:
            url = urlsplit(key)
            return (bucket, key) if url.scheme == "" and url.netloc == "" else None
        if bucket is None and re.match(r"s3[na]?:", key.split("//")[0], re.IGNORECASE):
            url = urlsplit(key, allow_fragments=False)
            name = url.path.lstrip("/")
            return (url.netloc, name) if url.netloc and name else None
    except ValueError:  # urlsplit refuses it: so does the provider
        return None
    return None


def _directory(key: str, wildcard: bool) -> str:
    """The prefix listed for ``key``: its "folder" (up to its last ``/``; of the part
    before its first wildcard for a pattern), shared by every key in it."""
    literal = literal_prefix(key) if wildcard else key
    return literal[: literal.rfind("/") + 1]


class S3Failed(Exception):
    """S3 refused the check for good (no such bucket, credentials refused): one line."""


@dataclass
class _Conn:
    """What triggers/s3.py's ``_S3Link`` reads of a slotless connection, from Airflow's."""

    conn_id: str
    login: str | None
    password: str | None
    extra: dict[str, str]
    scheme: str = "aws"

    def redacted(self) -> str:
        return f"Airflow AWS connection, endpoint {self.extra.get('endpoint_url', 'AWS')}"


def airflow_connection(conn_id: str | None, region: str | None, verify: bool | None) -> _Conn:
    """The client the provider's ``S3Hook(aws_conn_id, region_name, verify)`` would make,
    as a connection for ``_S3Link``. Blocking (Airflow reads the connection through the
    Task SDK): called in a thread."""
    import botocore.session

    hook_cls = importlib.import_module(HOOK).S3Hook
    cfg = hook_cls(aws_conn_id=conn_id, region_name=region, verify=verify).conn_config
    name = f"connection {conn_id!r}"
    if cfg.role_arn:
        raise NotNative(f"{name} assumes a role (role_arn)")
    if cfg.profile_name:
        raise NotNative(f"{name} names a profile (profile_name)")
    if cfg.verify not in (None, True, False):
        raise NotNative(f"{name} verifies TLS against {cfg.verify!r}")
    config = cfg.extra_config.get("config_kwargs") or {}
    s3_config = config.get("s3") or {} if isinstance(config, dict) else None
    if (
        not isinstance(s3_config, dict)
        or set(config) - {"s3"}
        or set(s3_config) - {"addressing_style"}
    ):
        raise NotNative(f"{name} sets botocore config_kwargs {config!r}")
    # Where the provider leaves the region to boto3: its chain (environment, config file).
    region = cfg.region_name or botocore.session.get_session().get_config_variable("region")
    extra = {"region_name": region or "us-east-1"}
    endpoint = cfg.get_service_endpoint_url("s3")
    if endpoint:
        extra["endpoint_url"] = endpoint
    if cfg.verify is False:
        extra["verify"] = "false"
    if cfg.aws_session_token:
        extra["aws_session_token"] = cfg.aws_session_token
    if "addressing_style" in s3_config:
        extra["addressing_style"] = str(s3_config["addressing_style"])
    has_keys = cfg.aws_access_key_id and cfg.aws_secret_access_key
    return _Conn(
        conn_id=conn_id or "aws_conn_id=None",
        login=cfg.aws_access_key_id if has_keys else None,
        password=cfg.aws_secret_access_key if has_keys else None,
        extra=extra,
    )


@dataclass
class S3Native:
    """The process's native S3 checks: their clients and the listings they share."""

    # (aws_conn_id, region_name, verify) -> a _Conn; Airflow's by default, a test's own.
    resolve: Callable[[str | None, str | None, bool | None], _Conn] | None = None
    listings: int = 0  # listings made (each a paginated ListObjectsV2), for /metrics
    _clients: Clients = field(default_factory=Clients)  # an _S3Link per Where
    # (where, bucket, directory) -> how many groups wait under it, how many with a wildcard
    _waits: Counter[Hashable] = field(default_factory=Counter)
    _wildcards: Counter[Hashable] = field(default_factory=Counter)
    # (where, bucket, directory) -> the last listing: when it began (monotonic), recursive
    _last: dict[Hashable, tuple[float, bool, dict[str, int]]] = field(default_factory=dict)
    _said: dict[Hashable, float] = field(default_factory=dict)

    async def wait(
        self, key: Key, interval: Callable[[], float], on_check: Callable[[str], None]
    ) -> None:
        """Return once what ``key`` waits for exists. NotNative before the first check if
        the connection needs the adapter; S3Failed when S3 refuses for good."""
        _, conn, region, verify, bucket, keys, wildcard = key
        where: Where = (conn, region, verify)
        names: tuple[str, ...] = (keys,) if isinstance(keys, str) else keys
        spots = {(where, bucket, _directory(n, wildcard)) for n in names}
        self._want(spots, wildcard, 1)
        failures = 0
        # The grid point this check is for: at first the one just passed (a listing made
        # since then answers), then each one slept until.
        due = grid(interval(), time.monotonic())
        try:
            while True:
                every = interval()
                try:
                    link = await self._link(where)
                    found = await self._found(link, spots, names, wildcard, due)
                except TransientError as exc:
                    failures += 1
                    on_check(f"retrying: {exc}")
                    due = await back_off(every, failures)
                    continue
                failures = 0
                on_check("found" if found else "no match yet")
                if found:
                    return
                due = await next_point(every)
        finally:
            self._want(spots, wildcard, -1)

    async def close(self) -> None:
        await self._clients.close()

    # -- clients ---------------------------------------------------------------------

    async def _link(self, where: Where) -> Any:
        return await self._clients.get(where, partial(self._open, where))

    async def _open(self, where: Where) -> Any:
        resolve = self.resolve
        if resolve is None:
            await in_import_thread(HOOK, partial(importlib.import_module, HOOK))
            resolve = airflow_connection
        # aiobotocore's first import (0.4 s here) in the import thread: _S3Link.open would
        # import it on the event loop, and stop it for that long.
        for module in ("aiobotocore.session", "aiobotocore.config", "botocore.loaders"):
            await in_import_thread(module, partial(importlib.import_module, module))
        try:
            conn = await to_thread(resolve, *where)
        except NotNative:
            raise
        except Exception as exc:  # the connection could not be read now (its database)
            raise TransientError(f"reading AWS connection {where[0]!r}: {one_line(exc)}") from None
        try:
            link = await _S3Link.open(conn)
        except Exception as exc:  # an endpoint_url botocore refuses, say
            said = one_line(exc)
            raise S3Failed(f"cannot make an S3 client for {conn.conn_id!r}: {said}") from None
        return link

    # -- listings ----------------------------------------------------------------------

    def _want(self, spots: set[tuple[Where, str, str]], wildcard: bool, n: int) -> None:
        for spot in spots:
            self._waits[spot] += n
            if wildcard:
                self._wildcards[spot] += n
            if self._waits[spot] <= 0:
                for kept in (self._waits, self._wildcards, self._last, self._said):
                    kept.pop(spot, None)

    async def _found(
        self,
        link: Any,
        spots: set[tuple[Where, str, str]],
        names: tuple[str, ...],
        wildcard: bool,
        since: float,
    ) -> bool:
        ordered = sorted(spots)
        got = await asyncio.gather(*(self._listing(link, s, wildcard, since) for s in ordered))
        listed = {s[2]: listing for s, listing in zip(ordered, got, strict=True)}
        for name in names:
            listing = listed[_directory(name, wildcard)]
            if wildcard:
                if not any(fnmatch.fnmatch(k, name) for k in listing):
                    return False
            elif name not in listing:
                return False
        return True

    async def _listing(
        self, link: Any, spot: tuple[Where, str, str], wildcard: bool, since: float
    ) -> dict[str, int]:
        """The keys under ``spot``'s directory, from a listing begun at ``since`` or later:
        the one already made this interval, the one in flight, or a new one."""
        last = self._last.get(spot)
        if last is not None and last[0] >= since and (last[1] or not wildcard):
            return last[2]
        recursive = self._wildcards[spot] > 0
        _, bucket, directory = spot
        return await link.flights.run(
            (bucket, directory, recursive),
            partial(self._list, link, spot, recursive),
            fresh_after=since,
        )

    async def _list(self, link: Any, spot: tuple[Where, str, str], recursive: bool) -> Any:
        _, bucket, directory = spot
        began = time.monotonic()
        self.listings += 1
        try:
            listing = await link.list(bucket, directory, recursive)
        except S3CheckError as exc:
            raise S3Failed(str(exc)) from None
        except TransientError as exc:
            if time.monotonic() - self._said.get(spot, -SAY_EVERY_S) >= SAY_EVERY_S:
                self._said[spot] = time.monotonic()
                log.warning("listing s3://%s/%s failed (%s); retrying", bucket, directory, exc)
            raise
        last = self._last.get(spot)
        if self._waits[spot] > 0 and (last is None or last[0] <= began):
            self._last[spot] = (began, recursive, listing)
        return listing


async def key_events(
    s3: S3Native,
    key: Key,
    interval: Callable[[], float],
    on_check: Callable[[str], None],
    adapted: Callable[[], AsyncGenerator[Any, None]],
) -> AsyncGenerator[Any, None]:
    """The provider's event once ``key`` exists; the provider's own ``run()`` (through
    ``adapted``) when the connection needs what the native client does not do."""
    from airflow.triggers.base import TriggerEvent

    try:
        await s3.wait(key, interval, on_check)
    except NotNative as exc:
        log.info("S3KeyTrigger %r runs through the adapter: %s", key[1:], exc)
    else:
        yield TriggerEvent({"status": "success"})
        return
    async with contextlib.aclosing(adapted()) as events:
        async for event in events:
            yield event
