"""The trigger API: what a deferred task waits on.

A trigger is a small pydantic model. Its fields are its serialized kwargs, validated
whenever a row is loaded, so a malformed row fails its own tasks with a clear message.
Write either a poll-style trigger (``async def poke(ctx)`` returning an event or None;
the triggerer schedules it, no coroutine sleeps per trigger) or a push-style one
(``async def run(ctx)`` yielding events, for sources that notify).

>>> class FlagTrigger(BaseTrigger):
...     path: str
...     async def poke(self, ctx):
...         return TriggerEvent(payload={"path": self.path}) if ctx.exists(self.path) else None
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field

from .context import TriggerContext
from .push import PushInterest

if TYPE_CHECKING:
    from .events import EventWait

# Virtual shards: shard = poke_hash mod SHARDS. Fixed, because the worker that defers and
# every triggerer must agree on it; triggerers lease shards, never single triggers.
SHARDS = 64

# What opens a Jinja2 expression, statement or comment: a string holding one is a template
# (executor/templating.py renders it); any other string is kept as it is, unparsed.
_TEMPLATE_MARKS = ("{{", "{%", "{#")

# Fill: (where, template) -> the rendered text; ``where`` names the field ("path",
# "match.date", "items.0") for the error that names it.
Fill = Callable[[str, str], str]


def is_template(value: object) -> bool:
    """Whether ``value`` is a string that Jinja2 would read as a template."""
    return isinstance(value, str) and any(mark in value for mark in _TEMPLATE_MARKS)


def fill_strings(value: Any, fill: Fill, where: str = "") -> Any:
    """``value`` with every template string in it, however deep in dicts and lists,
    replaced by ``fill(where, text)``; dict keys are not templates. The same object when
    nothing in it is a template (no copy)."""
    if is_template(value):
        return fill(where, value)
    if isinstance(value, dict):
        out = {
            k: fill_strings(v, fill, f"{where}.{k}" if where else str(k)) for k, v in value.items()
        }
        return value if all(out[k] is value[k] for k in value) else out
    if isinstance(value, list | tuple):
        items = [
            fill_strings(v, fill, f"{where}.{i}" if where else str(i)) for i, v in enumerate(value)
        ]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items)
    return value


# describe() is copied into task logs, `slotless status` and the web page: a 10 MB value in
# a valid field (a path) must not be copied with it. Longer descriptions are clipped here.
MAX_DESCRIBE = 200


def clip(text: str, limit: int = MAX_DESCRIBE) -> str:
    """``text``, cut to ``limit`` characters with a note saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def shard_of(poke_hash: str) -> int:
    """The virtual shard of a check: duplicates always land on the same triggerer."""
    return int(poke_hash[:15], 16) % SHARDS


class TriggerEvent(BaseModel):
    """What a trigger reports when its condition holds (or can never hold: ``error``)."""

    model_config = ConfigDict(frozen=True)

    payload: Any = None
    error: str | None = None


