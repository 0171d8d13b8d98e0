"""The trigger API: poke_hash, serialization, validation on load, the allow-list, templates."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.triggers import FlagTrigger, UnlistedTrigger

from executor.templating import Scope, TemplateFailed, render_trigger
from triggers import registry
from triggers.base import SHARDS, BaseTrigger, TriggerEvent, shard_of
from triggers.context import to_thread
from triggers.files import FileTrigger
from triggers.registry import TriggerLoadError, is_allowed, load_trigger, register, trigger_class
from triggers.temporal import DateTimeTrigger, TimeDeltaTrigger

REPO = Path(__file__).resolve().parents[2]

# Computed once (sha256 of the canonical JSON below) and pinned: if this changes, every
# trigger row already in a database lands on a different shard and loses its duplicates.
PINNED_FILE_HASH = "18902aeb5fde6163f45e8d75ebc8dcedab9bec291e874249f62a66c0e2ec8c93"


def test_poke_hash_is_pinned_for_a_fixed_trigger() -> None:
    t = FileTrigger(path="/in/2026-04-25.csv", poke_interval=60)
    assert t.poke_hash() == PINNED_FILE_HASH
    canonical = (
        '{"classpath":"triggers.files.FileTrigger",'
        '"context":{"min_size":0,"path":"/in/2026-04-25.csv"}}'
    )
    assert hashlib.sha256(canonical.encode()).hexdigest() == PINNED_FILE_HASH
    assert t.shard() == shard_of(PINNED_FILE_HASH) == int(PINNED_FILE_HASH[:15], 16) % SHARDS


def test_poke_hash_is_the_same_in_another_process_with_another_hash_seed() -> None:
    code = (
        "from triggers.files import FileTrigger;"
        "print(FileTrigger(path='/in/2026-04-25.csv').poke_hash())"
    )
    for seed in ("1", "4242"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={
                **os.environ,
                "PYTHONHASHSEED": seed,
                "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
            },
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert out.stdout.strip() == PINNED_FILE_HASH


def test_equal_poke_context_gives_equal_hash_whatever_the_interval() -> None:
    fast = FileTrigger(path="/in/a.csv", poke_interval=1)
    slow = FileTrigger(path="/in/a.csv", poke_interval=3600)
    assert fast.poke_context() == slow.poke_context() == {"path": "/in/a.csv", "min_size": 0}
    assert fast.poke_hash() == slow.poke_hash()
    assert fast.shard() == slow.shard()


def test_what_is_checked_changes_the_hash() -> None:
    base = FileTrigger(path="/in/a.csv").poke_hash()
    assert FileTrigger(path="/in/b.csv").poke_hash() != base
    assert FileTrigger(path="/in/a.csv", min_size=1).poke_hash() != base
    # Same fields, another class: another check.
    assert FlagTrigger(name="x").poke_context() == UnlistedTrigger(name="x").poke_context()
    assert FlagTrigger(name="x").poke_hash() != UnlistedTrigger(name="x").poke_hash()


def test_time_delta_trigger_hashes_its_moment_only() -> None:
    a = TimeDeltaTrigger(moment="2026-04-25T06:00:00Z", delta=5, poke_interval=1)
    b = DateTimeTrigger(moment="2026-04-25T06:00:00Z")
    assert a.poke_context() == {"moment": "2026-04-25T06:00:00+00:00"}
    assert a.poke_hash() != b.poke_hash()  # the classpath is part of the hash


@pytest.mark.parametrize(
    "trigger",
    [
        FileTrigger(path="/in/*.csv", min_size=10, poke_interval=2.5),
        DateTimeTrigger(moment="2026-04-25T06:00:00+05:30"),
        FlagTrigger(name="payments", poke_interval=0.1),
    ],
    ids=["file", "datetime", "registered"],
)
def test_serialize_and_load_round_trip(trigger: BaseTrigger) -> None:
    classpath, kwargs = trigger.serialize()
    assert classpath == f"{type(trigger).__module__}.{type(trigger).__qualname__}"
    # What a row stores is JSON text; both a dict and the text load.
    text = json.dumps(kwargs)
    for stored in (kwargs, text):
        again = load_trigger(classpath, stored)
        assert type(again) is type(trigger)
        assert again == trigger
        assert again.poke_hash() == trigger.poke_hash()
        assert again.serialize() == (classpath, kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"path": 3}, "path"),
        ({"path": ""}, "path"),
        ({"path": "/in/[a.csv"}, "path"),
        ({"path": "/in/a", "min_size": "big"}, "min_size"),
        ({"path": "/in/a", "poke_interval": 0}, "poke_interval"),
        ({"path": "/in/a", "bucket": "x"}, "bucket"),
        ({}, "path"),
    ],
)
def test_kwargs_failing_validation_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(TriggerLoadError) as info:
        load_trigger("triggers.files.FileTrigger", json.dumps(kwargs))
    message = str(info.value)
    assert "invalid kwargs for triggers.files.FileTrigger" in message
    assert f"{field}:" in message, message


def test_kwargs_that_are_not_json_are_refused_with_the_classpath() -> None:
    with pytest.raises(TriggerLoadError, match=r"invalid kwargs for triggers\.files\.FileTrigger"):
        load_trigger("triggers.files.FileTrigger", "{not json")
    with pytest.raises(TriggerLoadError, match="invalid kwargs"):
        load_trigger("triggers.files.FileTrigger", "[1, 2]")


def test_a_classpath_not_allow_listed_is_refused_before_import(monkeypatch) -> None:
    monkeypatch.delenv("SLOTLESS_ALLOWED_TRIGGERS", raising=False)
    # os.system is importable: refusal must come from the allow-list, not from the import.
    for classpath in ("os.system", "support.triggers.UnlistedTrigger", "nowhere.Nothing"):
        assert not is_allowed(classpath)
        with pytest.raises(TriggerLoadError, match="not allow-listed"):
            load_trigger(classpath, {})


def test_the_env_allow_list_admits_a_class(monkeypatch) -> None:
    classpath = "support.triggers.UnlistedTrigger"
    monkeypatch.setenv("SLOTLESS_ALLOWED_TRIGGERS", f" other.Thing , {classpath},")
    assert is_allowed(classpath)
    assert trigger_class(classpath) is UnlistedTrigger
    t = load_trigger(classpath, '{"name": "n", "poke_interval": 1}')
    assert isinstance(t, UnlistedTrigger) and t.name == "n"


def test_allow_listed_but_broken_classpaths_say_why(monkeypatch) -> None:
    monkeypatch.setenv(
        "SLOTLESS_ALLOWED_TRIGGERS", "nowhere_at_all.Gone,triggers.files.Missing,json.JSONDecoder"
    )
    for classpath, why in [
        ("nowhere_at_all.Gone", "cannot import trigger class nowhere_at_all.Gone"),
        ("triggers.files.Missing", "cannot import trigger class triggers.files.Missing"),
        ("json.JSONDecoder", "json.JSONDecoder is not a BaseTrigger subclass"),
    ]:
        with pytest.raises(TriggerLoadError, match=re.escape(why)):
            load_trigger(classpath, {})


def test_register_admits_a_class_in_this_process(monkeypatch) -> None:
    class LocalTrigger(BaseTrigger):
        key: str

    classpath = LocalTrigger.classpath()
    assert not is_allowed(classpath)
    monkeypatch.setattr(registry, "_registered", dict(registry._registered))
    assert register(LocalTrigger) is LocalTrigger  # usable as a decorator
    assert is_allowed(classpath)
    assert load_trigger(classpath, {"key": "k"}) == LocalTrigger(key="k")


def test_entry_points_admit_a_class(monkeypatch) -> None:
    seen_groups = []

    def fake_entry_points(*, group: str):
        seen_groups.append(group)
        return [SimpleNamespace(name="unlisted", value="support.triggers:UnlistedTrigger")]

    monkeypatch.delenv("SLOTLESS_ALLOWED_TRIGGERS", raising=False)
    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    assert is_allowed("support.triggers.UnlistedTrigger")
    assert seen_groups and set(seen_groups) == {"slotless.triggers"}


def test_builtins_are_allow_listed() -> None:
    assert is_allowed("triggers.files.FileTrigger")
    assert is_allowed("triggers.temporal.DateTimeTrigger")
    assert trigger_class("triggers.temporal.TimeDeltaTrigger") is TimeDeltaTrigger


def _on(day: str) -> Scope:
    """A run's scope on ``day`` (executor/templating.py renders triggers for sensors)."""
    return Scope(dag_id="d", logical_time=datetime.fromisoformat(f"{day}T00:00+00:00"),
                 run_id="r", task_id="t")  # fmt: skip


