"""HttpTrigger: a URL answers with the expected status (and, optionally, JSON body).

aiohttp, one ``ClientSession`` shared by every HttpTrigger of the process (its pool
reuses connections per host). No code travels in kwargs: the body test is a small
declarative predicate, ``{"path": "status.state", "equals": "done"}``.

Outcomes of one check:

* the expected status (and the predicate holds) - fires, payload ``{"url", "status",
  "json"}`` (``json`` only when the body is JSON and under 64 KiB);
* 5xx, 429, a timeout, a refused or reset connection - retried with backoff (logged in
  the waiting tasks' logs), the tasks keep waiting until their own timeout;
* anything else (404 while a resource does not exist yet, a predicate not yet true,
  a body that is not JSON) - not yet;
* 401 or 403 (unless expected), too many redirects - fails the waiting tasks with a
  clear message (retrying will not change it).

Credentials never go in the URL (it is stored in the database): name a connection,
``SLOTLESS_CONN_<ID>=https://user:password@api.example.com`` (basic auth) or
``https://api.example.com?token=...`` (bearer token); the trigger's ``url`` may then be
a path relative to it.
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .base import BaseTrigger, TransientError, TriggerEvent
from .context import TriggerContext

MAX_JSON_PAYLOAD = 64 * 1024
_MISSING = object()


class HttpCheckError(RuntimeError):
    """A check that cannot succeed as things are (credentials refused, redirect loop)."""


class JsonPredicate(BaseModel):
    """``path``: dot-separated keys and list indexes (``items.0.state``).

    ``{"path": ..., "equals": value}``: the value there equals ``value`` (null included);
    ``{"path": ..., "exists": true}``: the path exists.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(min_length=1)
    equals: Any = None
    exists: bool = False

    @model_validator(mode="after")
    def _one_test(self) -> JsonPredicate:
        if self.exists and self.equals is not None:
            raise ValueError("json_predicate: give either 'equals' or 'exists', not both")
        if not self.exists and "equals" not in self.model_fields_set:
            raise ValueError("json_predicate needs 'equals' (a value) or 'exists': true")
        return self

    def holds(self, doc: Any) -> bool:
        value = _get(doc, self.path)
        if value is _MISSING:
            return False
        return self.exists or value == self.equals


def _get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(doc, dict):
            if part not in doc:
                return _MISSING
            doc = doc[part]
        elif isinstance(doc, list):
            try:
                doc = doc[int(part)]
            except (ValueError, IndexError):
                return _MISSING
        else:
            return _MISSING
    return doc


class HttpTrigger(BaseTrigger):
    """Fires when ``url`` answers with ``expected_status`` and ``json_predicate`` holds."""

    url: str
    expected_status: int | list[int] = 200
    json_predicate: JsonPredicate | None = None
    timeout: float = Field(default=10.0, gt=0)
    follow_redirects: bool = True
    conn_id: str | None = None

    @field_validator("url")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.username or parts.password:
            raise ValueError(
                "url must not carry credentials (they would be stored): put them in a "
                "connection (SLOTLESS_CONN_<ID>) and set conn_id"
            )
        if parts.scheme and parts.scheme not in ("http", "https"):
            raise ValueError(f"url {value!r}: only http and https are supported")
        return value

    @model_validator(mode="after")
    def _absolute_or_conn(self) -> HttpTrigger:
        if self.conn_id is None and not urlsplit(self.url).netloc:
            raise ValueError(f"url {self.url!r} is relative: give an absolute URL or a conn_id")
        return self

    @property
    def statuses(self) -> frozenset[int]:
        s = self.expected_status
        return frozenset(s) if isinstance(s, list) else frozenset({s})

    def describe(self) -> str:
        shown = _without_query(self.url)  # the query may hold tokens: left out of logs
        return f"GET {shown}" + (f" (connection {self.conn_id})" if self.conn_id else "")

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        import aiohttp

        url, headers = self._request(ctx)
        session = await ctx.shared("http:session", _new_session)
        try:
            async with session.get(
                url,
                headers=headers,
                allow_redirects=self.follow_redirects,
                max_redirects=10,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as resp:
                status = resp.status
                body = await resp.read() if status in self.statuses else b""
        except aiohttp.TooManyRedirects as exc:
            raise HttpCheckError(f"{self.describe()}: too many redirects ({exc})") from exc
        except TimeoutError as exc:
            raise TransientError(f"{self.describe()}: no answer within {self.timeout:g} s") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            raise TransientError(f"{self.describe()}: {type(exc).__name__}: {exc}") from exc
        if status not in self.statuses:
            if status >= 500 or status == 429:
                raise TransientError(f"{self.describe()} answered {status}")
            if status in (401, 403):
                who = f"connection {self.conn_id!r}" if self.conn_id else "no credentials"
                raise HttpCheckError(
                    f"{self.describe()} answered {status}: the server refused {who} "
                    "(list the status in expected_status if this is what you wait for)"
                )
            return None
        doc: Any = _MISSING
        if body:
            try:
                doc = json.loads(body)
            except ValueError:
                doc = _MISSING
        if self.json_predicate is not None and (
            doc is _MISSING or not self.json_predicate.holds(doc)
        ):
            return None
        payload: dict[str, Any] = {"url": _without_query(url), "status": status}
        if doc is not _MISSING and len(body) <= MAX_JSON_PAYLOAD:
            payload["json"] = doc
        return TriggerEvent(payload=payload)

    def _request(self, ctx: TriggerContext) -> tuple[str, dict[str, str]]:
        if self.conn_id is None:
            return self.url, {}
        conn = ctx.connection(self.conn_id)  # UnknownConnection: fails the waiting tasks
        if conn.scheme not in ("http", "https"):
            raise ValueError(
                f"connection {self.conn_id!r} is {conn.redacted()}: an HTTP connection "
                "must be an http:// or https:// URI"
            )
        base = f"{conn.scheme}://{conn.host}" + (f":{conn.port}" if conn.port else "")
        base += conn.path if conn.path.endswith("/") else conn.path + "/"
        url = urljoin(base, self.url.lstrip("/")) if not urlsplit(self.url).netloc else self.url
        headers: dict[str, str] = {}
        if conn.login:
            pair = f"{conn.login}:{conn.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        if conn.extra.get("token"):
            headers["Authorization"] = f"Bearer {conn.extra['token']}"
        return url, headers


def _without_query(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


async def _new_session() -> Any:
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=100, limit_per_host=20),
        headers={"User-Agent": "slotless-triggerer"},
        raise_for_status=False,
    )