class BaseTrigger(BaseModel):
    """Base class of every trigger.

    ``poke_interval`` (seconds) is how often the condition is checked; it is an execution
    field, not part of what is checked, so two tasks waiting for the same thing at
    different intervals share one check at the shorter interval.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    poke_interval: float = Field(default=60.0, gt=0)

    # Fields that say how to wait, not what to wait for: left out of the poke context.
    execution_fields: ClassVar[frozenset[str]] = frozenset({"poke_interval"})

    # A push trigger whose run() the triggerer holds open for the whole wait (one coroutine
    # per distinct wait, as Airflow's triggers expect) instead of re-entering it at each
    # check. No check timeout applies to it; see triggerer/holding.py.
    held: ClassVar[bool] = False

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Every describe(), the base one or a subclass's own, is clipped (MAX_DESCRIBE), so
        # no caller can forget to: it reaches logs, status and the web page.
        super().__pydantic_init_subclass__(**kwargs)
        own = cls.__dict__.get("describe")
        if own is not None and not getattr(own, "_clipped", False):

            def describe(self: BaseTrigger, _own: Any = own) -> str:
                return clip(_own(self))

            describe._clipped = True  # type: ignore[attr-defined]
            describe.__doc__ = own.__doc__
            cls.describe = describe  # type: ignore[method-assign]

    @classmethod
    def classpath(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``: everything needed to rebuild this trigger elsewhere."""
        return self.classpath(), self.model_dump(mode="json")

    def poke_context(self) -> dict[str, Any]:
        """What the check depends on; equal contexts are one check, run once for all."""
        return self.model_dump(mode="json", exclude=set(self.execution_fields))

    def poke_hash(self) -> str:
        """Stable across processes and Python versions (sha256 of canonical JSON)."""
        blob = json.dumps(
            {"classpath": self.classpath(), "context": self.poke_context()},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def shard(self) -> int:
        return shard_of(self.poke_hash())

    def describe(self) -> str:
        """A short readable description for logs and the status view."""
        fields = ", ".join(f"{k}={v!r}" for k, v in self.poke_context().items())
        return clip(f"{type(self).__name__}({fields})")

    def connection_key(self) -> str | None:
        """The server this check talks to, so that checks sharing it share their backoff:
        after an outage, one success resets every wait on it. By default the ``conn_id``
        field if there is one, else the host of a ``url`` field; None: nothing shared."""
        conn_id = getattr(self, "conn_id", None)
        if conn_id:
            return f"{self.classpath()}:{conn_id}"
        url = getattr(self, "url", None)
        if isinstance(url, str) and "://" in url:
            return f"{self.classpath()}:{url.split('://', 1)[1].split('/', 1)[0]}"
        return None

    def blame(self) -> str:
        """The class named when this trigger's code blocks the loop (a host names its guest)."""
        return self.classpath()

    def first_check_at(self, now: float) -> float:
        """When to check first; a time trigger returns its moment instead of polling."""
        return now

    def next_check_at(self, now: float, interval: float) -> float:
        return now + interval

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        """Check once; return an event when the condition holds, else None.

        A class that only implements :meth:`poke_many` is checked as a batch of one.
        """
        if type(self).is_batched():
            return unbatched((await type(self).poke_many([self], ctx))[0])
        raise NotImplementedError(f"{type(self).__name__} defines neither poke() nor run()")

    async def run(self, ctx: TriggerContext) -> AsyncIterator[TriggerEvent]:
        """Push style: yield an event when the condition holds (override instead of poke)."""
        raise NotImplementedError
        yield  # pragma: no cover - makes this an async generator

    def push_interest(self, ctx: TriggerContext) -> PushInterest | None:
        """The shared push source that would wake this check, and its topic there.

        None (the default): polled only. The triggerer asks once, when the check is first
        held; a push only wakes the check early, the check still decides (triggers/push.py).
        """
        return None

    @classmethod
    def is_push(cls) -> bool:
        return cls.run is not BaseTrigger.run

    @classmethod
    def is_batched(cls) -> bool:
        return cls.poke_many.__func__ is not BaseTrigger.poke_many.__func__  # type: ignore[attr-defined]

    @classmethod
    async def poke_many(
        cls, triggers: Sequence[BaseTrigger], ctx: TriggerContext
    ) -> Sequence[TriggerEvent | BaseException | None]:
        """Check many distinct triggers of this class at once (override to batch).

        Return one result per trigger, in order; an exception in the list fails only
        the check it stands for.
        """
        raise NotImplementedError

    def event_wait(self) -> EventWait | None:
        """An event wait (triggers/events.py): the name and payload fields it waits for.
        Such a wait is settled by the event's sender, never checked; None for the rest."""
        return None

    def run_requests(self, payload: Any) -> list[tuple[str | None, Any]]:
        """As a DAG's start condition (``DAG(start_when=...)``): the runs one event asks
        for, as ``(run_key, start_event)`` pairs. A run is created once per key, so an
        event seen again creates nothing. ``None`` keys the run by the date the condition
        was rendered for (the default: one run per date). Runs in the triggerer, so keep
        it a cheap function of the payload."""
        return [(None, payload)]

    def templates(self) -> dict[str, str]:
        """Every template string among its fields, by where it is (``"path"``,
        ``"match.date"``): what a DAG's parse checks (executor/templating.py)."""
        found: dict[str, str] = {}

        def note(where: str, text: str) -> str:
            found[where] = text
            return text

        fill_strings(self.model_dump(), note)
        return found

    def render(self, fill: Fill) -> Self:
        """A copy whose template strings, anywhere in its fields, are ``fill(where, text)``
        (executor/templating.py fills them per run); itself when it has none. Validated
        again, so that a value rendered into a bad one is refused as a declared one is."""
        data = self.model_dump()
        rendered = fill_strings(data, fill)
        return self if rendered is data else type(self).model_validate(rendered)


def unbatched(result: TriggerEvent | BaseException | None) -> TriggerEvent | None:
    """One result of ``poke_many`` as ``poke`` answers it: an exception is raised.

    For batched classes whose ``poke`` is a batch of one.
    """
    if isinstance(result, BaseException):
        raise result
    return result


class TransientError(Exception):
    """Raise from a check for a passing failure (server down, throttled): the check is
    retried with backoff and its tasks keep waiting. Any other exception fails them."""
