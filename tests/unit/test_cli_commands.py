"""The ``slotless`` parser: every command comes from a command group's own
``add_commands`` (cli.GROUPS), and every one can run."""

from __future__ import annotations

import argparse

from slotless import cli

COMMANDS = {
    "run", "worker", "triggerer", "ui", "up", "status", "logs", "dags", "trigger", "backfill",
    "clear", "mark", "cancel", "retry", "resume", "events", "respond", "pools", "queues", "bench",
    "assets", "airflow-triggerer",
}  # fmt: skip


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _leaves(p: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.ArgumentParser]:
    subs = _subparsers(p)
    if not subs:
        return {path: p}
    out: dict[str, argparse.ArgumentParser] = {}
    for name, sp in subs.items():
        out |= _leaves(sp, f"{path} {name}".strip())
    return out


def test_every_command_comes_from_a_group() -> None:
    assert set(_subparsers(cli._parser())) == COMMANDS
    for group in cli.GROUPS:
        sub = argparse.ArgumentParser().add_subparsers()
        group.add_commands(sub)
        assert sub.choices, group  # each group adds at least one command


def test_every_command_has_a_function_and_a_database_option_where_it_opens_one() -> None:
    leaves = _leaves(cli._parser())
    for path, p in leaves.items():
        assert callable(p.get_default("func")), path
    # bench makes its own databases; airflow-triggerer serves Airflow's, named by Airflow's
    # own configuration.
    no_db = {"bench", "airflow-triggerer"}
    for path, p in leaves.items():
        has_db = any("--db" in a.option_strings for a in p._actions)
        assert has_db == (path not in no_db), path
