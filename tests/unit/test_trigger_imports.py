"""Trigger classes resolved off the event loop (triggers/registry.py): imported in the
import thread, cached, a failing import remembered for the next trigger_class() rather
than run again on the caller's thread, a classpath not allow-listed never imported.

The triggerer's side (a slow import while leases run) is in
tests/store/test_trigger_loading_edges.py.
"""

from __future__ import annotations

import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from triggers import registry
from triggers.registry import TriggerLoadError, resolve, trigger_class


def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> tuple[str, Path]:
    """A real module on sys.path that notes the thread of each import of it in a file."""
    name = f"imported_{uuid.uuid4().hex[:8]}"
    marks = tmp_path / f"{name}.imports"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(f"""
            import threading

            with open({str(marks)!r}, "a") as f:
                f.write(threading.current_thread().name + "\\n")

            from triggers.base import BaseTrigger
        """)
        + textwrap.dedent(body)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, marks


def imports(marks: Path) -> list[str]:
    return marks.read_text().split() if marks.exists() else []


async def test_a_class_is_imported_in_the_import_thread_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, marks = module(tmp_path, monkeypatch, "class T(BaseTrigger):\n    pass\n")
    classpath = f"{name}.T"
    monkeypatch.setenv("SLOTLESS_ALLOWED_TRIGGERS", classpath)
    assert not registry.is_resolved(classpath)
    await resolve([classpath])
    assert registry.is_resolved(classpath)
    ((thread,),) = [imports(marks)]
    assert thread.startswith("trigger-import") and thread != threading.current_thread().name
    assert trigger_class(classpath).__name__ == "T"
    await resolve([classpath])  # cached: not imported again
    assert len(imports(marks)) == 1


async def test_a_failing_import_is_remembered_not_run_again_on_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, marks = module(tmp_path, monkeypatch, "raise RuntimeError('no SDK here')\n")
    classpath = f"{name}.T"
    monkeypatch.setenv("SLOTLESS_ALLOWED_TRIGGERS", classpath)
    await resolve([classpath])
    with pytest.raises(TriggerLoadError, match="RuntimeError: no SDK here"):
        trigger_class(classpath)
    assert len(imports(marks)) == 1  # raised from what the thread saw
    await resolve([classpath])  # the next load tries again, in the thread
    assert [t.startswith("trigger-import") for t in imports(marks)] == [True, True]


async def test_a_classpath_not_allow_listed_is_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, marks = module(tmp_path, monkeypatch, "class T(BaseTrigger):\n    pass\n")
    classpath = f"{name}.T"
    monkeypatch.delenv("SLOTLESS_ALLOWED_TRIGGERS", raising=False)
    await resolve([classpath])
    assert imports(marks) == []
    with pytest.raises(TriggerLoadError, match="not allow-listed"):
        trigger_class(classpath)
    monkeypatch.setenv("SLOTLESS_ALLOWED_TRIGGERS", classpath)  # allowed later: it loads
    await resolve([classpath])
    assert trigger_class(classpath).__name__ == "T"
