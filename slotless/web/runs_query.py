"""The runs list's filter as a URL's query string, read the same way by the page
(``GET /runs``) and the API (``GET /api/v1/runs``), and written back into links.

``dag`` (repeatable), ``state`` (repeatable: QUEUED RUNNING PAUSED SUCCESS FAILED
CANCELLED, any case), ``type`` (repeatable: scheduled manual backfill event), ``from`` and
``to`` (days, ``YYYY-MM-DD``, both included, on the run's logical date), ``q`` (text in the
run id or run key), ``limit`` (1-500, default 50), ``before`` / ``after`` (a page's
cursor). Empty values are ignored (a form's empty field). A bad value raises
:class:`~executor.store.runlist.BadFilter`, whose message names the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import date
from typing import Any, Protocol

from executor.store.runlist import (
    DEFAULT_PAGE,
    MAX_PAGE,
    BadFilter,
    Cursor,
    RunFilter,
    cursor_or_none,
    states_of,
)

from .render import with_query

_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
# The longest value any field takes (a cursor is a float and a run id): longer is refused
# before it is parsed.
MAX_VALUE = 2048


class Query(Protocol):
    """A URL's query: aiohttp's MultiDictProxy (``getall`` for a repeated field)."""

    def getall(self, key: str, default: Any = ...) -> list[str]: ...

    def get(self, key: str, default: Any = ...) -> Any: ...


@dataclass(frozen=True, slots=True)
class RunsQuery:
    """A filter, a page size and where the page starts: what a runs list's URL says."""

    which: RunFilter
    limit: int = DEFAULT_PAGE
    before: Cursor | None = None
    after: Cursor | None = None

    def values(self) -> dict[str, Any]:
        """The query string's fields (the form's values too), cursors left out."""
        w = self.which
        return {
            "dag": list(w.dags),
            "state": list(w.states),
            "type": list(w.types),
            "from": w.from_day.isoformat() if w.from_day else "",
            "to": w.to_day.isoformat() if w.to_day else "",
            "q": w.text,
            "limit": self.limit if self.limit != DEFAULT_PAGE else "",
        }

    def link(self, path: str, *, before: Cursor | None = None, after: Cursor | None = None) -> str:
        """``path`` with this filter and the given cursor: a shareable URL of that page."""
        return with_query(
            path,
            {
                **self.values(),
                "before": before.text() if before else "",
                "after": after.text() if after else "",
            },
        )

    def first_page(self) -> RunsQuery:
        return replace(self, before=None, after=None)


def read_query(query: Query | Mapping[str, str]) -> RunsQuery:
    """The filter a URL's query asks for; :class:`BadFilter` names a bad field."""

    def every(name: str) -> list[str]:
        values = query.getall(name, []) if hasattr(query, "getall") else [query.get(name, "")]
        for v in values:
            if len(v) > MAX_VALUE:
                raise BadFilter(name, f"longer than {MAX_VALUE} characters")
        return [v.strip() for v in values if v and v.strip()]

    def one(name: str) -> str:
        values = every(name)
        if len(values) > 1:
            raise BadFilter(name, "give it once")
        return values[0] if values else ""

    which = RunFilter(
        dags=tuple(dict.fromkeys(every("dag"))),
        states=states_of(every("state")),
        types=tuple(dict.fromkeys(v.lower() for v in every("type"))),
        from_day=_day(one("from"), "from"),
        to_day=_day(one("to"), "to"),
        text=one("q"),
    )
    return RunsQuery(
        which,
        limit=_limit(one("limit")),
        before=cursor_or_none(one("before"), "before"),
        after=cursor_or_none(one("after"), "after"),
    )


def _day(text: str, field: str) -> date | None:
    if not text:
        return None
    try:
        if not _DAY.fullmatch(text):
            raise ValueError(text)
        return date.fromisoformat(text)
    except ValueError:
        raise BadFilter(field, f"not a day (YYYY-MM-DD): {text[:40]!r}") from None


def _limit(text: str) -> int:
    if not text:
        return DEFAULT_PAGE
    try:
        value = int(text)
    except ValueError:
        raise BadFilter("limit", f"not a number: {text[:40]!r}") from None
    if not 1 <= value <= MAX_PAGE:
        raise BadFilter("limit", f"between 1 and {MAX_PAGE}, not {value}")
    return value
