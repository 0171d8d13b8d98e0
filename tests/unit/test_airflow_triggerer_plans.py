"""``slotless airflow-triggerer`` without Airflow: which rows are one check, which Airflow
versions it serves, and the one line it says where Airflow is not installed."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta, timezone

import pytest

from slotless.cli import main
from triggerer.airflow.boot import version_refusal
from triggerer.airflow.plans import DATETIME, FILE, TIMEDELTA, canonical, plan, poke_interval

MOMENT = datetime(2026, 5, 1, 6, 0, tzinfo=UTC)


@pytest.mark.parametrize("version", ["3.3.0", "3.3.2", "3.3.10rc1"])
def test_serves_airflow_3_3(version: str) -> None:
    assert version_refusal(version) is None


@pytest.mark.parametrize("version", ["2.10.5", "3.2.1", "3.4.0", "4.0.0", "nightly"])
def test_refuses_other_airflow_versions_naming_the_supported_ones(version: str) -> None:
    line = version_refusal(version)
    assert line is not None and "\n" not in line
    assert "3.3" in line and version in line


def test_equal_files_are_one_check_whatever_their_interval() -> None:
    a = plan(FILE, {"filepath": "/in/x.csv", "recursive": False, "poke_interval": 5.0})
    b = plan(FILE, {"filepath": "/in/x.csv", "poke_interval": 0.5})
    assert a.kind == b.kind == "file" and a.key == b.key
    assert plan(FILE, {"filepath": "/in/x.csv", "recursive": True}).key != a.key
    assert plan(FILE, {"filepath": "/in/y.csv"}).key != a.key
    assert poke_interval({"filepath": "/in/x.csv", "poke_interval": 0.5}) == 0.5
    assert poke_interval({"filepath": "/in/x.csv"}) == 5.0


def test_a_kwarg_the_native_check_does_not_know_goes_through_the_adapter() -> None:
    # Another provider version's kwarg must not be silently ignored.
    p = plan(FILE, {"filepath": "/in/x.csv", "min_size": 10})
    assert p.kind == "adapter"


def test_moments_are_timers_unless_rendered_at_the_triggerer() -> None:
    a = plan(DATETIME, {"moment": MOMENT, "end_from_trigger": False})
    same_instant = MOMENT.astimezone(timezone(timedelta(hours=2)))
    assert plan(TIMEDELTA, {"moment": same_instant}).key == a.key
    assert a.kind == "time"
    assert plan(DATETIME, {"moment": MOMENT, "end_from_trigger": True}).key != a.key
    assert plan(DATETIME, {"target_time": "{{ ds }}T06:00"}).kind == "adapter"
    assert plan(DATETIME, {"moment": MOMENT.replace(tzinfo=None)}).kind == "adapter"


def test_any_other_class_is_one_check_per_equal_kwargs() -> None:
    cls = "mycompany.triggers.JobDone"
    a = plan(cls, {"job": 7, "at": MOMENT, "tags": ["a", "b"]})
    b = plan(cls, {"tags": ["a", "b"], "at": MOMENT, "job": 7})
    assert a.kind == "adapter" and a.key == b.key
    assert plan(cls, {"job": 8, "at": MOMENT, "tags": ["a", "b"]}).key != a.key
    assert plan("other.Trigger", {"job": 7, "at": MOMENT, "tags": ["a", "b"]}).key != a.key
    assert canonical({"d": timedelta(seconds=1)}) != canonical({"d": 1.0})
    # Keys JSON cannot sort are still a key, not an error that would stop every cycle.
    odd = {"by": {1: "a", "b": 2}}
    assert plan(cls, odd).key == plan(cls, {"by": {"b": 2, 1: "a"}}).key


@pytest.mark.skipif(importlib.util.find_spec("airflow") is not None, reason="Airflow installed")
def test_without_airflow_it_says_what_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["airflow-triggerer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "slotless[airflow]" in err[0] and "deployment's environment" in err[0]


def test_bad_options_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["airflow-triggerer", "--capacity", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["slotless: error: --capacity and --interval must be positive"]
    assert main(["airflow-triggerer", "--queues", " , "]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["slotless: error: --queues names no queue: give one or more, comma-separated"]
