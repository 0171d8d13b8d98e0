"""A DAG's params and a run's conf (executor.params): defaults merged, a model validated,
unknown keys and wrong types refused with the field named, what a DAG may declare."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from executor import DAG, DagError
from executor.params import BadConf, parse_conf, resolve


class Window(BaseModel):
    days: int = 1
    region: str
    tags: list[str] = Field(default_factory=list, alias="labels")


def test_no_params_declared_passes_the_conf_as_given() -> None:
    assert resolve(None, None) == {}
    assert resolve(None, {"anything": [1, 2]}) == {"anything": [1, 2]}


def test_dict_defaults_are_updated_by_the_conf_and_never_changed() -> None:
    defaults = {"days": 1, "region": "eu", "nested": {"a": 1}}
    params = resolve(defaults, {"days": 7})
    assert params == {"days": 7, "region": "eu", "nested": {"a": 1}}
    params["nested"]["a"] = 2
    assert defaults["nested"] == {"a": 1}
    assert resolve(defaults, None) == defaults


def test_dict_defaults_refuse_an_unknown_key_naming_the_declared_ones() -> None:
    with pytest.raises(BadConf) as err:
        resolve({"days": 1}, {"dayz": 2}, "nightly")
    assert str(err.value) == ("bad conf for DAG 'nightly': unknown param 'dayz' (declared: days)")


def test_a_model_validates_and_gives_an_instance() -> None:
    params = resolve(Window, {"region": "us", "days": "3", "labels": ["a"]})
    assert isinstance(params, Window)
    assert (params.days, params.region, params.tags) == (3, "us", ["a"])


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"region": "eu", "days": "many"},
            "bad conf for DAG 'd': days: Input should be a valid integer, unable to parse "
            "string as an integer (got 'many')",
        ),
        ({}, "bad conf for DAG 'd': region: Field required"),
        (
            {"region": "eu", "colour": "red"},
            "bad conf for DAG 'd': unknown param 'colour' (declared: days, labels, region, tags)",
        ),
    ],
)
def test_a_model_refuses_a_bad_conf_with_the_fields_error(conf: dict, message: str) -> None:
    with pytest.raises(BadConf) as err:
        resolve(Window, conf, "d")
    assert str(err.value) == message
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "--conf is not JSON: Expecting property name"),
        ("[1]", "--conf must be a JSON object, not list: [1]"),
    ],
)
def test_parse_conf_wants_a_json_object(text: str, message: str) -> None:
    assert parse_conf(None) is None
    assert parse_conf('{"a": 1}') == {"a": 1}
    with pytest.raises(BadConf, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_conf(text)


def test_a_dag_declares_a_dict_of_json_values_or_a_model_class() -> None:
    assert DAG("a", params={"n": 1}).params == {"n": 1}
    assert DAG("b", params=Window).params is Window
    assert DAG("c").params is None
    with pytest.raises(DagError, match="params must be a dict of defaults or a pydantic model"):
        DAG("d", params=[1])  # type: ignore[arg-type]
    with pytest.raises(DagError, match="params defaults must be JSON values"):
        DAG("e", params={"when": object()})
    with pytest.raises(DagError, match="params must be a dict"):
        DAG("f", params=Window(region="eu"))  # type: ignore[arg-type]
