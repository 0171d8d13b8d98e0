"""The benchmarks' own bookkeeping (no timings asserted): workloads, counting, the CLI."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from pathlib import Path

import pytest

from benchmarks import capacity, dedup, slots
from slotless import cli
from triggers.registry import load_trigger


def test_duplicate_waits_share_conditions() -> None:
    waits = capacity.waits_with_duplicates(1000, 0.4, 60.0)
    assert len(waits) == 1000
    assert len({w.poke_hash() for w in waits}) == 600


def test_cycles_split_on_gaps() -> None:
    log = [(0.0, "a"), (0.1, "b"), (5.0, "a"), (5.2, "b"), (10.1, "a")]
    assert capacity.cycles_of(log, 5.0) == [["a", "b"], ["a", "b"], ["a"]]


def test_w1_cpu_is_reported_only_from_w1s_own_run() -> None:
    """W1 is 19,000 waits on 5 s: a million-wait run's CPU per check is not W1's."""

    def run(triggers: int, interval: float, cpu: float) -> dict[str, object]:
        lags = ("loop_lag_p99_ms", "loop_lag_max_ms", "loop_lag_max_while_loading_ms")
        return {
            **dict.fromkeys(lags, 1.0),
            "load_s": 1.0,
            "bytes_per_trigger": 600,
            "triggers": triggers,
            "interval_s": interval,
            "cpu_us_per_check": cpu,
            "cpu_s_per_min": cpu,
            "probe_latencies_s": [0.1],
        }

    million = run(1_000_000, 60, 13.3)
    alone = capacity.headline([million], 1.0)
    assert (alone["cpu_us_per_check_w1"], alone["cpu_s_per_min_w1"]) == (None, None)
    both = capacity.headline([run(19_000, 5, 9.5), million], 1.0)
    assert both["cpu_us_per_check_w1"] == 9.5 and both["load_s"] == 1.0


def test_inserted_waits_load_as_the_triggerer_loads_them(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    capacity.create_schema(db)
    waits = [capacity.NoopTrigger(key=f"k{i}") for i in range(5)]
    rows = capacity.insert_waits(db, waits, run_id="r", prefix="w", next_method="resume")
    conn = sqlite3.connect(db)
    got = conn.execute(
        "SELECT t.id, t.state, t.next_method, g.classpath, g.kwargs, g.poke_hash"
        " FROM task t JOIN trigger g ON g.id = t.trigger_id ORDER BY t.id"
    ).fetchall()
    conn.close()
    assert [r[0] for r in got] == rows
    for (_, state, method, classpath, kwargs, poke_hash), wait in zip(got, waits, strict=True):
        assert (state, method) == ("DEFERRED", "resume")
        assert load_trigger(classpath, kwargs).poke_hash() == poke_hash == wait.poke_hash()


def test_the_warm_up_checks_as_the_triggerer_does(tmp_path: Path) -> None:
    # It broke once when FileTrigger's checks began to use a context method its stand-in
    # lacked: the capacity benchmark then failed before measuring anything.
    db = tmp_path / "w.db"
    capacity.create_schema(db)
    asyncio.run(capacity._warm_up(str(db)))


def test_salt_makes_equal_keys_distinct_checks() -> None:
    args = argparse.Namespace(sensors=100, duplicates=0.4, prefixes=10, seed=2)
    keys = dedup.workload(args)
    assert len(keys) == 100 and len(set(keys)) == 60
    plain = {dedup.UnbatchedS3KeyTrigger(bucket="b", key=k).poke_hash() for k in keys}
    salted = {
        dedup.SaltedS3KeyTrigger(bucket="b", key=k, salt=str(i)).poke_hash()
        for i, k in enumerate(keys)
    }
    assert (len(plain), len(salted)) == (60, 100)
    assert not dedup.UnbatchedS3KeyTrigger.is_batched()
    assert dedup.S3KeyTrigger.is_batched()


def test_busy_slots_over_time() -> None:
    usage = [("wait_1", "poke", 0.0, 1.0), ("work_1", "execute", 0.5, 1.5)]
    ts, busy = slots.busy_over_time(usage, step=0.5)
    assert list(zip(ts, busy, strict=True))[:4] == [(0.0, 1), (0.5, 2), (1.0, 1), (1.5, 0)]
    assert slots.busy_over_time(usage, "wait_", step=0.5)[1][:3] == [1, 1, 0]


def test_bench_command_refuses_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bench", "nope"])
    assert "invalid choice" in capsys.readouterr().err


def test_bench_command_passes_options_through(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "dedup", "--help"]) == 0


def test_no_duplicates_workload_is_not_measured_not_true() -> None:
    skipped = capacity.duplicates_summary(None, 10_000, 0.4, 5.0)
    assert skipped["measured"] is False
    assert skipped["each_condition_once_per_cycle"] is None  # not a vacuous True
    assert "not measured" in capacity.duplicates_line(skipped)
    no_cycle = capacity.duplicates_summary({"call_log": [], "distinct_checks": 6}, 10, 0.4, 5.0)
    assert no_cycle["each_condition_once_per_cycle"] is None


def test_each_condition_once_per_cycle_is_judged_on_the_cycles_seen() -> None:
    log = [(0.0, "a"), (0.1, "b"), (5.0, "a"), (5.1, "b")]
    ok = capacity.duplicates_summary({"call_log": log, "distinct_checks": 2}, 3, 0.4, 5.0)
    assert ok["each_condition_once_per_cycle"] is True
    assert ok["checks_per_cycle"] == [2, 2]
    twice = [*log, (5.2, "a")]
    bad = capacity.duplicates_summary({"call_log": twice, "distinct_checks": 2}, 3, 0.4, 5.0)
    assert bad["each_condition_once_per_cycle"] is False


def test_a_target_with_no_figure_is_not_measured_not_met() -> None:
    assert capacity._at_most(None, 1.1) is None  # no probe landed: no p99, no pass
    assert capacity._at_most(0.5, 1.1) is True
    assert capacity._at_most(2.0, 1.1) is False
