"""People in the loop on both backends: an answer settles its wait in its own transaction,
validated against the request, once (the first valid answer wins, a later one is told who
answered and when); a rejection skips the downstream (or fails); a branch choice skips the
branches not chosen; refusals change nothing; the timeout takes the default answer."""

from __future__ import annotations

import asyncio
import json
from datetime import date
from typing import Any

import pytest
from pydantic import BaseModel, Field
from support import backends
from support.exchanging import claim, complete
from support.helpers import FakeClock, attempt_of, ops

from executor import DAG
from executor.outcomes import Deferred
from executor.sensing import deferral
from executor.store import Store, open_store
from executor.store.people import NotAllowed, NotWaiting, UnknownTask
from triggers.base import SHARDS, BaseTrigger
from triggers.people import AnswerError, Approval, BranchChoice, Choice, Form

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 11, 24)
ALL_SHARDS = list(range(SHARDS))


class Settlement(BaseModel):
    amount: int = Field(ge=0)
    currency: str = "EUR"
    note: str = ""


def noop(ctx: Any) -> None:
    return None


def gate_dag() -> DAG:
    """``gate`` (to wait for a person) -> ``publish`` -> ``announce``; and ``left``, ``right``."""
    dag = DAG("gated")
    dag.task(noop, task_id="gate")
    dag.task(noop, task_id="publish", parents=["gate"])
    dag.task(noop, task_id="announce", parents=["publish"])
    dag.task(noop, task_id="left", parents=["gate"])
    return dag


async def waiting(store: Store, wait: BaseTrigger, timeout: float = 3600.0) -> str:
    """A run whose ``gate`` is DEFERRED on ``wait``; its run id."""
    run_id = await store.runs.create_run(gate_dag(), DAY)
    # (Another run's ready tasks may be claimed with it: they stay RUNNING, untouched.)
    (row,) = [r for r in await claim(store, "w", 20) if r.run_id == run_id]
    d = deferral(wait, method=None, method_kwargs={}, wait_started_at=store.clock(),
                 timeout=timeout)  # fmt: skip
    await complete(store, [Deferred(**attempt_of(row), deferral=d)])
    return run_id


async def states(store: Store, run_id: str) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in await store.views.run_tasks(run_id)}


async def log_of(store: Store, run_id: str, task_id: str) -> list[str]:
    return [e["message"] for e in await store.views.task_log(run_id, task_id, -1) or []]


async def output(store: Store, run_id: str, task_id: str) -> Any:
    for t in await store.views.run_tasks(run_id):
        if t["task_id"] == task_id:
            return json.loads(t["output"]) if t["output"] else None
    raise AssertionError(task_id)


async def test_approve_runs_the_downstream_and_a_second_answer_is_told_when(
    store: Store, clock: FakeClock
) -> None:
    run_id = await waiting(store, Approval(subject="Publish?", respondents=["alice", "bob"]))
    assert (await states(store, run_id))["gate"] == "DEFERRED"
    count, pending = await store.answers.needs_you()
    assert count == 1 and pending[0].task_id == "gate" and pending[0].wait.subject == "Publish?"
    done = await store.answers.respond(
        run_id, "gate", {"approve": True, "comment": "ok"}, who="alice"
    )
    assert done.state == "SUCCESS" and done.skipped == []
    got = await states(store, run_id)
    assert got["gate"] == "SUCCESS" and got["publish"] == "PENDING" and got["left"] == "PENDING"
    out = await output(store, run_id, "gate")
    assert out["approved"] is True and out["by"] == "alice" and out["comment"] == "ok"
    assert any("answered by alice" in m for m in await log_of(store, run_id, "gate"))
    # Who could answer was kept with the answer: bob, a respondent (anyone is, here), is
    # told by whom and when.
    with pytest.raises(NotWaiting, match=r"already answered by alice at \d{4}-\d\d-\d\dT"):
        await store.answers.respond(run_id, "gate", {"approve": False}, who="bob")
    with pytest.raises(NotWaiting, match=r"already answered by alice at \d{4}-\d\d-\d\dT"):
        await store.answers.respond(run_id, "gate", {"approve": False}, who="alice")
    assert (await store.answers.needs_you())[0] == 0
    assert (await states(store, run_id)) == got


