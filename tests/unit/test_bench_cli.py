"""``slotless bench NAME`` offers every runnable benchmark of the checkout, and only those."""

from __future__ import annotations

from support.helpers import REPO

from slotless.bench import BENCHES

# Imported by the benchmarks, not run: vs_airflow_triggerer is vs_airflow's
# --through-airflow mode (`slotless bench vs_airflow --through-airflow`).
HELPERS = {"__init__", "common", "calibration", "airflow_env", "vs_airflow_triggerer"}


def test_every_benchmark_module_is_offered_and_each_offered_one_runs_as_a_module() -> None:
    modules = {p.stem for p in (REPO / "benchmarks").glob("*.py")} - HELPERS
    assert set(BENCHES) == modules
    for name in BENCHES:
        assert '__name__ == "__main__"' in (REPO / "benchmarks" / f"{name}.py").read_text(), name
