"""`slotless up`: the local stack in one command.

A worker, a triggerer and the web page, each its own process against one database: the
sidecar layout run in production, on one machine. Their output is interleaved here with
a ``[name]`` prefix. Ctrl-C (SIGINT) or SIGTERM stops all three together (a second one
kills them); if one of them exits by itself, the others are stopped too and its exit
code is returned.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
from datetime import date
from pathlib import Path

from executor.catalogue import DAGS_ENV, dags_folder
from executor.loader import load_dag
from executor.store import Store, resolve_url
from executor.store.people import UI_URL_ENV

from .opening import open_writable

STOP_GRACE = 30.0  # seconds the three get to finish before they are killed


async def up(args: argparse.Namespace) -> int:
    url = resolve_url(args.db)
    store = await open_writable(url)  # creates the schema, so that every process finds it
    try:
        others = await serving_here(store)
        if others:
            verb = "serves" if len(others) == 1 else "serve"
            _say(
                f"{' and '.join(others)} already {verb} this database on this machine; "
                "this starts another worker and triggerer beside them (stop that one first "
                "unless this is meant)"
            )
        for file in args.files:
            dag = load_dag(file, None)
            run_id = await store.runs.create_run(
                dag, date.today(), dag_file=str(Path(file).resolve())
            )
            _say(f"started run {run_id} of {file}")
    finally:
        await store.close()

    cli = [sys.executable, "-m", "slotless"]
    worker = [*cli, "worker", "--db", url, "--slots", str(args.slots)]
    worker += ["--isolation", args.isolation]
    triggerer = [*cli, "triggerer", "--db", url]
    if args.worker_metrics_port is not None:
        worker += ["--metrics-port", str(args.worker_metrics_port)]
    if args.triggerer_metrics_port is not None:
        triggerer += ["--metrics-port", str(args.triggerer_metrics_port)]
    folder = dags_folder(args.dags)
    if folder is not None:
        # One process keeps the catalogue (and so the schedules) up to date: the triggerer.
        triggerer += ["--dags", str(folder.resolve()), "--rescan", str(args.rescan)]
        triggerer += ["--parse-timeout", str(args.parse_timeout)]
    ui = [*cli, "ui", "--db", url, "--host", args.host, "--port", str(args.port)]
    # $SLOTLESS_DAGS is the triggerer's job here (its --dags above): the worker and the
    # page would otherwise parse the same folder twice more.
    base = {k: v for k, v in os.environ.items() if k != DAGS_ENV}
    envs = {"worker": base, "ui": dict(base), "triggerer": dict(os.environ)}
    # A notice's link to the page is the page this command serves, unless the operator named
    # another (a proxy's public address, say).
    if UI_URL_ENV not in os.environ:
        for name in ("worker", "triggerer"):
            envs[name][UI_URL_ENV] = page_url(args.host, args.port)
    if args.token:  # to the page alone, in its environment: not in its argv for `ps` to show
        envs["ui"]["SLOTLESS_UI_TOKEN"] = args.token
    return await Stack({"worker": worker, "triggerer": triggerer, "ui": ui}, envs).run()


async def serving_here(store: Store) -> list[str]:
    """The live workers and triggerers of this machine on this database, as "worker ID"
    (an id is ``host:pid:random``). Their liveness locks answer, not their heartbeats: a
    process killed a moment ago is not counted.

    Another machine's are left out: several hosts sharing a PostgreSQL database is how it
    scales, while two stacks on one host (two ``up`` in two terminals) is almost always a
    forgotten one.
    """
    host = socket.gethostname()
    found = {f"worker {w}": w for w in await store.exchange.other_workers("")}
    found |= {f"triggerer {t.id}": t.id for t in await store.views.list_triggerers()}
    found = {k: i for k, i in found.items() if i.split(":", 1)[0] == host}
    if not found:
        return []
    liveness = store.db.liveness()
    try:
        alive = await liveness.alive(set(found.values()))
    finally:
        await liveness.close()
    return [k for k, i in found.items() if i in alive]


def page_url(host: str, port: int) -> str:
    """The address a person opens to reach a page served on ``host``:``port``; a wildcard
    address listens on every interface, so the link names this machine."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host:  # an IPv6 address, bracketed in a URL
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _say(line: str) -> None:
    print(f"slotless up: {line}", file=sys.stderr, flush=True)


class Stack:
    """Child processes started together and stopped together."""

    def __init__(
        self, commands: dict[str, list[str]], envs: dict[str, dict[str, str]] | None = None
    ) -> None:
        self.commands = commands
        self.envs = envs or {}
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self._stop = asyncio.Event()
        self._signals = 0

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        pumps = []
        try:
            for name, argv in self.commands.items():
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    env=self.envs.get(name),
                )
                self.procs[name] = proc
                pumps.append(asyncio.create_task(self._pump(name, proc)))
            _say(
                f"{', '.join(f'{n} (pid {p.pid})' for n, p in self.procs.items())} started; "
                "Ctrl-C stops them all"
            )
            waits = {asyncio.create_task(p.wait()): n for n, p in self.procs.items()}
            stop = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([*waits, stop], return_when=asyncio.FIRST_COMPLETED)
            code = 0
            first = next((t for t in done if t in waits), None)
            if first is not None and not self._stop.is_set():
                name = waits[first]
                code = first.result() or 1
                _say(f"the {name} exited with code {first.result()}; stopping the others")
            stop.cancel()
            await self._shutdown()
            for t in waits:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await asyncio.gather(*pumps, return_exceptions=True)
            if code == 0:
                _say("stopped")
            return code
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for proc in self.procs.values():
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
            _say("stopping the worker, the triggerer and the web page")
            self._stop.set()
        else:
            _say("killing them")
            for proc in self.procs.values():
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()

    async def _shutdown(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        waiting = [p.wait() for p in self.procs.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waiting), STOP_GRACE)
        except TimeoutError:
            _say(f"still running after {STOP_GRACE:g} s; killing them")
            for proc in self.procs.values():
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()

    async def _pump(self, name: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        width = max(len(n) for n in self.commands)
        while line := await proc.stdout.readline():
            text = line.decode(errors="replace").rstrip("\n")
            print(f"[{name:<{width}}] {text}", file=sys.stderr, flush=True)