async def test_reject_skips_the_downstream_or_fails_with_fail_on_reject(store: Store) -> None:
    run_id = await waiting(store, Approval(subject="Publish?"))
    done = await store.answers.respond(run_id, "gate", {"approve": False}, who="carol")
    assert done.state == "SUCCESS" and sorted(done.skipped) == ["left", "publish"]
    got = await states(store, run_id)
    assert got == {"gate": "SUCCESS", "publish": "SKIPPED", "announce": "SKIPPED",
                   "left": "SKIPPED"}  # fmt: skip
    assert (await output(store, run_id, "gate"))["approved"] is False

    strict = await waiting(store, Approval(subject="Publish?", fail_on_reject=True))
    done = await store.answers.respond(strict, "gate", {"approve": False}, who="carol")
    assert done.state == "FAILED"
    got = await states(store, strict)
    assert got["gate"] == "FAILED" and got["publish"] == "UPSTREAM_FAILED"


async def test_branch_choice_runs_the_chosen_and_skips_the_others(store: Store) -> None:
    run_id = await waiting(store, BranchChoice(subject="Which?", options=["publish", "left"]))
    with pytest.raises(AnswerError, match="not one of"):
        await store.answers.respond(run_id, "gate", {"choose": "announce"}, who="dan")
    done = await store.answers.respond(run_id, "gate", {"choose": "left"}, who="dan")
    assert done.skipped == ["publish"]
    got = await states(store, run_id)
    assert got["left"] == "PENDING" and got["publish"] == "SKIPPED" and got["announce"] == "SKIPPED"
    assert (await output(store, run_id, "gate"))["chosen"] == "left"


async def test_a_choice_and_a_form_validate_the_answer_and_a_bad_one_changes_nothing(
    store: Store,
) -> None:
    run_id = await waiting(store, Choice(subject="Size?", options=["s", "m", "l"], multiple=True))
    with pytest.raises(AnswerError) as bad:
        await store.answers.respond(run_id, "gate", {"choose": ["s", "xl"]}, who="eve")
    assert bad.value.field == "choose"
    done = await store.answers.respond(run_id, "gate", {"choose": ["s", "l"]}, who="eve")
    assert done.output["chosen"] == ["s", "l"]

    form = await waiting(store, Form(subject="Settle", model=Settlement))
    before = await states(store, form)
    for answer, field in [
        ({"form": {"amount": -5}}, "form.amount"),
        ({"form": {"amount": "many"}}, "form.amount"),
        ({"form": {}}, "form.amount"),
        ({"form": {"amount": 1, "currency": 7}}, "form.currency"),
        ({"approve": True}, "approve"),
        ("not an object", "body"),
    ]:
        with pytest.raises(AnswerError) as err:
            await store.answers.respond(form, "gate", answer, who="eve")
        assert err.value.field == field, (answer, err.value)
    assert await states(store, form) == before
    done = await store.answers.respond(form, "gate", {"form": {"amount": 120}}, who="eve")
    assert done.output["form"] == {"amount": 120}


async def test_a_stranger_is_refused_before_the_state_even_after_the_answer(
    store: Store,
) -> None:
    """The request's trigger row goes with the answer; who could answer it is kept, so a
    stranger learns nothing of its fate, and a respondent who comes late is told who."""
    run_id = await waiting(store, Approval(subject="Publish?", respondents=["alice", "bob"]))
    with pytest.raises(NotAllowed, match="'mallory' may not answer"):
        await store.answers.respond(run_id, "gate", {"approve": "yes"}, who="mallory")
    await store.answers.respond(run_id, "gate", {"approve": True}, who="alice")
    with pytest.raises(NotAllowed, match="'mallory' may not answer") as refused:
        await store.answers.respond(run_id, "gate", {"approve": True}, who="mallory")
    assert "answered" not in str(refused.value), refused.value
    with pytest.raises(NotWaiting, match="already answered by alice at"):
        await store.answers.respond(run_id, "gate", {"approve": True}, who="bob")


async def test_an_answer_no_reader_could_serve_is_refused_and_changes_nothing(
    store: Store,
) -> None:
    form = await waiting(store, Form(subject="Settle", model=Settlement))
    before = await states(store, form)
    deep: Any = 1
    for _ in range(990):
        deep = {"n": deep}
    for answer, field in [
        ({"form": {"amount": 1, "note": deep}}, "form.note.n"),
        ({"form": {"amount": 1, "note": "\ud800"}}, "form.note"),
        ({"form": {"amount": 1}, "comment": "ok \udfff"}, "comment"),
    ]:
        with pytest.raises(AnswerError) as err:
            await store.answers.respond(form, "gate", answer, who="eve")
        assert err.value.field.startswith(field) and len(str(err.value)) < 400, err.value
    assert await states(store, form) == before


