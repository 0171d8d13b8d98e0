"""The parts of benchmarks/vs_airflow.py that decide its figures, without Airflow: the probe
put in both triggerers (checks counted by audit hook, loop stalls) and the derived figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.helpers import wait_until

from benchmarks import vs_airflow
from benchmarks.vs_airflow import (
    PROBE,
    System,
    derive,
    keep_other,
    pick,
    rate_over_whole_cycles,
    ratio,
    w3,
)

CHILD = """
import asyncio, glob, os, time

async def main():
    for i in range(7):
        glob.glob({inbox!r} + f"/{{i % 5}}.csv")
    os.scandir({inbox!r}).close()
    await asyncio.sleep(0.1)
    time.sleep(0.3)          # a stall of the loop the probe watches
    await asyncio.sleep(1.5)  # the probe writes its counters meanwhile

asyncio.run(main())
"""


def test_the_probe_counts_checks_distinct_paths_and_loop_stalls(tmp_path: Path) -> None:
    out = tmp_path / "probe"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(PROBE),
        "VS_PROBE_DIR": str(out),
        "VS_EXPECT_PATHS": "5",
    }
    code = textwrap.dedent(CHILD.format(inbox=str(tmp_path)))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    [f] = wait_until(lambda: list(out.glob("*.json")), 10, what="the probe's file")
    doc = json.loads(f.read_text())
    assert doc["glob"] == 7 and doc["scandir"] == 1
    assert doc["distinct"] == 5 and doc["all_seen_at"] is not None  # every path seen once
    # The 0.3 s stall is seen; a loaded machine may add shorter ones of its own.
    assert any(lag >= 0.25 for _, lag in doc["stalls"])


def test_without_its_variable_the_probe_does_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VS_PROBE_DIR"}
    env["PYTHONPATH"] = str(PROBE)
    code = "import sys, threading; print(len(threading.enumerate()), sys.audit.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split()[0] == "1"  # no probe thread
    assert not list(tmp_path.iterdir())


def test_ratios_and_marginal_memory_come_from_the_measured_figures() -> None:
    doc: dict[str, Any] = {
        "airflow": {
            "w1": [
                {"n": 1000, "pss_bytes": 300_000_000},
                {"n": 5000, "pss_bytes": 400_000_000},
                {"n": 19000, "failed": "exited: Too many open files"},
            ]
        },
        "slotless": {"w1": [{"n": 1000, "pss_bytes": 50_000_000}]},
    }
    derive(doc)
    assert doc["airflow"]["w1_marginal_bytes_per_wait"] == [
        {"from": 1000, "to": 5000, "bytes_per_wait": 25_000}
    ]
    assert doc["slotless"]["w1_marginal_bytes_per_wait"] == []
    assert pick(doc["airflow"]["w1"], "pss_bytes", n=5000) == 400_000_000
    assert pick(doc["airflow"]["w1"], "pss_bytes", n=19000) is None  # failed: no figure
    assert ratio(3.0, 1.5) == 2.0 and ratio(None, 1.0) is None and ratio(1.0, 0) is None


class _Clock:
    """A clock that sleeps instantly: the window's arithmetic, not the machine's timing."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Bursts(System):
    """A triggerer stand-in checking `per_cycle` waits in one burst every `period` seconds
    (an interval plus the time a check takes), as slotless's triggerer does."""

    name = "bursts"

    def __init__(
        self, work: Path, clock: _Clock, per_cycle: int, period: float, phase: float
    ) -> None:
        super().__init__(work)
        self.clock, self.per_cycle, self.period, self.phase = clock, per_cycle, period, phase

    def seed(self, paths: list[str], interval: float) -> float:
        return 0.0

    def start(self, n: int, n_distinct: int) -> None:
        self.started_at = self.clock.monotonic()

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        pass

    def probe(self) -> dict[str, Any]:
        return {"glob": 0, "scandir": 0, "distinct": 0, "stalls": [], "all_seen_at": None}

    def checks(self) -> int:
        since = self.clock.monotonic() - self.started_at + self.phase
        bursts = int(since / self.period) + 1
        return bursts * self.per_cycle

    def held(self, n_distinct: int) -> bool:
        return True


@pytest.mark.parametrize("phase", [0.0, 0.17, 0.33, 0.51])
def test_w3_counts_whole_cycles_not_the_bursts_a_window_happens_to_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: float
) -> None:
    # 600 checks every 0.6 s (0.5 s interval + 0.1 s of checking): 1,000/s. A fixed 2 s
    # window holds 3 or 4 bursts, 900/s or 1,200/s, depending on where it starts.
    clock = _Clock()
    monkeypatch.setattr(vs_airflow, "time", clock)
    system = _Bursts(tmp_path, clock, 600, 0.6, phase)  # phase: where the window begins
    out = w3(system, 1000, 600, 0.5, 2.0, 10)
    assert "failed" not in out
    assert out["checks_per_s"] == pytest.approx(1000, rel=0.05)
    assert out["checks_per_cycle"] == 600
    assert out["cycles_counted"] >= 2


def test_checks_spread_over_time_are_counted_over_the_whole_window() -> None:
    samples = [(t / 10, 20 * t) for t in range(101)]  # 200 checks/s, no pause
    got = rate_over_whole_cycles(samples, 5.0)
    assert got["checks_per_s"] == 200.0 and got["cycles_counted"] is None


def test_a_one_sided_rerun_keeps_the_other_side_with_when_it_was_measured(
    tmp_path: Path,
) -> None:
    old = tmp_path / "vs_airflow.json"
    old.write_text(
        json.dumps(
            {
                "date": "2026-11-24T04:30:07+00:00",
                "command": "python -m benchmarks.vs_airflow",
                "airflow": {"w3": {"checks_per_s": 201.6}},
                "slotless": {"w3": {"checks_per_s": 99.9}},
            }
        )
    )
    doc: dict[str, Any] = {"slotless": {"w3": {"checks_per_s": 120.0}}}
    keep_other(doc, "slotless", old)
    assert doc["slotless"]["w3"]["checks_per_s"] == 120.0  # the new run stays
    assert doc["airflow"]["w3"]["checks_per_s"] == 201.6
    assert doc["airflow"]["measured"]["date"] == "2026-11-24T04:30:07+00:00"
