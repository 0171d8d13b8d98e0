"""Declaring assets: URIs checked, conditions built with & and |, schedule= and outlets=
refused with the DAG and the field named, ctx.asset_event's extra bounded."""

from __future__ import annotations

from datetime import date

import pytest

from executor import DAG, Asset, DagError, TaskContext
from executor.assets import MAX_DEPTH, AllOf, AnyOf, AssetError, describe, to_tree
from triggers.base import BaseTrigger


class NotListed(BaseTrigger):
    """A trigger class nobody allow-listed."""

    async def poke(self, context):
        return None


def test_a_schedule_of_assets_is_a_condition_and_no_time_schedule() -> None:
    a, b, c = Asset("s3://l/a"), Asset("s3://l/b"), Asset("s3://l/c")
    listed = DAG("listed", schedule=[a, b, a])
    assert listed.schedule is None and listed.asset_schedule == AllOf((a, b))
    mixed = DAG("mixed", schedule=a & (b | c))
    assert isinstance(mixed.asset_schedule, AllOf)
    assert isinstance(mixed.asset_schedule.parts[1], AnyOf)
    assert describe(to_tree(mixed.asset_schedule)) == "s3://l/a & (s3://l/b | s3://l/c)"
    timed = DAG("timed", schedule="@daily")
    assert timed.asset_schedule is None and timed.schedule is not None


@pytest.mark.parametrize(
    ("schedule", "why"),
    [
        ([], "empty list"),
        ([Asset("s3://l/a"), "s3://l/b"], "assets only"),
    ],
)
def test_bad_asset_schedules_name_the_dag(schedule: object, why: str) -> None:
    with pytest.raises(DagError, match=f"DAG 'd': schedule: .*{why}"):
        DAG("d", schedule=schedule)  # type: ignore[arg-type]


def test_a_condition_too_deep_is_refused() -> None:
    cond: object = Asset("s3://l/0")
    for i in range(MAX_DEPTH + 1):
        cond = Asset(f"s3://l/{i + 1}") & (Asset("s3://l/x") | cond)  # type: ignore[operator]
    with pytest.raises(DagError, match="nests at most"):
        DAG("deep", schedule=cond)  # type: ignore[arg-type]


def test_outlets_and_watchers_are_checked_at_declaration() -> None:
    dag = DAG("d")
    with pytest.raises(DagError, match="outlets are assets"):
        dag.task(lambda ctx: 1, task_id="t", outlets=["s3://l/a"])  # type: ignore[list-item]
    watched = Asset("s3://l/w", watchers=[NotListed()])
    with pytest.raises(DagError, match=r"not allow-listed.*watcher of asset s3://l/w"):
        dag.task(lambda ctx: 1, task_id="u", outlets=[watched])
    with pytest.raises(DagError, match="watcher of asset s3://l/w"):
        DAG("e", schedule=[watched])


@pytest.mark.parametrize("uri", ["orders", "s3://", "s3://a b", "", "://x", "s3://x\n"])
def test_bad_uris(uri: str) -> None:
    with pytest.raises(AssetError, match="URI"):
        Asset(uri)


def test_ctx_asset_event_bounds_its_extra() -> None:
    ctx = TaskContext(run_id="r", dag_id="d", task_id="t", logical_date=date(2026, 1, 1),
                      attempt=1, max_attempts=1)  # fmt: skip
    a = Asset("s3://l/a")
    ctx.asset_event(a, extra={"rows": 3})
    assert ctx._asset_extras == {"s3://l/a": '{"rows":3}'}
    with pytest.raises(AssetError, match="KiB"):
        ctx.asset_event(a, extra={"x": "y" * 70_000})
    with pytest.raises(AssetError, match="JSON object"):
        ctx.asset_event(a, extra=[1])  # type: ignore[arg-type]
    with pytest.raises(AssetError, match="JSON"):
        ctx.asset_event(a, extra={"n": float("nan")})
    assert ctx.triggering_asset_events == {}
