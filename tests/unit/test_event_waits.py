"""Event waits and the API's pieces, one module at a time: EventTrigger (keys, templates,
what is part of the wait), where an event wait may be declared, named tokens, and the
OpenAPI document (checked against the OpenAPI 3.1 specification)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from openapi_spec_validator import validate

from executor import DAG
from executor.dag import DagError
from executor.sensing import deferral
from executor.templating import Scope, render_trigger
from slotless.web.api import openapi
from slotless.web.auth import Auth, parse_tokens
from triggers.events import EventError, EventTrigger, check_name, match_key, payload_key
from triggers.registry import load_trigger


def test_a_wait_and_an_event_agree_on_the_key_whatever_the_field_order() -> None:
    t = EventTrigger(name="export.ready", match={"date": "2026-11-24", "partner": "acme"})
    wait = t.event_wait()
    assert wait is not None
    payload = {"partner": "acme", "size": 3, "date": "2026-11-24"}
    assert payload_key("export.ready", ["date", "partner"], payload) == wait.key
    assert wait.matches(payload)
    assert not wait.matches({"partner": "acme"})  # a field missing
    assert not wait.matches({"partner": "acme", "date": "2026-11-25"})
    assert not wait.matches(["not", "an", "object"])
    assert match_key("a", {"n": 1}) != match_key("a", {"n": "1"}) != match_key("a", {"n": True})
    assert match_key("a", {}) == payload_key("a", [], "anything")  # no fields: any payload


def test_lookback_is_how_to_wait_not_what_for() -> None:
    a = EventTrigger(name="x", match={"k": 1}, lookback=timedelta(hours=1))
    b = EventTrigger(name="x", match={"k": 1})
    assert a.lookback == 3600.0
    assert a.poke_hash() == b.poke_hash()  # one subscription for both
    assert a.describe() == "event x (k=1)"
    assert a.first_check_at(0.0) == float("inf")  # never checked by a triggerer
    cp, kwargs = a.serialize()
    assert load_trigger(cp, kwargs) == a


def test_templates_fill_the_name_and_match_values() -> None:
    t = EventTrigger(name="export.{{ dag_id }}", match={"date": "{{ ds }}", "n": 2})
    on = Scope(dag_id="daily", logical_time=datetime(2026, 11, 24, tzinfo=UTC), run_id="r",
               task_id="t")  # fmt: skip
    r = render_trigger(t, on)
    assert (r.name, r.match) == ("export.daily", {"date": "2026-11-24", "n": 2})
    d = deferral(r, method=None, method_kwargs={}, wait_started_at=0.0, timeout=None)
    assert d.event is not None and d.event.key == match_key("export.daily", r.match)
    with pytest.raises(ValueError, match="bad event name '2026 x'"):  # the task fails, saying so
        render_trigger(EventTrigger(name="{{ ds[:4] }} x", match={}), on)


@pytest.mark.parametrize("name", ["export.ready", "a", "partner/acme:v1", "A-b_c"])
def test_good_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", " x", "x y", "-x", "é", "x" * 201, 3])
def test_bad_names(name: object) -> None:
    with pytest.raises(EventError) as info:
        check_name(name)
    assert info.value.field == "name"


def test_an_event_wait_is_deferrable_only_and_cannot_start_runs() -> None:
    dag = DAG("d")
    with pytest.raises(DagError, match="deferrable only"):
        dag.sensor("s", EventTrigger(name="x"), mode="poke")
    dag.sensor("ok", EventTrigger(name="x"))
    with pytest.raises(DagError, match="POST /api/v1/dags"):
        DAG("e", start_when=EventTrigger(name="x"))


def test_named_tokens_are_all_compared_and_name_who_wrote() -> None:
    assert {n: t.secret for n, t in parse_tokens("alice:a1, bob:b2").items()} == {
        "alice": "a1", "bob": "b2",
    }  # fmt: skip
    assert {n: t.secret for n, t in parse_tokens("bare").items()} == {"operator": "bare"}
    for bad in ("alice:", ":x", "a:1,a:2"):
        with pytest.raises(ValueError, match="token entry") as info:
            parse_tokens(bad)
        assert "1" not in str(info.value).replace("entry 1", "").replace("entry 2", "")
    auth = Auth("alice:a1,bob:b2")
    assert (auth.who("a1"), auth.who("b2"), auth.who("nope"), auth.who("")) == (
        "alice", "bob", None, None,
    )  # fmt: skip
    session = auth.login("b2")
    assert session is not None and session.who == "bob"
    assert Auth(None).who("x") is None and not Auth(None).enabled


def test_the_openapi_document_is_valid_and_names_every_route() -> None:
    doc = openapi()
    validate(doc)
    assert set(doc["paths"]) >= {
        "/api/v1/events", "/api/v1/events/{id}", "/api/v1/dags/{dag_id}/runs",
        "/api/v1/runs/{run_id}",
    }  # fmt: skip
    post = doc["paths"]["/api/v1/events"]["post"]
    assert post["security"] == [{"bearer": []}]
    assert {"400", "401", "413"} <= set(post["responses"])