async def test_refusals_name_what_is_wrong_and_change_nothing(store: Store) -> None:
    run_id = await waiting(store, Approval(subject="Publish?", respondents=["alice"]))
    before = await states(store, run_id)
    with pytest.raises(UnknownTask, match="no run"):
        await store.answers.respond("nope", "gate", {"approve": True}, who="alice")
    with pytest.raises(UnknownTask, match="no task 'nope'"):
        await store.answers.respond(run_id, "nope", {"approve": True}, who="alice")
    with pytest.raises(NotWaiting, match="not waiting for a person \\(it is PENDING\\)"):
        await store.answers.respond(run_id, "publish", {"approve": True}, who="alice")
    with pytest.raises(NotAllowed, match="'mallory' may not answer"):
        await store.answers.respond(run_id, "gate", {"approve": True}, who="mallory")
    assert await states(store, run_id) == before
    assert not any("answered" in m for m in await log_of(store, run_id, "gate"))


async def test_the_timeout_takes_the_default_answer_or_fails_without_one(
    store: Store, clock: FakeClock
) -> None:
    with_default = await waiting(
        store, Approval(subject="Publish?", default={"approve": False}), timeout=5
    )
    without = await waiting(store, Approval(subject="Publish?"), timeout=5)
    assert await ops(store).expire_waits(ALL_SHARDS) == []
    clock.advance(6)
    assert len(await ops(store).expire_waits(ALL_SHARDS)) == 2
    got = await states(store, with_default)
    assert got["gate"] == "SUCCESS" and got["publish"] == "SKIPPED"
    out = await output(store, with_default, "gate")
    assert out["approved"] is False and out["by"] == "default" and out["default"] is True
    assert any("default answer" in m for m in await log_of(store, with_default, "gate"))
    assert (await states(store, without))["gate"] == "FAILED"
    with pytest.raises(NotWaiting, match="already answered by default"):
        await store.answers.respond(with_default, "gate", {"approve": True}, who="alice")


async def test_two_answers_at_once_one_wins_the_other_is_told_it_was_answered(url: str) -> None:
    """Two stores (two connections, two transactions) answer the same wait together."""
    first, second = await open_store(url), await open_store(url)
    try:
        run_id = await waiting(first, Approval(subject="Publish?"))
        results = await asyncio.gather(
            first.answers.respond(run_id, "gate", {"approve": True}, who="alice"),
            second.answers.respond(run_id, "gate", {"approve": False}, who="bob"),
            return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1 and len(lost) == 1, results
        winner = won[0].output["by"]
        assert isinstance(lost[0], NotWaiting)
        # A respondent who lost is told who won (the respondents were kept with the answer).
        assert str(lost[0]).startswith(f"already answered by {winner} at"), lost[0]
        log = await log_of(first, run_id, "gate")
        assert sum("answered by" in m for m in log) == 1
    finally:
        await first.close()
        await second.close()


async def test_a_branch_option_that_is_not_a_child_skips_nothing_but_the_children(
    store: Store,
) -> None:
    # "announce" is publish's child, not gate's: choosing "left" must not skip it directly.
    run_id = await waiting(
        store, BranchChoice(subject="Which?", options=["publish", "left", "announce"])
    )
    done = await store.answers.respond(run_id, "gate", {"choose": "left"}, who="dan")
    assert done.skipped == ["publish"]  # a child not chosen; announce follows by its rule
    got = await states(store, run_id)
    assert got["left"] == "PENDING" and got["publish"] == "SKIPPED"


async def test_a_rejection_with_fail_on_reject_is_told_to_a_second_answer(store: Store) -> None:
    run_id = await waiting(store, Approval(subject="Publish?", fail_on_reject=True))
    await store.answers.respond(run_id, "gate", {"approve": False}, who="carol")
    with pytest.raises(NotWaiting, match=r"^already answered by carol at"):
        await store.answers.respond(run_id, "gate", {"approve": True}, who="dan")


async def test_a_task_that_deferred_with_a_method_resumes_with_the_answer(store: Store) -> None:
    run_id = await store.runs.create_run(gate_dag(), DAY)
    (row,) = [r for r in await claim(store, "w", 20) if r.run_id == run_id]
    d = deferral(Approval(subject="Go?"), method="resume", method_kwargs={},
                 wait_started_at=store.clock(), timeout=60.0)  # fmt: skip
    await complete(store, [Deferred(**attempt_of(row), deferral=d)])
    done = await store.answers.respond(run_id, "gate", {"approve": False}, who="erin")
    assert done.state == "PENDING" and done.skipped == []
    got = await states(store, run_id)
    assert got["gate"] == "PENDING" and got["publish"] == "PENDING"
    async with store.db.read() as tx:
        r = await tx.fetchone("task_row", run_id=run_id, task_id="gate", map_index=-1)
    assert r is not None and json.loads(r["event"])["approved"] is False
