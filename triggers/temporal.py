"""DateTimeTrigger and TimeDeltaTrigger: the scheduler sleeps until the moment, no polling."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import model_validator

from .base import BaseTrigger, TriggerEvent
from .context import TriggerContext


class DateTimeTrigger(BaseTrigger):
    """Fires at ``moment`` (an aware datetime; naive ones are taken as UTC)."""

    moment: datetime

    @model_validator(mode="after")
    def _aware(self) -> DateTimeTrigger:
        if self.moment.tzinfo is None:
            object.__setattr__(self, "moment", self.moment.replace(tzinfo=UTC))
        return self

    def describe(self) -> str:
        return f"time {self.moment.isoformat()}"

    def first_check_at(self, now: float) -> float:
        return self.moment.timestamp()

    def next_check_at(self, now: float, interval: float) -> float:
        return max(now + 0.001, self.moment.timestamp())

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        if ctx.now() >= self.moment.timestamp():
            return TriggerEvent(payload={"moment": self.moment.isoformat()})
        return None


class TimeDeltaTrigger(DateTimeTrigger):
    """Fires ``delta`` after it was created (stored as the resulting moment)."""

    delta: timedelta | None = None

    @model_validator(mode="before")
    @classmethod
    def _moment_from_delta(cls, data: Any) -> Any:
        if isinstance(data, dict) and "moment" not in data and data.get("delta") is not None:
            delta = data["delta"]
            seconds = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
            data = {**data, "moment": datetime.fromtimestamp(time.time() + seconds, UTC)}
        return data

    def poke_context(self) -> dict[str, Any]:
        return {"moment": self.moment.isoformat()}
