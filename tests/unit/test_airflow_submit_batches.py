"""Outcomes written in transactions of a bounded number of trigger ids (no Airflow needed):
a burst is cut into batches, a big outcome into parts, nothing lost, reordered or mixed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from triggerer.airflow.rows import Outcome, in_batches


def outcomes_of(sizes: list[int]) -> list[Outcome]:
    out, next_id = [], 0
    for n, size in enumerate(sizes):
        ids = list(range(next_id, next_id + size))
        next_id += size
        out.append(Outcome(ids, event={"n": n}, names=[f"t{i}" for i in ids], key=("k", n)))
    return out


@given(st.lists(st.integers(0, 1_300), max_size=12), st.integers(1, 600))
def test_every_id_once_in_order_and_no_batch_over_the_bound(sizes: list[int], most: int) -> None:
    outcomes = outcomes_of(sizes)
    batches = in_batches(outcomes, most)
    parts = [p for b in batches for p in b]
    assert all(sum(len(p.ids) for p in b) <= most for b in batches)
    assert all(b for b in batches)
    assert [i for p in parts for i in p.ids] == [i for o in outcomes for i in o.ids]
    for p in parts:  # a part keeps its outcome's event and key; its names follow its ids
        assert p.names == [f"t{i}" for i in p.ids]
        [whole] = [o for o in outcomes if o.key == p.key]
        assert p.event == whole.event and set(p.ids) <= set(whole.ids)


def test_a_hundred_thousand_ids_on_one_condition_become_transactions_of_500() -> None:
    [big] = outcomes_of([100_000])
    batches = in_batches([big], 500)
    assert len(batches) == 200 and {len(b[0].ids) for b in batches} == {500}
    small = outcomes_of([3, 4])
    assert in_batches(small, 500) == [small]  # a usual burst is one transaction, untouched
