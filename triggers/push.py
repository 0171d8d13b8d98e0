"""Push sources: what wakes a check before its next poll (inotify, an S3 event queue, NOTIFY).

A trigger class that can be pushed says so per trigger with :meth:`BaseTrigger.push_interest`:
the shared source that would hear of a change (one inotify watch per directory, one
long-poll consumer per queue, one LISTEN per channel) and the *topic* within it that
concerns this check (a file name, ``bucket/key``, ``dag_id/date``), exact or as a glob.
The triggerer (triggerer/push.py) opens each source once however many checks name it,
wakes the checks whose topic was pushed, and closes the source with its last check.

A push only *wakes* a check: the check itself still decides (the file may be too small,
the key may not match the glob), so a spurious or duplicated push costs one check and
nothing else. While a source is live its checks are polled at a slow safety interval
(missed pushes are covered by it); when a source cannot start or fails, it says why by
raising :class:`PushUnavailable` (or any exception), the triggerer logs one line, its
checks go back to their own interval, and it tries the source again later.

A trigger class declares it (docs/writing-triggers.md has the whole example)::

    class DoneFlag(BaseTrigger):
        path: str
        def push_interest(self, ctx):
            d, name = os.path.split(self.path)
            return PushInterest(("inotify", d), partial(InotifySource, d), topic=name)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

# Called by a source with the topics that changed; ``None`` in the list means "anything
# may have changed" (a queue overflowed, a connection was re-established): every check
# of the source is woken.
Wake = Callable[[Iterable[str | None]], None]


class PushUnavailable(Exception):
    """This source cannot push here (no inotify on this filesystem, the queue is gone, the
    LISTEN connection was lost): its checks are polled at their own interval.

    ``retry=False`` says it never will in this process (SQLite has no notifications): the
    triggerer does not try it again while its checks are held."""

    def __init__(self, reason: str, *, retry: bool = True) -> None:
        super().__init__(reason)
        self.retry = retry


class PushSource:
    """One shared source of wake-ups. Subclasses implement :meth:`run`.

    ``run`` calls ``ready()`` once it listens (every change after that will be pushed:
    the triggerer then checks every waiting check once, which covers what changed before)
    and ``wake(topics)`` for each change; it returns or raises when the source ends.
    ``add(topic)`` / ``discard(topic)`` tell a source that cares which topics are asked
    for (most do not: an inotify watch hears every name in its directory).
    """

    async def run(self, ctx: Any, ready: Callable[[], None], wake: Wake) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, slots=True)
class PushInterest:
    """What would wake one check: the source (shared by ``key``) and the topic in it.

    ``topic`` is an exact name; ``pattern`` a regular expression matched against whole
    topics (for globs and prefixes); neither: any change of the source wakes the check.
    ``opener`` builds the source the first time its key is named.
    """

    key: Hashable
    opener: Callable[[], PushSource] = field(compare=False)
    topic: str | None = None
    pattern: str | None = None

    def matcher(self) -> re.Pattern[str] | None:
        return re.compile(self.pattern, re.DOTALL) if self.pattern is not None else None
