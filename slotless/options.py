"""Options and argument types that several ``slotless`` commands share.

Each command group registers its commands itself (``add_commands(sub)`` next to its
implementation, listed in :data:`slotless.cli.GROUPS`); what two groups both take is
declared here once, so ``--db`` or ``--parse-timeout`` reads the same everywhere.
"""

from __future__ import annotations

import argparse
import os
from datetime import date

from executor.catalogue import DEFAULT_PARSE_TIMEOUT, DEFAULT_RESCAN

from .roles import parse_tokens


def db_opt(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--db", help="database URL (default: $SLOTLESS_DB or sqlite:///slotless.db)")


def isolation_opt(sp: argparse.ArgumentParser) -> None:
    """How each attempt runs (docs/operations.md, "Isolation: threads or processes")."""
    sp.add_argument(
        "--isolation",
        choices=["thread", "process"],
        default="thread",
        help="thread (the default: the fastest; a thread cannot be killed, so a task past its "
        "timeout runs on, and a lost attempt stops only at its next Python instruction) or "
        "process (a forked child per attempt, 5 ms of CPU each, so a few hundred tasks/s at "
        "most: killed at its timeout, and never running beside its retry on another worker)",
    )


def parse_timeout_opt(sp: argparse.ArgumentParser, what: str = "one file") -> None:
    sp.add_argument(
        "--parse-timeout",
        type=float,
        default=DEFAULT_PARSE_TIMEOUT,
        metavar="SECONDS",
        help=f"time limit to import {what} (default {DEFAULT_PARSE_TIMEOUT:g})",
    )


def dags_opts(sp: argparse.ArgumentParser) -> None:
    """A long-running process's DAG folder, kept in the catalogue while it runs."""
    sp.add_argument(
        "--dags",
        metavar="DIR",
        help="keep the DAG catalogue up to date with this folder (default: $SLOTLESS_DAGS)",
    )
    sp.add_argument(
        "--rescan",
        type=float,
        default=DEFAULT_RESCAN,
        metavar="SECONDS",
        help=f"how often to look for changed DAG files (default {DEFAULT_RESCAN:g})",
    )
    parse_timeout_opt(sp)


def metrics_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port"
    )
    sp.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")


def token_opt(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--token",
        default=None,
        help="let whoever signs in on the web page with a token, or sends it to the JSON API "
        "(Authorization: Bearer TOKEN), do what its role allows: a comma-separated list of "
        "NAME:ROLE:SECRET entries, ROLE viewer (reads the audit list), operator (triggers, "
        "clears, marks, retries, cancels, resumes, answers) or admin (also pauses DAGs and "
        "manages pools); NAME:SECRET is an operator, a bare SECRET an operator named "
        "operator. Writes are recorded under NAME (default: $SLOTLESS_UI_TOKEN; without "
        "one the page and the API are read-only). The environment variable keeps it out "
        "of the process list",
    )


def ui_tokens(args: argparse.Namespace) -> str | None:
    """The page's token list (``--token``, else $SLOTLESS_UI_TOKEN), checked: a malformed
    one is refused before anything starts (a :class:`~slotless.roles.TokenError`, one line
    naming the entry, exit 2)."""
    text = getattr(args, "token", None) or os.environ.get("SLOTLESS_UI_TOKEN") or None
    parse_tokens(text)
    return text


def slots(text: str) -> int:
    # Checked here, before a run is created: zero slots would leave it RUNNING forever.
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1: {text!r}")
    return n


def duration(text: str) -> float:
    from executor.durations import seconds

    try:
        value = seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert value is not None
    return value


def logical_date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None
