"""Assets in the JSON API: ``POST /api/v1/assets/events`` (record an event of an asset,
which starts the DAGs whose condition it completes, in the same transaction) and ``GET
/api/v1/assets`` (every asset with its last events, producers and consumers). Registered
with :func:`.api.route`; the write needs a token. A retried request with the same
``Idempotency-Key`` header (or ``key`` field) records nothing more."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from executor.assets import (
    MAX_EXTRA,
    MAX_URI,
    AssetError,
    ExtraTooLarge,
    check_uri,
    extra_json,
)

from ..assets_cli import MAX_KEY, as_json, check_key
from .api import ApiError, Call, route


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AssetEventIn(_Out):
    """One event of an asset: its URI and an extra JSON object kept with it."""

    uri: str = Field(max_length=MAX_URI, examples=["s3://lake/orders"])
    extra: dict[str, Any] | None = Field(
        default=None,
        examples=[{"rows": 1200}],
        json_schema_extra={"description": f"a JSON object, at most {MAX_EXTRA // 1024} KiB"},
    )
    key: str | None = Field(
        default=None, max_length=MAX_KEY,
        json_schema_extra={"description": "a replay with the same key records nothing "
                           "(the Idempotency-Key header says the same)"},
    )  # fmt: skip


class AssetEventOut(_Out):
    id: int
    uri: str
    created: bool  # false: a replay of a key seen before, nothing done
    runs: list[str]  # the runs it started


class EventShown(_Out):
    id: int
    uri: str
    ts: float
    source: str
    run_id: str | None
    task_id: str | None
    extra: dict[str, Any]


class ProducerOut(_Out):
    dag_id: str
    task_id: str


class AssetOut(_Out):
    uri: str
    name: str | None
    events: int
    last_ts: float | None
    last_events: list[EventShown]  # newest first
    producers: list[ProducerOut]
    consumers: list[str]


class AssetsOut(_Out):
    assets: list[AssetOut]


@route(
    "POST", "/assets/events", summary="Record an event of an asset; it starts what it completes",
    body=AssetEventIn, response=AssetEventOut, write=True, status=201,
    errors=(400, 401, 403, 413, 415),
)  # fmt: skip
async def send_asset_event(call: Call) -> tuple[int, BaseModel]:
    event = call.body(AssetEventIn)
    key = event.key or call.request.headers.get("Idempotency-Key")
    try:
        uri = check_uri(event.uri)
    except AssetError as exc:
        raise ApiError(400, str(exc), "uri") from None
    try:
        extra = extra_json(event.extra)
    except AssetError as exc:  # too large (413), or not storable as JSON (NaN: 400)
        raise ApiError(413 if isinstance(exc, ExtraTooLarge) else 400, str(exc), "extra") from None
    try:
        check_key(key)
    except AssetError as exc:
        raise ApiError(400, str(exc), "key") from None
    rec = await call.store.assets.send_event(
        uri, extra, source="api", dedup_key=None if key is None else f"api:{key}"
    )
    out = AssetEventOut(id=rec.id, uri=rec.uri, created=rec.created, runs=rec.runs)
    return (201 if rec.created else 200), out


@route("GET", "/assets", summary="Every asset, its last events, producers and consumers",
       response=AssetsOut)  # fmt: skip
async def list_assets(call: Call) -> tuple[int, BaseModel]:
    listed = await call.store.assets.list_assets()
    return 200, AssetsOut.model_validate({"assets": [as_json(a) for a in listed]})
