"""Events pushed over HTTP into waits held by the store, on SQLite and on PostgreSQL.

    python -m benchmarks.events                          # 100,000 waits on 10,000 matches
    python -m benchmarks.events --waits 10000 --backends sqlite      # a quick look
    slotless bench events

For each backend, in a fresh database (PostgreSQL: a fresh schema on ``--pg``), with a real
``slotless ui --token`` process serving the JSON API and a real ``slotless triggerer``:

* waits: tasks DEFERRED on ``EventTrigger(name="bench.ready", match={"k": i // 10})``
  (10 waits per match, each deferred with a method, so that an event makes them PENDING),
  written through the worker's own path (``Exchange.exchange`` with the deferral a sensor
  makes) in this process, in batches, up to 1,000, 10,000 and ``--waits`` held;
* at each size, ``--events`` events sent one by one over HTTP, each matching one live
  match (10 waits): the HTTP round trip (``event_cost_ms`` per size: target flat), and from
  just before the POST to the PENDING transition of its waits as the store recorded it
  (``event_to_pending_*``: the figures at the largest size are the headline keys);
* events accepted per second over HTTP (``events_per_s``): ``--clients`` concurrent clients
  posting one event per request (single), then batches of ``--batch`` events per request
  (batched); the events match no wait (their name is waited on, so each is looked up);
* the CPU the triggerer and the page used while idle for ``--idle`` seconds with every
  wait held (``idle_cpu_percent``): no process polls for events.

The machine is shared with other work (two cores): ``load`` records how busy the rest of
it was. Results: benchmarks/results/events.json and events.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from executor import DAG
from executor.outcomes import Deferred
from executor.sensing import deferral
from executor.store import Store, open_store
from triggers.events import EventTrigger

from . import calibration, common
from .postgres import DEFAULT_DSN, Schema

NAME = "bench.ready"
PER_MATCH = 10
TOKEN = "bench:" + secrets.token_hex(8)
RUN_TASKS = 1000  # waits per run: a run's rows sit together
SIZES = (1000, 10_000, 100_000)


def _noop(ctx: Any) -> None:
    return None


def _dag(n: int) -> DAG:
    dag = DAG("bench_events")
    for i in range(n):
        dag.task(_noop, task_id=f"w{i:05d}")
    return dag


class Waits:
    """Grows the waits held, through the worker's own recording path (``Exchange.exchange``
    with the deferral a sensor makes), on ``writers`` connections at once."""

    def __init__(self, stores: list[Store]) -> None:
        self.stores = stores
        self.made = 0
        self.dag = _dag(RUN_TASKS)
        self.run_number: dict[str, int] = {}

    async def grow_to(self, n: int) -> None:
        while self.made < n:  # runs of RUN_TASKS waits: wait i waits on match i // PER_MATCH
            run_id = await self.stores[0].runs.create_run(self.dag, date(2026, 11, 24))
            self.run_number[run_id] = self.made // RUN_TASKS
            self.made += RUN_TASKS

        async def writer(store: Store) -> None:
            while claimed := await store.exchange.exchange([], "bench", 500):
                now = time.time()
                outcomes = []
                for row in claimed:
                    i = self.run_number[row.run_id] * RUN_TASKS + int(row.task_id[1:])
                    trigger = EventTrigger(name=NAME, match={"k": i // PER_MATCH})
                    d = deferral(trigger, method="resume", method_kwargs={},
                                 wait_started_at=now, timeout=86400.0)  # fmt: skip
                    assert row.owner is not None
                    outcomes.append(Deferred(row_id=row.id, owner=row.owner,
                                             attempt=row.attempt, max_attempts=row.max_attempts,
                                             run_id=row.run_id, deferral=d))  # fmt: skip
                await store.exchange.exchange(outcomes, "", 0)

        await asyncio.gather(*(writer(s) for s in self.stores))


class Services:
    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.folder = folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port = 0

    def start(self) -> str:
        env = {**os.environ, "SLOTLESS_UI_TOKEN": TOKEN}
        with socket_free() as port:
            self.port = port
        for name, args in (
            ("ui", ["ui", "--port", str(self.port)]),
            ("triggerer", ["triggerer"]),
        ):
            log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - kept by the child
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "slotless", *args, "--db", self.url],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def cpu_seconds(self) -> dict[str, float]:
        out = {}
        for name, proc in self.procs.items():
            t = psutil.Process(proc.pid).cpu_times()
            out[name] = t.user + t.system
        return out


class socket_free:
    def __enter__(self) -> int:
        import socket

        self._s = socket.socket()
        self._s.bind(("127.0.0.1", 0))
        return int(self._s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._s.close()


async def _wait_http(session: aiohttp.ClientSession, base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session.get(base + "/api/v1/openapi.json") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base} did not answer within {timeout} s")
        await asyncio.sleep(0.1)


async def _post(session: aiohttp.ClientSession, base: str, body: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TOKEN.split(':', 1)[1]}"}
    async with session.post(base + "/api/v1/events", json=body, headers=headers) as resp:
        data: dict[str, Any] = await resp.json()
        if resp.status != 201:
            raise RuntimeError(f"POST /api/v1/events: {resp.status} {data}")
        return data


async def _idle(services: Services, seconds: float) -> dict[str, float]:
    """CPU % of each service process over ``seconds`` with nothing sent."""
    before = services.cpu_seconds()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - t0
    after = services.cpu_seconds()
    return {k: round((after[k] - before[k]) / wall * 100, 2) for k in after}


async def measure_events(
    store: Store, session: aiohttp.ClientSession, base: str, keys: list[int]
) -> tuple[list[float], list[float]]:
    """Send one event per key, one at a time: (round trips in s, event -> PENDING in s).

    The answer is sent after the transaction that made the waits PENDING committed, so
    the round trip bounds "sent -> PENDING and visible to every worker" from above; the
    second list is from just before the POST to the transition's own timestamp (the
    store's clock when the event's transaction began: the server's on PostgreSQL)."""
    trips, stamps = [], []
    for k in keys:
        t0 = time.time()
        data = await _post(session, base, {"name": NAME, "payload": {"k": k, "sent": t0}})
        trips.append(time.time() - t0)
        woke = data["events"][0]["woke"]
        if len(woke) != PER_MATCH or any(w["state"] != "PENDING" for w in woke):
            raise RuntimeError(f"the event for k={k} woke {woke}, not {PER_MATCH} PENDING waits")
        stamps.append(max(w["woke_at"] for w in woke) - t0)
    return trips, stamps


