"""Which ``slotless airflow-triggerer`` instance checks a condition, without Airflow: the
live instances read from their Job rows, and the rendezvous owner of a condition's key."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from triggerer.airflow.engine import Engine
from triggerer.airflow.owners import LIVE_S, MARK, Peer, candidates, mark, owner, weight
from triggerer.airflow.plans import FILE, plan

NOW = 1_800_000_000.0
KEYS = [("file", f"/in/{i}.csv", False) for i in range(3000)]


def test_live_instances_are_the_running_ones_heard_from_within_the_threshold() -> None:
    peers = [
        Peer(1, NOW - 0.2, True),
        Peer(2, NOW - LIVE_S - 0.01, True),  # killed: Airflow still counts it alive for 30 s
        Peer(3, NOW - 0.1, False),  # stopped: its Job ended
        Peer(4, NOW - LIVE_S + 0.01, True),
    ]
    assert candidates(peers, NOW) == [1, 4]
    assert candidates(peers, NOW, live_s=5.0) == [1, 2, 4]
    assert candidates([], NOW) == []


def test_equal_conditions_have_one_owner_whatever_the_order_instances_are_listed() -> None:
    a = plan(FILE, {"filepath": "/in/x.csv", "poke_interval": 0.5})
    b = plan(FILE, {"filepath": "/in/x.csv", "poke_interval": 30})  # one check with a
    for among in ([7, 8, 9], [9, 7, 8], [8, 9, 7]):
        assert owner(a.key, among) == owner(b.key, among) == owner(a.key, [7, 8, 9])
    assert owner(a.key, []) is None
    assert owner(a.key, [5]) == 5


def test_conditions_spread_over_the_instances() -> None:
    shares = Counter(owner(k, [11, 12, 13]) for k in KEYS)
    assert set(shares) == {11, 12, 13}
    assert all(n > len(KEYS) / 3 * 0.8 for n in shares.values()), shares


def test_an_instance_leaving_moves_only_its_own_conditions() -> None:
    before = {k: owner(k, [11, 12, 13]) for k in KEYS}
    after = {k: owner(k, [11, 13]) for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert moved and all(before[k] == 12 for k in moved)
    assert all(after[k] == before[k] for k in KEYS if before[k] != 12)
    # And joining moves only the conditions the newcomer wins.
    joined = {k: owner(k, [11, 12, 13, 14]) for k in KEYS}
    assert all(joined[k] in (before[k], 14) for k in KEYS)


def test_every_process_computes_the_same_owner() -> None:
    """No salted ``hash()``: another interpreter, another hash seed, the same weights."""
    key = ("adapter", "x.Trigger", '{"a":1}')
    code = (
        f"from triggerer.airflow.owners import weight;print(weight({key!r}, 3), weight({key!r}, 4))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert done.stdout.split() == [str(weight(key, 3)), str(weight(key, 4))]


def test_instances_serving_other_trigger_queues_are_another_pool() -> None:
    assert mark(None) == mark([]) == MARK
    assert mark(["b", "a"]) == mark({"a", "b"}) == f"{MARK} queues=a,b"
    assert mark(["a"]) != mark(None)
    many = [f"queue-{i}" for i in range(200)]
    assert len(mark(many)) <= 500  # Job.executor_class is 500 wide
    assert mark(many) == mark(reversed(many)) != mark(many[1:])


def test_an_instance_counts_itself_live_when_its_own_beat_is_read_late() -> None:
    """Its loop or the database slow for a moment, an instance reads its own beat late: it
    keeps checking its conditions (dropping and re-joining every one of them each time was
    what made a busy instance's loop stall, and its beat late again). A peer read late is
    not counted: its conditions are taken over."""
    engine = Engine(rows=None, interval=1.0)  # type: ignore[arg-type]  # never cycles here
    engine.job_id = 7
    now = 1000.0
    peers = [Peer(7, now - 10.0, True), Peer(8, now - 0.2, True), Peer(9, now - 10.0, True)]
    assert engine._live(peers, now) == [7, 8]
    assert engine._live([], now) == [7]
