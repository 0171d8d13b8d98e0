"""What every part of the store is built over: the database driver and the clock."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..driver.db import Database

Clock = Callable[[], float]


class Part:
    """One job's share of the store (claiming, run control, the catalogue, ...).

    Every part is built over the same driver: one :class:`Database` and the clock that
    times what it writes (PostgreSQL's: the server's, so that leases and heartbeats are
    judged on one timeline across hosts). A process builds only the parts it uses.
    """

    def __init__(self, db: Database, clock: Clock = time.time) -> None:
        self.db = db
        self.clock = clock