def test_render_fills_ds_and_friends() -> None:
    t = FileTrigger(path="/in/{{ ds }}/{{ds_nodash}}.csv", poke_interval=5)
    rendered = render_trigger(t, _on("2026-04-25"))
    assert isinstance(rendered, FileTrigger)
    assert rendered.path == "/in/2026-04-25/20260425.csv"
    assert rendered.poke_interval == 5
    assert t.path == "/in/{{ ds }}/{{ds_nodash}}.csv"  # the template itself is untouched
    plain = FileTrigger(path="/in/a.csv")
    assert render_trigger(plain, _on("2026-04-25")) is plain


def test_render_names_an_unknown_variable() -> None:
    with pytest.raises(TemplateFailed, match=r"template '/in/\{\{ dss \}\}.csv' failed: "
                       r"UndefinedError: 'dss' is undefined"):  # fmt: skip
        render_trigger(FileTrigger(path="/in/{{ dss }}.csv"), _on("2026-04-25"))


def test_render_validates_the_result() -> None:
    with pytest.raises(ValueError, match="unbalanced"):
        render_trigger(FileTrigger(path="/in/{{ '[' ~ ds }}.csv"), _on("2026-04-25"))


def test_styles_and_batching_are_detected() -> None:
    assert FileTrigger.is_batched() and not FileTrigger.is_push()
    assert not FlagTrigger.is_batched() and not FlagTrigger.is_push()

    class Push(BaseTrigger):
        async def run(self, ctx):
            yield TriggerEvent(payload=1)

    assert Push.is_push()


def test_event_payload_is_json() -> None:
    e = TriggerEvent(payload={"paths": ["/in/a.csv"]})
    assert json.loads(e.model_dump_json()) == {"payload": {"paths": ["/in/a.csv"]}, "error": None}


async def test_to_thread_runs_off_the_loop() -> None:
    loop_thread = threading.get_ident()
    assert await to_thread(threading.get_ident) != loop_thread
    assert await to_thread(sum, [1, 2, 3]) == 6
