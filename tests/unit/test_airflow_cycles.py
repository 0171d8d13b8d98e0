"""The airflow-triggerer's assignment cycle (triggerer/airflow/engine.py), without Airflow:
a cycle reads only the rows above the newest id of the last whole listing, and rows gone
are forgotten at the next whole listing; who checks what is looked at again only for the
rows new in the cycle (and those whose check ended while they still wait), unless the
live instances changed."""

from __future__ import annotations

import math
import time
from typing import Any

from triggerer.airflow.engine import Engine
from triggerer.airflow.owners import Peer
from triggerer.airflow.plans import Plan
from triggerer.airflow.rows import Outcome, Row, Seen

JOB = 7


class Rows:
    """Airflow's trigger table as the engine's rows object sees it: rows held by JOB."""

    select_limit = 50

    def __init__(self) -> None:
        self.table: dict[int, Row] = {}
        self.asked: list[int | None] = []  # each cycle's ``above`` (None: a whole listing)

    def cycle(self, above: int | None = None) -> Seen:
        self.asked.append(above)
        held = {t: JOB for t in self.table if above is None or t > above}
        return Seen(held, [Peer(JOB, time.time(), True)], time.time(), full=above is None)

    def load(self, ids: Any) -> tuple[list[Row], list[Outcome], set[int]]:
        return [self.table[t] for t in ids if t in self.table], [], set()

    def clean_unused(self) -> None:
        return None


def _row(tid: int) -> Row:
    return Row(tid, "my.triggers.Custom", {"n": tid}, True, f"d/r/t{tid}", "d")


async def test_cycles_read_new_rows_and_forget_gone_ones_at_a_whole_listing() -> None:
    rows = Rows()
    engine = Engine(rows=rows, interval=1.0)  # type: ignore[arg-type]
    engine.job_id = JOB
    looked: list[int] = []  # rows whose owner was looked at, each cycle
    joined: set[int] = set()

    def join(row: Row, p: Plan) -> None:
        joined.add(row.id)
        engine.member[row.id] = None  # type: ignore[assignment]

    def leave(tid: int) -> None:
        joined.discard(tid)
        engine.member.pop(tid, None)

    own = engine._own

    async def counted(tids: list[int]) -> None:
        looked.append(len(tids))
        await own(tids)

    engine._join = join  # type: ignore[method-assign]
    engine._leave = leave  # type: ignore[method-assign]
    engine._own = counted  # type: ignore[method-assign]

    rows.table = {t: _row(t) for t in (1, 2, 3)}
    await engine._cycle()
    assert rows.asked == [None] and joined == {1, 2, 3} and looked == [3]

    rows.table[4] = _row(4)
    del rows.table[2]  # resumed by another instance, cleared
    await engine._cycle()
    assert rows.asked[-1] == 3  # only the rows above the last whole listing's newest
    assert joined == {1, 2, 3, 4} and looked[-1] == 1  # only the new row looked at

    await engine._cycle()
    assert rows.asked[-1] == 3 and looked[-1] == 0  # nothing new: nothing looked at

    # A check that ended while its row still waits (an asset watcher's run() returned):
    # the row joins a check again at the next cycle, not at the next whole listing.
    engine.member.pop(3)
    joined.discard(3)
    engine._rejoin.add(3)
    await engine._cycle()
    assert rows.asked[-1] == 3 and looked[-1] == 1 and 3 in joined

    engine._listed_all_at = -math.inf  # LIST_ALL_S passed
    await engine._cycle()
    assert rows.asked[-1] is None
    assert joined == {1, 3, 4} and 2 not in engine.known  # gone: forgotten now
    assert engine._watermark == 4
