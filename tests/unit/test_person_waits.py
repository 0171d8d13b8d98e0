"""Person's waits without a database: declaring them, checking answers, the page's safe
markdown and form fields, and the API's document."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from executor import DAG
from executor.dag import DagError
from executor.sensing import deferral
from slotless.web.api import openapi
from slotless.web.people import markdown
from triggers.people import AnswerError, Approval, BranchChoice, Choice, Form
from triggers.registry import load_trigger


class Payout(BaseModel):
    amount: float = Field(gt=0, description="in EUR")
    method: Literal["sepa", "card"] = "sepa"
    urgent: bool = False
    note: str | None = None


def test_markdown_escapes_everything_and_adds_only_its_own_tags() -> None:
    html = markdown("# Title\n**bold** and *em* and `x<y`\n\n- <script>alert(1)</script>\n- two")
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<h3>Title</h3>" in html and "<strong>bold</strong>" in html and "<em>em</em>" in html
    assert "<code>x&lt;y</code>" in html and html.count("<li>") == 2
    assert "<img" not in markdown('<img src=x onerror="alert(1)">')
    assert markdown("[a](javascript:alert(1))") == "<p>[a](javascript:alert(1))</p>"


def test_a_form_is_its_models_schema_with_fields_and_coercion() -> None:
    form = Form(subject="Pay", model=Payout)
    fields = {f["name"]: f for f in form.fields()}
    assert fields["amount"]["type"] == "number" and fields["amount"]["required"]
    assert fields["method"]["enum"] == ["sepa", "card"] and fields["urgent"]["type"] == "boolean"
    assert fields["note"]["type"] == "string" and not fields["note"]["required"]
    assert form.coerce({"amount": "12.5", "method": "card", "urgent": "on", "note": ""}) == {
        "amount": 12.5, "method": "card", "urgent": True}  # fmt: skip
    assert form.coerce({"amount": "lots"})["amount"] == "lots"  # the schema names it
    with pytest.raises(AnswerError) as err:
        form.check_answer({"form": {"amount": "lots"}})
    assert err.value.field == "form.amount"
    with pytest.raises(AnswerError) as err:
        form.check_answer({"form": {"amount": 3, "method": "cash"}})
    assert err.value.field == "form.method"
    # Kept as JSON: rebuilt from the trigger row as the answering process does.
    classpath, kwargs = form.serialize()
    import json

    again = load_trigger(classpath, json.dumps(kwargs))
    assert isinstance(again, Form) and again.check_answer({"form": {"amount": 1}}).value == {
        "amount": 1}  # fmt: skip


def test_answers_are_checked_against_the_request() -> None:
    assert Approval(subject="s").check_answer({"approve": False}).rejected
    with pytest.raises(AnswerError, match="approve"):
        Approval(subject="s").check_answer({"approve": "yes"})
    c = Choice(subject="s", options=["a", "b"])
    assert c.check_answer({"choose": "b"}).value == "b"
    with pytest.raises(AnswerError, match="only one"):
        c.check_answer({"choose": ["a", "b"]})
    b = BranchChoice(subject="s", options=["left", "right", "both"], multiple=True)
    assert b.check_answer({"choose": ["left", "both"]}).skip == ["right"]
    with pytest.raises(ValueError, match="distinct"):
        Choice(subject="s", options=["a", "a"])


def test_declaring_a_persons_wait() -> None:
    with pytest.raises(ValueError, match="default answer"):
        Choice(subject="s", options=["a"], default={"choose": "z"})
    dag = DAG("d")
    with pytest.raises(DagError, match="deferrable only"):
        dag.sensor("x", Approval(subject="s"), mode="poke")
    spec = dag.sensor("ok", Approval(subject="s", notify="json://127.0.0.1:1/x"))
    assert spec.hooks.notify["needs_answer"] == ("json://127.0.0.1:1/x",)
    d = deferral(Approval(subject="s"), method=None, method_kwargs={}, wait_started_at=0.0,
                 timeout=1.0)  # fmt: skip
    assert d.person and d.event is None


def test_the_response_route_is_in_the_openapi_document() -> None:
    doc = openapi()
    post = doc["paths"]["/api/v1/runs/{run_id}/tasks/{task_id}/response"]["post"]
    assert {"400", "401", "403", "404", "409"} <= set(post["responses"])
    assert "/api/v1/needs-you" in doc["paths"]
