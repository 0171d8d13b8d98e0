"""``slotless airflow-triggerer`` without Airflow: which SFTPTrigger rows are one native
check, which directory's listing answers each, and which run through the adapter."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from triggerer.airflow.native_sftp import SFTP, directory
from triggerer.airflow.plans import plan, poke_interval

SINCE = datetime(2026, 5, 1, 6, 0, tzinfo=UTC)


def _sftp(**changes: Any) -> dict[str, Any]:
    # What the provider's SFTPTrigger.serialize() writes (SFTPSensor(deferrable=True)).
    kwargs: dict[str, Any] = {
        "path": "/data/in/a.csv",
        "file_pattern": "",
        "sftp_conn_id": "files",
        "newer_than": None,
        "poke_interval": 5.0,
    }
    return {**kwargs, **changes}


def test_equal_sftp_waits_are_one_native_check_whatever_their_interval() -> None:
    a = plan(SFTP, _sftp())
    assert a.kind == "sftp"
    assert a.key == ("sftp", "files", "/data/in/a.csv", "", None)
    assert plan(SFTP, _sftp(poke_interval=0.5)).key == a.key
    # The provider's falsy pattern and newer_than: a plain path, no time.
    assert plan(SFTP, _sftp(file_pattern=None, newer_than="")).key == a.key
    # Only a path: the provider's defaults.
    assert plan(SFTP, {"path": "/data/in/a.csv"}).key[1] == "sftp_default"
    assert poke_interval(_sftp(poke_interval=0.5)) == 0.5
    assert poke_interval({"path": "/x"}) == 5.0


def test_what_an_sftp_check_waits_for_is_in_its_key() -> None:
    others = [
        _sftp(sftp_conn_id="other"),
        _sftp(path="/data/in/b.csv"),
        _sftp(path="/data/in", file_pattern="*.csv"),
        _sftp(newer_than=SINCE),
    ]
    keys = {plan(SFTP, kw).key for kw in others} | {plan(SFTP, _sftp()).key}
    assert len(keys) == len(others) + 1
    assert all(plan(SFTP, kw).kind == "sftp" for kw in others)


def test_newer_than_as_a_time_or_as_its_text_is_one_wait() -> None:
    # The provider parses a string with dateutil: the same instant as the datetime.
    a = plan(SFTP, _sftp(newer_than=SINCE))
    assert a.key[4] == SINCE.isoformat()
    assert plan(SFTP, _sftp(newer_than=SINCE.isoformat())).key == a.key


def test_waits_in_one_directory_share_its_listing() -> None:
    plain = plan(SFTP, _sftp()).key
    pattern = plan(SFTP, _sftp(path="/data/in/", file_pattern="*.csv")).key
    assert directory(plain) == directory(pattern) == "/data/in"
    assert directory(plan(SFTP, _sftp(path="a.csv")).key) == "."  # the login directory
    assert directory(plan(SFTP, _sftp(path="/", file_pattern="*")).key) == "/"


@pytest.mark.parametrize(
    "changes",
    [
        {"remote_host": "elsewhere"},  # a kwarg of another provider version
        {"path": "/data/in/"},  # a plain path naming no entry: the provider stats it
        {"path": "/"},
        {"path": "/data/.."},
        {"path": ""},
        {"sftp_conn_id": None},
        {"file_pattern": ["*.csv"]},
        {"newer_than": 1760000000},
        {"poke_interval": 0},
        {"poke_interval": True},
    ],
)
def test_an_sftp_wait_the_native_check_does_not_do_exactly_goes_through_the_adapter(
    changes: dict[str, Any],
) -> None:
    assert plan(SFTP, _sftp(**changes)).kind == "adapter"
