"""The migration guide's slotless halves are the examples that tests/e2e runs: every code
line of a block headed ``# slotless: examples/NAME.py`` is in that file."""

from __future__ import annotations

import re

import pytest
from support.helpers import REPO

GUIDE = REPO / "docs" / "migrating-from-airflow.md"
BLOCK = re.compile(r"```python\n# slotless: (examples/\w+\.py)[^\n]*\n(.*?)```", re.DOTALL)


def code_lines(text: str) -> list[str]:
    lines = (line.split("  #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(GUIDE.read_text())


def test_the_guide_names_both_examples() -> None:
    assert {path for path, _ in blocks()} >= {
        "examples/expand_kwargs.py",
        "examples/task_groups.py",
    }


@pytest.mark.parametrize(("path", "block"), blocks())
def test_each_line_of_the_guide_is_in_its_example(path: str, block: str) -> None:
    example = set(code_lines((REPO / path).read_text()))
    missing = [line for line in code_lines(block) if line not in example]
    assert missing == [], f"{path} lacks lines the guide shows"
