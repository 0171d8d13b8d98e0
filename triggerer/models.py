"""The trigger objects kept between checks, for the checks due often.

A check's record holds its trigger's class and validated JSON, not the object (a million
waits stay compact records). A check due at least every ``KEEP_INTERVAL`` s keeps its
object between checks instead (at most ``KEEP_MODELS`` of them, the oldest let go first):
19,000 waits on a 5 s interval would otherwise validate their JSON again 3,800 times a
second (~2-3 us each). A million waits on a minute keep none.
"""

from __future__ import annotations

from triggers.base import BaseTrigger

from .checks import Check

KEEP_INTERVAL = 30.0
KEEP_MODELS = 32_768


class KeptModels:
    def __init__(self) -> None:
        # poke_hash -> (the check, its trigger), oldest first.
        self._kept: dict[str, tuple[Check, BaseTrigger]] = {}

    def model(self, check: Check) -> BaseTrigger:
        """The check's trigger for this check: kept from the last one if it is frequent,
        else built from its JSON (and kept, if frequent). Let go by ``check.release()``."""
        kept = self._kept.get(check.poke_hash)
        if kept is not None and kept[0] is check:
            return check.use(kept[1])
        model = check.model()
        if check.interval <= KEEP_INTERVAL:
            if len(self._kept) >= KEEP_MODELS:
                # The oldest out (a dropped check's entry among them).
                del self._kept[next(iter(self._kept))]
            self._kept[check.poke_hash] = (check, model)
        return model

    def forget(self, check: Check) -> None:
        """The check is over: its kept trigger goes (not a newer check's of the same hash)."""
        kept = self._kept.get(check.poke_hash)
        if kept is not None and kept[0] is check:
            del self._kept[check.poke_hash]
