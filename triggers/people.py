"""Waits for a person: an approval, a choice, a form, a branch choice.

Declared like any sensor (``dag.sensor("sign_off", Approval(subject=...))``) and answered
on the web page's "Needs you" list, by ``slotless respond``, or by ``POST
/api/v1/runs/{run}/tasks/{task}/response``. Like an event wait, such a wait is settled by
whoever writes the answer, in the answer's own transaction (``executor/store/people.py``);
the triggerer never checks it and only holds its timeout (taking the ``default`` answer,
if there is one, when the timeout passes). It holds no worker slot while it waits.

>>> a = Approval(subject="Publish {{ ds }}?", respondents=["alice"])
>>> a.templates()  # rendered per run by the sensor (executor/templating.py)
{'subject': 'Publish {{ ds }}?'}
>>> a.check_answer({"approve": True}).output()["approved"]
True

An answer is checked against the request by :meth:`PersonWait.check_answer`, which raises
:class:`AnswerError` naming the field that is wrong (nothing is written then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, Field, field_validator, model_validator

from .base import BaseTrigger, TriggerEvent, is_template
from .context import TriggerContext
from .events import payload_json

# The event a person's wait raises when it begins (what ``notify=`` URLs are sent for).
NEEDS_ANSWER = "needs_answer"
MAX_RESPONDENTS = 100
MAX_COMMENT = 4000


class AnswerError(ValueError):
    """An answer that does not fit its request; ``field`` names what is wrong
    (``approve``, ``choose``, ``form.amount``, ``respondent``, ...)."""

    def __init__(self, message: str, field: str, *, errors: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.field = field
        self.errors = errors or [(field, message)]


@dataclass(frozen=True, slots=True)
class Answer:
    """A checked answer: what becomes the task's output (with who and when)."""

    kind: str
    value: Any  # bool (approval), list[str] or str (choice), dict (form)
    rejected: bool = False  # an approval said no
    skip: list[str] | None = None  # children not to run (None: all run)
    comment: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def output(self, by: str = "", at: float = 0.0, *, default: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {self.kind_key(): self.value, "by": by, "at": at}
        if self.comment:
            out["comment"] = self.comment
        if default:
            out["default"] = True
        return out

    def kind_key(self) -> str:
        return {"approval": "approved", "choice": "chosen", "form": "form",
                "branch": "chosen"}[self.kind]  # fmt: skip


class PersonWait(BaseTrigger):
    """What every person's wait has.

    ``subject`` and ``body`` are templates (``{{ ds }}``, ``{{ run_id }}``, ...); the body
    is markdown, shown escaped (no HTML from it reaches the page). ``respondents``: the
    token names that may answer (empty: anyone with a token). ``default``: the answer
    taken when the sensor's timeout passes (None: the wait fails then, like any sensor's).
    ``notify``: apprise URLs told when the wait begins, with a link to the page.
    """

    subject: str
    body: str = ""
    respondents: list[str] = Field(default_factory=list, max_length=MAX_RESPONDENTS)
    default: Any = None
    notify: list[str] = Field(default_factory=list)

    kind: ClassVar[str] = "person"
    # Who is told is not what is waited for.
    execution_fields = BaseTrigger.execution_fields | {"notify"}

    @field_validator("notify", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _default_fits(self) -> PersonWait:
        if self.default is not None and not is_template(str(self.default)):
            try:
                self.check_answer(self.default)
            except AnswerError as exc:
                raise ValueError(f"default answer: {exc}") from None
        return self

    def describe(self) -> str:
        who = f" from {', '.join(self.respondents)}" if self.respondents else ""
        return f"{self.kind} {self.subject!r}{who}"

    def first_check_at(self, now: float) -> float:
        return float("inf")  # never checked: the answer's writer settles the wait

    async def poke(self, ctx: TriggerContext) -> TriggerEvent | None:
        raise TypeError(
            f"{self.describe()} is answered by a person and never checked: use it in "
            "mode='deferrable' (the default), not in poke or reschedule mode"
        )

    def may_answer(self, who: str) -> bool:
        return not self.respondents or who in self.respondents

    def check_answer(self, raw: Any) -> Answer:
        """The answer ``raw`` (a JSON object) as this request takes it; AnswerError if not."""
        raise NotImplementedError

    def request(self) -> dict[str, Any]:
        """What the page and the API show of the request (JSON)."""
        return {"kind": self.kind, "subject": self.subject, "body": self.body,
                "respondents": list(self.respondents), "default": self.default}  # fmt: skip


def _obj(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise AnswerError(f"an answer is a JSON object, not {type(raw).__name__}", "body")
    comment = raw.get("comment", "")
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT:
        raise AnswerError(f"comment: text of at most {MAX_COMMENT} characters", "comment")
    return raw


class Approval(PersonWait):
    """Approve or reject. Rejected: the sensor ends SUCCESS and its downstream is SKIPPED
    (as in Airflow), or FAILED with ``fail_on_reject=True``. Output:
    ``{"approved": bool, "by": NAME, "at": TIME, "comment": ...}``."""

    fail_on_reject: bool = False
    kind: ClassVar[str] = "approval"

    def check_answer(self, raw: Any) -> Answer:
        raw = _obj(raw)
        known = {"approve", "comment"}
        if set(raw) - known:
            bad = sorted(set(raw) - known)[0]
            raise AnswerError(f"an approval takes approve (true or false), not {bad!r}", bad)
        if not isinstance(raw.get("approve"), bool):
            raise AnswerError("approve: true or false is required", "approve")
        ok = raw["approve"]
        return Answer("approval", ok, rejected=not ok, comment=raw.get("comment", ""))

    def request(self) -> dict[str, Any]:
        return {**super().request(), "fail_on_reject": self.fail_on_reject}


class Choice(PersonWait):
    """Choose one of ``options`` (or several, with ``multiple=True``). Output:
    ``{"chosen": "x"}`` (or a list with ``multiple``)."""

    options: list[str] = Field(min_length=1, max_length=200)
    multiple: bool = False
    kind: ClassVar[str] = "choice"

    @field_validator("options")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("options must be distinct")
        return value

    def _chosen(self, raw: Any) -> tuple[dict[str, Any], list[str]]:
        raw = _obj(raw)
        known = {"choose", "comment"}
        if set(raw) - known:
            bad = sorted(set(raw) - known)[0]
            raise AnswerError(f"a choice takes choose, not {bad!r}", bad)
        chosen = raw.get("choose")
        picked = chosen if isinstance(chosen, list) else [chosen]
        if chosen is None or not picked or not all(isinstance(c, str) for c in picked):
            raise AnswerError(f"choose: one of {', '.join(self.options)} is required", "choose")
        if len(picked) > 1 and not self.multiple:
            raise AnswerError("choose: only one option may be chosen", "choose")
        for c in picked:
            if c not in self.options:
                raise AnswerError(
                    f"choose: {c!r} is not one of {', '.join(self.options)}", "choose"
                )
        return raw, list(dict.fromkeys(picked))

    def check_answer(self, raw: Any) -> Answer:
        raw, picked = self._chosen(raw)
        value: Any = picked if self.multiple else picked[0]
        return Answer("choice", value, comment=raw.get("comment", ""))

    def request(self) -> dict[str, Any]:
        return {**super().request(), "options": self.options, "multiple": self.multiple}


class BranchChoice(Choice):
    """Choose which downstream tasks run (``options`` are their task ids); the others are
    SKIPPED, like a branch's. ``multiple=True`` lets several run."""

    kind: ClassVar[str] = "branch"

    def check_answer(self, raw: Any) -> Answer:
        raw, picked = self._chosen(raw)
        skip = [o for o in self.options if o not in picked]
        value: Any = picked if self.multiple else picked[0]
        return Answer("branch", value, skip=skip, comment=raw.get("comment", ""))


class Form(PersonWait):
    """Fill a form whose fields come from a pydantic model (``Form(model=Settlement)``).

    The model is kept as its JSON schema (a trigger's fields are JSON), and an answer is
    validated against that schema with ``jsonschema``: a bad value is refused with the
    field's error and nothing is written. Output: ``{"form": {...}, "by": ..., "at": ...}``.
    """

    model: dict[str, Any]
    kind: ClassVar[str] = "form"

    @field_validator("model", mode="before")
    @classmethod
    def _schema(cls, value: Any) -> Any:
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value.model_json_schema()
        return value

    @field_validator("model")
    @classmethod
    def _checked(cls, value: dict[str, Any]) -> dict[str, Any]:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"model: not a JSON schema: {exc.message}") from None
        if value.get("type") != "object":
            raise ValueError("model: a form is an object (a pydantic model)")
        payload_json(value, "model")
        return value

    def fields(self) -> list[dict[str, Any]]:
        """The form's fields, in the model's order: name, title, type, required, enum,
        default, description (what the page draws)."""
        props: dict[str, Any] = self.model.get("properties", {})
        required = set(self.model.get("required", []))
        out = []
        for name, spec in props.items():
            spec = _resolve(self.model, spec)
            kind = spec.get("type", "string")
            if isinstance(kind, list):  # Optional[X]: anyOf flattened by pydantic
                kind = next((k for k in kind if k != "null"), "string")
            out.append({
                "name": name,
                "title": spec.get("title", name),
                "type": kind,
                "required": name in required,
                "enum": spec.get("enum"),
                "default": spec.get("default"),
                "description": spec.get("description", ""),
            })  # fmt: skip
        return out

    def coerce(self, texts: dict[str, str]) -> dict[str, Any]:
        """Form fields as posted by a browser (text) into JSON values by the schema's types;
        a text that is not a number stays text, for the schema to refuse by name."""
        out: dict[str, Any] = {}
        for f in self.fields():
            name = f["name"]
            if f["type"] == "boolean":
                out[name] = texts.get(name) in ("on", "true", "1")
                continue
            if name not in texts or (texts[name] == "" and not f["required"]):
                continue
            text = texts[name]
            try:
                if f["type"] == "integer":
                    out[name] = int(text)
                    continue
                if f["type"] == "number":
                    out[name] = float(text)
                    continue
            except ValueError:
                pass
            out[name] = text
        return out

    def check_answer(self, raw: Any) -> Answer:
        from jsonschema import Draft202012Validator

        raw = _obj(raw)
        known = {"form", "comment"}
        if set(raw) - known:
            bad = sorted(set(raw) - known)[0]
            raise AnswerError(f"a form takes form (an object), not {bad!r}", bad)
        values = raw.get("form")
        if not isinstance(values, dict):
            raise AnswerError("form: an object of the form's fields is required", "form")
        errors = sorted(
            Draft202012Validator(self.model).iter_errors(values), key=lambda e: list(e.path)
        )
        if errors:
            named = []
            for e in errors:
                where = ".".join(str(p) for p in e.path)
                if not where and e.validator == "required":
                    where = str(e.message).split("'")[1] if "'" in e.message else ""
                named.append((f"form.{where}" if where else "form", e.message))
            first_field, first = named[0]
            raise AnswerError(f"{first_field}: {first}", first_field, errors=named)
        return Answer("form", values, comment=raw.get("comment", ""))

    def request(self) -> dict[str, Any]:
        return {**super().request(), "fields": self.fields()}


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A property's schema with a local ``$ref`` (an enum, a nested model) followed, and
    pydantic's ``anyOf [X, null]`` for Optional[X] flattened to X."""
    if "$ref" in spec and spec["$ref"].startswith("#/$defs/"):
        spec = {**schema.get("$defs", {}).get(spec["$ref"][8:], {}), **spec}
    if "anyOf" in spec:
        kinds = [s for s in spec["anyOf"] if s.get("type") != "null"]
        if len(kinds) == 1:
            spec = {**_resolve(schema, kinds[0]), **{k: v for k, v in spec.items() if k != "anyOf"}}
    return spec


PERSON_WAITS = (Approval, Choice, BranchChoice, Form)

__all__ = [
    "NEEDS_ANSWER",
    "Answer",
    "AnswerError",
    "Approval",
    "BranchChoice",
    "Choice",
    "Form",
    "PersonWait",
]
