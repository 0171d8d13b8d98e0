"""Templates (executor/templating.py): every variable, filter and macro against what
Airflow renders for the same run; the sandbox; what is refused at parse time and how a
template that fails at render time is said."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

from executor import DAG
from executor.dag import DagError
from executor.templating import (
    MAX_COMPILED,
    MAX_TEMPLATE,
    START_NAMES,
    Scope,
    TemplateFailed,
    TemplateRefused,
    check,
    compiled,
    ds_add,
    ds_format,
    render_text,
    render_trigger,
    render_value,
    variables,
)
from triggers.events import EventTrigger
from triggers.files import FileTrigger
from triggers.people import Approval

# A scheduled daily run: the interval [2026-11-25, 2026-11-26) UTC, conf and params given.
DAILY = Scope(
    dag_id="settle",
    logical_time=datetime(2026, 11, 25, tzinfo=UTC),
    run_id="settle:2026-11-25",
    task_id="wait",
    params={"bucket": "npci", "n": 3},
    conf={"n": 3},
    run_type="scheduled",
    data_interval=(datetime(2026, 11, 25, tzinfo=UTC), datetime(2026, 11, 26, tzinfo=UTC)),
)


def r(source: str, scope: Scope = DAILY) -> str:
    return render_text(source, variables(scope))


# --------------------------------------------------------------- Airflow's own examples


def test_ds_add_as_airflow() -> None:
    assert ds_add("2015-01-01", 5) == "2015-01-06"
    assert ds_add("2015-01-06", -5) == "2015-01-01"
    assert ds_add("2016-02-28", 1) == "2016-02-29"  # a leap day
    assert ds_add("2015-01-01", 0) == "2015-01-01"
    assert r("{{ macros.ds_add(ds, -1) }}") == "2026-11-24"
    assert r("{{ macros.ds_add('2026-12-31', 1) }}") == "2027-01-01"


def test_ds_format_as_airflow() -> None:
    assert ds_format("2015-01-01", "%Y-%m-%d", "%m-%d-%y") == "01-01-15"
    assert ds_format("1/5/2015", "%m/%d/%Y", "%Y-%m-%d") == "2015-01-05"
    assert r('{{ macros.ds_format(ds, "%Y-%m-%d", "%m-%d-%y") }}') == "11-25-26"
    assert r('{{ macros.ds_format(ds, "%Y-%m-%d", "%Y/%m/%d") }}') == "2026/11/25"


def test_the_date_variables_as_airflow_renders_them() -> None:
    # Airflow's templates reference: ts "2018-01-01T00:00:00+00:00", ts_nodash
    # "20180101T000000", ts_nodash_with_tz "20180101T000000+0000".
    jan = Scope(dag_id="d", logical_time=datetime(2018, 1, 1, tzinfo=UTC), run_id="x", task_id="t")
    assert r("{{ ds }}", jan) == "2018-01-01"
    assert r("{{ ds_nodash }}", jan) == "20180101"
    assert r("{{ ts }}", jan) == "2018-01-01T00:00:00+00:00"
    assert r("{{ ts_nodash }}", jan) == "20180101T000000"
    assert r("{{ ts_nodash_with_tz }}", jan) == "20180101T000000+0000"
    # logical_date is an aware datetime, printed as pendulum prints Airflow's
    assert r("{{ logical_date }}", jan) == "2018-01-01T00:00:00+00:00"
    assert r("{{ logical_date.year }}-{{ logical_date.tzinfo }}", jan) == "2018-UTC"
    assert r("{{ (logical_date + macros.timedelta(hours=6)).isoformat() }}", jan) == (
        "2018-01-01T06:00:00+00:00"
    )
    assert isinstance(variables(jan)["logical_date"], datetime)


def test_the_filters_as_airflow() -> None:
    assert r("{{ dag_run.logical_date | ds }}") == "2026-11-25"
    assert r("{{ dag_run.logical_date | ds_nodash }}") == "20261125"
    assert r("{{ data_interval_end | ts }}") == "2026-11-26T00:00:00+00:00"
    assert r("{{ data_interval_end | ts_nodash }}") == "20261126T000000"
    assert r("{{ data_interval_end | ts_nodash_with_tz }}") == "20261126T000000+0000"


def test_the_run_variables() -> None:
    assert r("{{ run_id }}|{{ dag_id }}|{{ task_id }}") == "settle:2026-11-25|settle|wait"
    assert r("{{ data_interval_start }}") == "2026-11-25T00:00:00+00:00"
    assert r("{{ data_interval_end }}") == "2026-11-26T00:00:00+00:00"
    assert r("{{ params.bucket }}/{{ params['n'] * 2 }}") == "npci/6"
    assert r("{{ dag_run.conf.n }} {{ dag_run.run_id }} {{ dag_run.logical_date }}") == (
        "3 settle:2026-11-25 2026-11-25T00:00:00+00:00"
    )
    assert r("{{ dag_run.run_type }} {{ dag_run.conf.get('missing', 'none') }}") == (
        "scheduled none"
    )


def test_a_run_without_an_interval_has_the_logical_time_as_both_ends() -> None:
    # As Airflow's for a DAG without a schedule: the interval is exactly the logical time.
    by_hand = Scope(dag_id="d", logical_time=datetime(2026, 3, 4, tzinfo=UTC), run_id="m",
                    task_id="t")  # fmt: skip
    assert r("{{ data_interval_start }}/{{ data_interval_end }}", by_hand) == (
        "2026-03-04T00:00:00+00:00/2026-03-04T00:00:00+00:00"
    )
    assert r("{{ dag_run.conf }} {{ params }}", by_hand) == "{} {}"


def test_ds_and_ts_are_on_the_dags_clock() -> None:
    # A Paris run at local midnight: its ds is its date there, and ts says the same instant
    # with its offset (Airflow, which renders in UTC, would say 2026-11-24T23:00:00+00:00).
    paris = ZoneInfo("Europe/Paris")
    run = Scope(dag_id="d", logical_time=datetime(2026, 11, 24, 23, tzinfo=UTC), zone=paris,
                run_id="p", task_id="t")  # fmt: skip
    assert r("{{ ds }} {{ ts }}", run) == "2026-11-25 2026-11-25T00:00:00+01:00"
    assert r("{{ ts_nodash_with_tz }}", run) == "20261125T000000+0100"


def test_params_of_a_model_are_read_by_attribute() -> None:
    class P(BaseModel):
        table: str = "sales"

    run = Scope(dag_id="d", logical_time=datetime(2026, 1, 1, tzinfo=UTC), run_id="x",
                task_id="t", params=P())  # fmt: skip
    assert r("{{ params.table }}", run) == "sales"


def test_safe_macros() -> None:
    assert r("{{ macros.datetime(2026, 1, 2).strftime('%d') }}") == "02"
    assert r("{{ (macros.datetime(2026, 1, 2) - macros.timedelta(days=2)).day }}") == "31"
    assert re.fullmatch(r"[0-9a-f-]{36}", r("{{ macros.uuid.uuid4() }}"))
    assert uuid.UUID(r("{{ macros.uuid.uuid4() }}")).version == 4
    assert 0 <= float(r("{{ macros.random() }}")) < 1
    assert float(r("{{ macros.time.time() }}")) > 1e9
    # time.sleep (and the modules' other members) are not there: a template cannot hang a worker
    with pytest.raises(TemplateFailed, match="sleep"):
        r("{{ macros.time.sleep(1000) }}")


def test_a_start_condition_sees_only_its_date() -> None:
    day = Scope.for_date("landing", date(2026, 11, 26), ZoneInfo("Europe/Paris"))
    seen = variables(day)
    assert set(seen) == START_NAMES
    assert r("{{ ds }} {{ logical_date }} {{ dag_id }}", day) == (
        "2026-11-26 2026-11-26T00:00:00+01:00 landing"
    )


# --------------------------------------------------------------- rendering values


def test_every_string_of_a_trigger_is_rendered_at_any_depth() -> None:
    match = {"date": "{{ macros.ds_add(ds, -1) }}", "n": 2, "keep": "plain"}
    t = EventTrigger(name="export.{{ dag_id }}", match=match)
    got = render_trigger(t, DAILY)
    assert isinstance(got, EventTrigger)
    assert (got.name, got.match) == (
        "export.settle",
        {"date": "2026-11-24", "n": 2, "keep": "plain"},
    )
    person = Approval(subject="Publish {{ ds }}?", respondents=["{{ params.bucket }}-ops"])
    assert render_trigger(person, DAILY).respondents == ["npci-ops"]
    plain = FileTrigger(path="/in/a.csv")
    assert render_trigger(plain, DAILY) is plain


def test_task_templates_render_nested_values_and_keep_the_rest() -> None:
    declared = {"path": "s3://b/{{ ds }}/x", "also": ["{{ ds_nodash }}", 3, {"k": "{{ run_id }}"}],
                "n": 1}  # fmt: skip
    assert render_value(declared, DAILY, "templates") == {
        "path": "s3://b/2026-11-25/x",
        "also": ["20261125", 3, {"k": "settle:2026-11-25"}],
        "n": 1,
    }


def test_a_template_error_says_the_template_and_the_error_on_one_line() -> None:
    with pytest.raises(TemplateFailed) as caught:
        render_value({"path": "/in/{{ macros.ds_add(ds, 'x') }}.csv"}, DAILY, "templates")
    text = str(caught.value)
    assert "\n" not in text
    assert text == (
        """templates.path: template "/in/{{ macros.ds_add(ds, 'x') }}.csv" failed: """
        "TypeError: unsupported type for timedelta days component: str"
    )
    with pytest.raises(
        TemplateFailed, match=r"UndefinedError: 'dict object' has no attribute 'nope'"
    ):
        r("{{ params.nope }}")
    with pytest.raises(TemplateFailed, match="ValueError: time data '2026' does not match"):
        r("{{ macros.ds_add('2026', 1) }}")


def test_compiled_once_per_source() -> None:
    compiled.cache_clear()
    for _ in range(3):
        r("{{ ds }}-cached")
    info = compiled.cache_info()
    assert (info.misses, info.hits, info.maxsize) == (1, 2, MAX_COMPILED)


# --------------------------------------------------------------- the sandbox


@pytest.mark.parametrize(
    "escape",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ macros.ds_add.__globals__ }}",
        "{{ params.__class__ }}",
        "{{ logical_date.__class__.__init__.__globals__ }}",
        "{{ dag_run.__class__ }}",
        "{{ cycler.__init__.__globals__.os }}",
    ],
)
def test_the_sandbox_refuses_escapes(escape: str) -> None:
    with pytest.raises(TemplateFailed, match=r"SecurityError|UndefinedError"):
        r(escape)


def test_the_sandbox_is_immutable_and_bounded() -> None:
    with pytest.raises(TemplateFailed, match="SecurityError"):
        r("{{ params.update({'bucket': 'evil'}) }}")
    assert DAILY.params == {"bucket": "npci", "n": 3}
    with pytest.raises(TemplateFailed, match="OverflowError: a repetition"):
        r("{{ 'x' * 10**9 }}")
    with pytest.raises(TemplateFailed, match="OverflowError: a power"):
        r("{{ 10 ** 1000000 }}")
    with pytest.raises(TemplateFailed, match="OverflowError"):
        r("{% for i in range(10**9) %}{% endfor %}")
    assert r("{{ '-' * 3 }}{{ 2 ** 10 }}") == "---1024"


# --------------------------------------------------------------- refused at parse time


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("/in/{{ ds }.csv", "TemplateSyntaxError"),
        ("{% if ds %}no end", "TemplateSyntaxError"),
        ("{{ ds | nosuchfilter }}", "No filter named 'nosuchfilter'"),
        ("{{ dss }}", "unknown name 'dss'"),
        ("{{ prev_ds }}", "removed in Airflow 3: use macros.ds_add(ds, -1)"),
        ("{{ macros.ds_addd(ds, 1) }}", "unknown macros.ds_addd; known: macros.datetime"),
        ("{{ dag_run.start_date }}", "unknown dag_run.start_date"),
        ("{{ var.value.x }}", "unknown name 'var'"),
    ],
)
def test_check_refuses_from_the_text_alone(source: str, said: str) -> None:
    with pytest.raises(TemplateRefused, match=re.escape(said)) as caught:
        check(source)
    assert "\n" not in str(caught.value)


def test_check_accepts_what_renders() -> None:
    check("{% set y = macros.ds_add(ds, -1) %}/in/{{ y }}/{{ params.x | default('a') }}")
    check("{# a comment #}{{ dag_run.conf.get('k') }}{{ data_interval_start | ds }}")
    with pytest.raises(TemplateRefused, match="unknown name 'run_id'"):
        check("{{ run_id }}", START_NAMES)


def test_a_dag_refuses_a_bad_template_naming_the_task_and_the_field() -> None:
    dag = DAG("t")
    with pytest.raises(DagError) as caught:
        dag.sensor("wait", FileTrigger(path="/in/{{ macros.ds_add(ds, -1) }.csv"))
    text = str(caught.value)
    assert text.startswith("DAG 't': sensor 'wait': field path: template ")
    assert "TemplateSyntaxError" in text and "\n" not in text
    with pytest.raises(DagError, match=r"DAG 't': task 'load': field templates\.out\.0: .*'dss'"):
        dag.task(lambda ctx: None, task_id="load", templates={"out": ["{{ dss }}"]})
    with pytest.raises(DagError, match="templates must be a dict with string keys"):
        dag.task(lambda ctx: None, task_id="load", templates=["{{ ds }}"])  # type: ignore[arg-type]
    with pytest.raises(DagError, match=r"DAG 'c': start_when: field path: .*unknown name 'run_id'"):
        DAG("c", start_when=FileTrigger(path="/in/{{ run_id }}.csv"))
    ok = dag.task(lambda ctx: None, task_id="ok", templates={"p": "{{ macros.ds_add(ds, 1) }}"})
    assert ok.templates == {"p": "{{ macros.ds_add(ds, 1) }}"}


def test_a_later_time_adds_nothing_to_yesterday() -> None:
    # ds_add is on dates: an hourly run at 23:00 still yields the day before its ds.
    late = Scope(dag_id="h", logical_time=datetime(2026, 11, 25, 23, tzinfo=UTC), run_id="h",
                 task_id="t")  # fmt: skip
    assert r("{{ macros.ds_add(ds, -1) }} {{ ts }}", late) == (
        "2026-11-24 2026-11-25T23:00:00+00:00"
    )
    assert (datetime(2026, 11, 25) - timedelta(days=1)).date().isoformat() == "2026-11-24"


def test_a_template_is_bounded_in_length() -> None:
    long = "/in/{{ ds }}" + "x" * MAX_TEMPLATE
    with pytest.raises(TemplateRefused, match=f"over {MAX_TEMPLATE}"):
        check(long)
    with pytest.raises(TemplateFailed, match=f"over {MAX_TEMPLATE}"):
        r(long)