async def throughput(
    session: aiohttp.ClientSession, base: str, total: int, clients: int, batch: int
) -> float:
    """Events accepted per second: ``clients`` posting at once, ``batch`` events a request."""
    per_client = max(1, total // (clients * batch))
    unmatched = 10**9  # a match no wait has: looked up, wakes nothing

    async def client(c: int) -> None:
        for j in range(per_client):
            events = [{"name": NAME, "payload": {"k": unmatched + c, "j": j, "i": i}}
                      for i in range(batch)]  # fmt: skip
            await _post(session, base, events[0] if batch == 1 else {"events": events})

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return per_client * clients * batch / (time.perf_counter() - t0)


async def run_backend(
    backend: str, url: str, args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    common.console.print(f"[bold]{backend}[/bold]: {url}")
    store = await open_store(url)
    writers = [store] + [await open_store(url) for _ in range(args.writers - 1)]
    services = Services(url, folder / backend)
    (folder / backend).mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"sizes": {}}
    try:
        base = services.start()
        waits = Waits(writers)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await _wait_http(session, base)
            # The same processes with no wait at all: what every idle triggerer costs.
            result["idle_cpu_percent_no_waits"] = await _idle(services, args.idle)
            common.console.print(f"  idle CPU, no waits: {result['idle_cpu_percent_no_waits']}")
            woken: set[int] = set()
            sizes = [s for s in SIZES if s < args.waits] + [args.waits]
            for size in sizes:
                t0 = time.perf_counter()
                made_before = waits.made
                await waits.grow_to(size + len(woken) * PER_MATCH)  # `size` live waits
                made_s = time.perf_counter() - t0
                live = [k for k in range(waits.made // PER_MATCH) if k not in woken]
                step = max(1, len(live) // args.events)
                keys = live[::step][: args.events]
                woken.update(keys)
                trips, lat = await measure_events(store, session, base, keys)
                trips.sort()
                lat.sort()
                result["sizes"][str(size)] = {
                    "waits_held": size,
                    "events": len(keys),
                    "event_cost_ms_p50": round(common.percentile(trips, 50) * 1000, 2),
                    "event_cost_ms_p99": round(common.percentile(trips, 99) * 1000, 2),
                    "event_to_pending_p50_s": round(common.percentile(trips, 50), 4),
                    "event_to_pending_p99_s": round(common.percentile(trips, 99), 4),
                    "sent_to_transition_stamp_p99_s": round(common.percentile(lat, 99), 4),
                    "waits_written_per_s": round((waits.made - made_before) / max(made_s, 1e-9)),
                }
                common.console.print(f"  {size:>7} waits: {result['sizes'][str(size)]}")
            last = result["sizes"][str(sizes[-1])]
            result["waits"] = last["waits_held"]
            result["event_to_pending_p50_s"] = last["event_to_pending_p50_s"]
            result["event_to_pending_p99_s"] = last["event_to_pending_p99_s"]
            # Idle: every wait held, nothing sent.
            before = services.cpu_seconds()
            t0 = time.perf_counter()
            await asyncio.sleep(args.idle)
            wall = time.perf_counter() - t0
            after = services.cpu_seconds()
            result["idle_s"] = round(wall, 1)
            result["idle_cpu_percent"] = {
                k: round((after[k] - before[k]) / wall * 100, 2) for k in after
            }
            common.console.print(f"  idle CPU: {result['idle_cpu_percent']}")
            single = await throughput(session, base, args.single_events, args.clients, 1)
            batched = await throughput(session, base, args.batched_events, 2, args.batch)
            result["events_per_s_single"] = round(single)
            result["events_per_s_batched"] = round(batched)
            result["events_per_s"] = round(batched)
            common.console.print(
                f"  events/s over HTTP: single {single:.0f}, batched {batched:.0f}"
            )
    finally:
        services.stop()
        for w in writers:
            await w.close()
    return result


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    doc = common.result_document("events", sys.argv[1:], vars(args).copy(), Path("."))
    per_backend: dict[str, list[dict[str, Any]]] = {}
    with common.workdir(args.workdir, args.keep) as folder, calibration.Recording(folder) as rec:
        for i in range(args.repeats):
            run: dict[str, Any] = {}
            with common.MachineLoad() as one:
                for backend in args.backends.split(","):
                    if backend == "sqlite":
                        url = common.fresh_db(folder, f"events{i}")
                        run[backend] = await run_backend(backend, url, args, folder)
                    else:
                        async with Schema(args.pg) as schema:
                            run[backend] = await run_backend(backend, schema.url, args, folder)
            rec.add(headline(run), one.summary)
            # Each backend's details: the run with its median event -> PENDING p99.
            for backend, figures in run.items():
                per_backend.setdefault(backend, []).append(figures)
    for backend, runs in per_backend.items():
        p99s = [r["event_to_pending_p99_s"] for r in runs]
        doc[backend] = runs[calibration.median_index(p99s)]
    doc.update(rec.fields())
    first = doc[args.backends.split(",")[0]]
    for key in ("waits", "event_to_pending_p50_s", "event_to_pending_p99_s", "events_per_s"):
        doc[key] = first[key]
    return doc


def headline(run: dict[str, Any]) -> dict[str, float | None]:
    """One run's headline figures, per backend."""
    out: dict[str, float | None] = {}
    for backend, r in run.items():
        for key in ("event_to_pending_p50_s", "event_to_pending_p99_s", "events_per_s"):
            out[f"{backend}_{key}"] = r.get(key)
    return out


def plot(doc: dict[str, Any], backends: Sequence[str]) -> None:
    fig, (cost, lat, rate) = common.subplots(3, width=4.6)
    for b in backends:
        sizes = doc[b]["sizes"]
        xs = [int(s) for s in sizes]
        cost.plot(xs, [sizes[s]["event_cost_ms_p50"] for s in sizes], marker="o", label=f"{b} p50")
        cost.plot(xs, [sizes[s]["event_cost_ms_p99"] for s in sizes], marker="x", ls="--",
                  label=f"{b} p99")  # fmt: skip
        lat.plot(xs, [sizes[s]["event_to_pending_p99_s"] * 1000 for s in sizes], marker="o",
                 label=b)  # fmt: skip
    cost.set(xscale="log", xlabel="waits held", ylabel="ms", title="one event over HTTP (10 waits)")
    lat.axhline(100, color="red", ls="--", lw=1, label="target 100 ms")
    lat.set(xscale="log", xlabel="waits held", ylabel="ms", title="event -> PENDING, p99")
    names = [f"{b}\n{kind}" for b in backends for kind in ("single", "batched")]
    values = [doc[b][f"events_per_s_{kind}"] for b in backends for kind in ("single", "batched")]
    rate.bar(names, values, color=["#8ab", "#468"] * len(backends))
    rate.axhline(5000, color="red", ls="--", lw=1, label="target 5,000/s batched")
    rate.set(ylabel="events / s", title="events accepted over HTTP")
    for ax in (cost, lat, rate):
        ax.legend(fontsize=7)
    fig.suptitle(calibration.caption(doc), fontsize=8)
    common.save_figure(fig, "events")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.events", description=__doc__.split("\n")[0]
    )
    p.add_argument("--waits", type=int, default=100_000)
    p.add_argument("--events", type=int, default=200, help="events measured at each size")
    p.add_argument("--backends", default="sqlite,postgresql")
    p.add_argument("--pg", default=os.environ.get("SLOTLESS_TEST_PG_DSN") or DEFAULT_DSN)
    p.add_argument("--idle", type=float, default=30.0, help="seconds of idle measured")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--writers", type=int, default=4, help="connections writing the waits")
    p.add_argument("--single-events", type=int, default=2000)
    p.add_argument("--batched-events", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--workdir")
    p.add_argument("--keep", action="store_true")
    calibration.add_repeats_argument(p)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    doc = asyncio.run(main_async(args))
    common.write_json("events", doc)
    plot(doc, args.backends.split(","))
    print(json.dumps({k: doc[k] for k in ("waits", "event_to_pending_p50_s",
                                          "event_to_pending_p99_s", "events_per_s")}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
