"""The ``slotless`` command line.

A command group is a module with ``add_commands(sub)``, which adds its subcommands (each
with ``func``, an ``async`` function of the parsed arguments returning the exit status) to
the parser's subparsers; listing it in :data:`GROUPS` is all that adds it to ``slotless``.
Options several groups take (``--db``, ``--dags``, ``--metrics-port`` ...) are in
:mod:`.options`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
from typing import Any, Protocol

from . import (
    airflow_cli,
    assets_cli,
    backfill,
    bench,
    control,
    dags,
    events,
    logs,
    pools,
    respond,
    run,
    serve,
    status,
    trigger,
)  # fmt: skip
from .opening import USER_ERRORS, refusal

__all__ = ["GROUPS", "USER_ERRORS", "main"]

# The exit status when the reader of our output went away (``slotless logs ... | head``):
# what a shell reports for cat, grep or seq killed by SIGPIPE in the same place (128 + 13).
READER_GONE = 141


class CommandGroup(Protocol):
    """A module of commands: it adds them, with their options and ``func``, itself."""

    def add_commands(self, sub: Any) -> None: ...


# The order ``slotless --help`` lists the commands in.
GROUPS: tuple[CommandGroup, ...] = (
    run, serve, status, logs, dags, trigger, backfill, control, events, respond, pools, bench,
    assets_cli, airflow_cli,
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        code: int = _loop_runner()(args.func(args))
        sys.stdout.flush()  # a reader gone shows here, inside the try, not at exit
        _leave_stuck_task_threads(code)
        return code
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # Every command's start errors (and a database lost in a short command) end here:
        # one line, what is wrong and what to do, exit 2.
        line = refusal(exc, args)
        if line is None:
            raise
        print(f"slotless: error: {line}", file=sys.stderr)
        return 2


def _reader_gone() -> int:
    """Our stdout's reader closed the pipe (``| head``): end quietly, as cat would. What
    is still buffered goes to /dev/null, or flushing it at exit would fail again."""
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), sys.stdout.fileno())
    return READER_GONE


def _leave_stuck_task_threads(code: int) -> None:
    """A task thread past its execution timeout cannot be stopped, and Python joins every
    thread at exit: once the command is done, exit without waiting for such a thread."""
    stuck = [t for t in threading.enumerate() if t.name.startswith("slot")]
    for t in stuck:
        t.join(0.2)
    if any(t.is_alive() for t in stuck):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _loop_runner() -> Any:
    """uvloop where installed (``pip install slotless[uvloop]``), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slotless", description=__doc__.partition("\n")[0])
    sub = p.add_subparsers(required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_commands(sub)
    return p


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
