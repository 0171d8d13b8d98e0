"""The benchmarks' calibration, repeats and load bookkeeping (no timing asserted)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import calibration


def test_spread_gives_min_median_max_and_keeps_every_run() -> None:
    s = calibration.spread([3.0, 1.0, 2.0])
    assert (s["min"], s["median"], s["max"], s["values"]) == (1.0, 2.0, 3.0, [3.0, 1.0, 2.0])


def test_spread_of_nothing_measured_is_none_not_zero() -> None:
    s = calibration.spread([None, None])
    assert (s["min"], s["median"], s["max"]) == (None, None, None)


def test_the_median_run_is_the_one_kept() -> None:
    assert calibration.median_index([5.0, 1.0, 3.0]) == 2
    assert calibration.median_index([4.0, 1.0, 3.0, 2.0]) == 3  # the lower median


def test_repeats_flag_refuses_zero_runs(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser(prog="bench")
    calibration.add_repeats_argument(p)
    assert p.parse_args([]).repeats == 3
    with pytest.raises(SystemExit):
        p.parse_args(["--repeats", "0"])
    assert "'0' is not a whole number of runs >= 1" in capsys.readouterr().err


def test_a_recording_carries_calibration_repeats_and_load(tmp_path: Path) -> None:
    with calibration.Recording(tmp_path) as rec:
        outs = rec.repeat(3, lambda i: {"rate": float(10 - i)}, lambda out: dict(out))
    assert [o["rate"] for o in outs] == [10.0, 9.0, 8.0]
    fields = rec.fields()
    cal = fields["calibration"]
    assert cal["cpu_loop_kiter_per_s"] > 0 and cal["sqlite_commits_per_s"] > 0
    assert cal["at_start"] is not None and cal["at_end"] is not None
    assert cal["cores"] >= 1 and cal["python"]
    rep = fields["repeats"]
    assert rep["count"] == 3
    assert rep["figures"]["rate"] == {"min": 8.0, "median": 9.0, "max": 10.0, "values": [10, 9, 8]}
    assert all(r["load"]["wall_s"] >= 0 for r in rep["runs"])
    assert "other_processes_cpus_busy" in fields["load"]
    assert list(tmp_path.iterdir()) == []  # the SQLite files went with their temp folder
