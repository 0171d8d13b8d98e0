"""The audit list: every write through the web page or the JSON API, under the name of
the token that made it, with its role, the way it came in, what it was done to and how
it ended (``ok``, or ``refused``: nothing changed). Refused writes are kept too: a
viewer's attempt to trigger is a row as much as an operator's trigger.

A row is written by :func:`record_in` inside a store call's own transaction where the
call takes one, so that the write and its row commit together; the run-control, pause,
trigger, answer and pool operations open their own transactions, so the web layer calls
:meth:`Audit.record` right after the write returns (a process killed between the two
loses the row, not the write; the task and run log still says who, as it always did).

What a row holds is cut to size: a text field to :data:`MAX_TEXT` characters, the detail
(JSON) to :data:`MAX_DETAIL`. Rows are kept; nothing prunes them (a few hundred bytes per
write a person or a client made).

>>> await store.audit.record(who="alice", role="operator", via="api", action="trigger",
...                          target="dag:hello", detail={"run_id": "..."})  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict, Unpack

from ..driver.db import Row, Tx
from .part import Part

Via = Literal["web", "api", "cli"]
Outcome = Literal["ok", "refused"]
MAX_TEXT = 500  # characters of a name, an action, a target
MAX_DETAIL = 4000  # characters of the detail's JSON
MAX_LIST = 1000  # rows one listing returns at most


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    ts: float
    who: str
    role: str
    via: str
    action: str
    target: str
    detail: Any
    outcome: str

    @classmethod
    def of(cls, r: Row) -> AuditRow:
        try:
            detail = json.loads(r["detail"])
        except ValueError:  # a row written by hand: shown as the text it is
            detail = {"text": str(r["detail"])[:MAX_DETAIL]}
        return cls(
            int(r["id"]), float(r["ts"]), r["who"], r["role"], r["via"], r["action"],
            r["target"], detail, r["outcome"],
        )  # fmt: skip


def _text(value: object, limit: int = MAX_TEXT) -> str:
    """``value`` as text either backend can hold: no NUL, no lone surrogate, cut."""
    text = str(value)[:limit].replace("\x00", "\\0")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _detail(detail: Mapping[str, Any] | None) -> str:
    # ASCII-escaped: a lone surrogate or a NUL in a form field is an escape, not a
    # character PostgreSQL refuses.
    text = json.dumps(dict(detail or {}), sort_keys=True, default=str)
    if len(text) > MAX_DETAIL:
        text = json.dumps({"cut": text[: MAX_DETAIL - 100]})
    return text


class Entry(TypedDict):
    """What a row records, as :func:`record_in` and :meth:`Audit.record` take it."""

    who: str
    role: str
    via: Via
    action: str
    target: NotRequired[str]  # "" unless given
    detail: NotRequired[Mapping[str, Any] | None]
    outcome: NotRequired[Outcome]  # "ok" unless given


async def record_in(tx: Tx, *, ts: float, **entry: Unpack[Entry]) -> None:
    """Append one row in ``tx``: the write it records commits (or rolls back) with it."""
    await tx.execute(
        "audit_insert", ts=ts, who=_text(entry["who"]), role=_text(entry["role"]),
        via=entry["via"], action=_text(entry["action"]), target=_text(entry.get("target", "")),
        detail=_detail(entry.get("detail")), outcome=entry.get("outcome", "ok"),
    )  # fmt: skip


class Audit(Part):
    """Recording writes and listing them."""

    async def record(self, **entry: Unpack[Entry]) -> None:
        """Append one row, in a transaction of its own."""
        async with self.db.write() as tx:
            await record_in(tx, ts=self.clock(), **entry)

    async def since(self, since: float = 0.0, limit: int = 100) -> list[AuditRow]:
        """The rows written at or after ``since`` (epoch seconds), newest first, at most
        ``limit`` (capped at :data:`MAX_LIST`)."""
        async with self.db.read() as tx:
            rows = await tx.fetch(
                "audit_since", since=float(since), limit=max(0, min(limit, MAX_LIST))
            )
        return [AuditRow.of(r) for r in rows]
