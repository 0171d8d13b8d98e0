"""``slotless airflow-triggerer`` without Airflow: which rows are one check, which Airflow
versions it serves, and the one line it says where Airflow is not installed."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta, timezone

import pytest

from slotless.cli import main
from triggerer.airflow.boot import version_refusal
from triggerer.airflow.plans import (
    DATETIME,
    FILE,
    S3KEY,
    TIMEDELTA,
    canonical,
    plan,
    poke_interval,
)

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


def _s3(**changes: object) -> dict[str, object]:
    """An S3KeyTrigger's kwargs as the provider's serialize() writes them (9.39.0), as an
    S3KeySensor(deferrable=True) defers: every kwarg present, defaults included."""
    kwargs: dict[str, object] = {
        "bucket_name": "lake",
        "bucket_key": "in/a.csv",
        "wildcard_match": False,
        "aws_conn_id": "aws_default",
        "hook_params": {},
        "poke_interval": 5.0,
        "should_check_fn": False,
        "use_regex": False,
        "region_name": None,
        "verify": None,
        "botocore_config": None,
        "metadata_keys": ["Size", "Key"],
    }
    kwargs.update(changes)
    return kwargs


def test_equal_s3_keys_are_one_native_check_whatever_their_interval() -> None:
    a = plan(S3KEY, _s3())
    assert a.kind == "s3"
    assert a.key == ("s3", "aws_default", None, None, "lake", "in/a.csv", False)
    # What only paces the check, or what the provider reads only with should_check_fn.
    assert plan(S3KEY, _s3(poke_interval=0.5, metadata_keys=None)).key == a.key
    # The same key written as a URL (bucket_name None), or as a list of one.
    assert plan(S3KEY, _s3(bucket_name=None, bucket_key="s3://lake/in/a.csv")).key == a.key
    assert plan(S3KEY, _s3(bucket_key=["in/a.csv"])).key == a.key
    # Only what the provider's constructor needs: the rest defaults as it does.
    assert plan(S3KEY, {"bucket_name": "lake", "bucket_key": "in/a.csv"}).key == a.key


def test_what_an_s3_check_waits_for_is_in_its_key() -> None:
    a = plan(S3KEY, _s3()).key
    others = [
        _s3(bucket_key="in/b.csv"),
        _s3(bucket_name="other"),
        _s3(wildcard_match=True),
        _s3(aws_conn_id="prod"),
        _s3(aws_conn_id=None),
        _s3(region_name="eu-west-1"),
        _s3(verify=False),
    ]
    keys = {plan(S3KEY, kw).key for kw in others}
    assert all(plan(S3KEY, kw).kind == "s3" for kw in others)
    assert a not in keys and len(keys) == len(others)


def test_a_list_of_s3_keys_is_one_wait_for_all_of_them_in_any_order() -> None:
    a = plan(S3KEY, _s3(bucket_key=["in/b.csv", "in/a.csv", "in/b.csv"]))
    assert a.kind == "s3" and a.key[5] == ("in/a.csv", "in/b.csv")
    assert plan(S3KEY, _s3(bucket_key=["in/a.csv", "in/b.csv"])).key == a.key
    urls = ["s3://lake/in/a.csv", "S3A://lake/in/b.csv"]
    assert plan(S3KEY, _s3(bucket_name=None, bucket_key=urls)).key == a.key


@pytest.mark.parametrize(
    "changes",
    [
        {"should_check_fn": True},  # the provider HEADs each file for check_fn
        {"use_regex": True},
        {"hook_params": {"requester_pays": True}},
        {"botocore_config": {"read_timeout": 5}},
        {"min_size": 10},  # a kwarg of another provider version
        {"metadata_keys": "Size"},
        {"wildcard_match": "yes"},
        {"verify": "/etc/ssl/ca.pem"},  # a CA bundle
        {"poke_interval": 0},
        {"aws_conn_id": ""},
        {"bucket_key": []},  # the provider fires at once on an empty list: not worth it here
        {"bucket_key": ""},
        {"bucket_key": "s3://lake/in/a.csv"},  # a URL beside a bucket_name: the provider raises
        {"bucket_name": ""},  # the provider takes the bucket from the connection
        {"bucket_name": None, "bucket_key": "in/a.csv"},  # no bucket at all
        {"bucket_name": None, "bucket_key": "https://lake.s3.eu-west-1.amazonaws.com/a"},
        {"bucket_name": None, "bucket_key": ["s3://lake/a", "s3://other/b"]},  # two buckets
    ],
)
def test_an_s3_wait_the_native_check_does_not_do_exactly_goes_through_the_adapter(
    changes: dict[str, object],
) -> None:
    p = plan(S3KEY, _s3(**changes))
    assert p.kind == "adapter", changes
    assert plan(S3KEY, {"bucket_key": "in/a.csv"}).kind == "adapter"  # no bucket_name


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
