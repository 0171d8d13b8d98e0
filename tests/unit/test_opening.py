"""A database URL as start errors show it: never its password, otherwise as given."""

from __future__ import annotations

import pytest

from executor.driver.opening import redact


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/prod", "postgresql://app:***@db:5432/prod"),
        (
            "postgresql://app@db/prod?search_path=x&password=s3cret",
            "postgresql://app@db/prod?search_path=x&password=***",
        ),
        ("postgresql://app@db/prod", "postgresql://app@db/prod"),
        ("sqlite:////srv/slotless.db", "sqlite:////srv/slotless.db"),
        ("sqlite:///rel.db", "sqlite:///rel.db"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redact(url) == shown
