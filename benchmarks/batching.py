"""Batching: external requests per cycle with and without batched checks.

S3: 10,000 S3KeyTrigger sensors over 10 prefixes of one bucket, against moto's HTTP server
in its own process (so this process's CPU is the client's alone). One cycle checks every
sensor once:

* batched   - as the triggerer does it: S3KeyTrigger.poke_many in calls of at most 1,000
              triggers (its batch size), all at once; one paginated ListObjectsV2 per prefix;
* unbatched - one HEAD per key (what a per-key sensor does), 256 in flight (the
              triggerer's concurrency), over the same aiobotocore client;
* through the triggerer - the same sensors as deferrable sensors of one DAG run, served by
              a real Worker and Triggerer on a SQLite file: requests per cycle once all have
              deferred, then the time from every key landing to the run's end.

SFTP: 1,000 SFTPFileTrigger sensors in one directory of one host (OpenSSH's sshd where
installed, else asyncssh's server), one cycle each way:

* batched          - poke_many: one SSH connection, one directory listing;
* stat per file    - one SSH connection, a ``stat`` per sensor (64 in flight);
* connection/check - a new SSH connection per check (sampled, then scaled to 1,000).

Writes benchmarks/results/batching.json and batching.png:

    python -m benchmarks.batching [--sensors 10000] [--prefixes 10] [--cycles 5]
                                  [--triggerer-sensors 10000] [--interval 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path
from typing import Any

import psutil

from benchmarks import calibration
from benchmarks.common import (
    MachineLoad,
    load_row,
    print_table,
    result_document,
    save_figure,
    subplots,
    write_json,
)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the real-server helpers live with the tests

from support.exchanging import run_counts  # noqa: E402
from support.servers import (  # noqa: E402
    COUNT_PATH,
    SEED_PATH,
    AsyncSFTPServer,
    OpenSSHServer,
    SSHKeys,
    s3_conn_uri,
    sshd_available,
)

from triggers.checking import CheckContext  # noqa: E402
from triggers.s3 import S3KeyTrigger, _link  # noqa: E402
from triggers.sftp import SFTPFileTrigger, sftp_link  # noqa: E402

BATCH_SIZE = 1000  # TriggererConfig.batch_size
CONCURRENCY = 256  # TriggererConfig.max_concurrency


# -- S3 ------------------------------------------------------------------------------------


class MotoProcess:
    """``python -m support.servers moto`` (from tests/): moto's server, counting, in its own
    process."""

    def __enter__(self) -> MotoProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "support.servers", "moto"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO / "tests",
        )
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"moto did not start: {self.endpoint!r}")
        self.ps = psutil.Process(self.proc.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def _call(self, path: str, method: str = "GET", body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.endpoint + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())

    def counts(self) -> dict[str, int]:
        return self._call(COUNT_PATH)

    def reset(self) -> None:
        self._call(COUNT_PATH, "DELETE")

    def seed(self, bucket: str, keys: list[str]) -> None:
        self._call(SEED_PATH, "POST", {"bucket": bucket, "keys": keys})

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system


async def s3_benchmark(
    sensors: int,
    prefixes: int,
    cycles: int,
    head_cycles: int,
    triggerer_sensors: int = 0,
    interval: float = 5.0,
) -> dict:
    per_prefix = sensors // prefixes
    bucket = "batching-bench"
    keys = [
        f"landing/p{p:02d}/file-{k:05d}.csv" for p in range(prefixes) for k in range(per_prefix)
    ]
    present = keys[::2]  # half the files have landed: listings carry real content
    with MotoProcess() as moto:
        os.environ["SLOTLESS_CONN_BENCH_S3"] = s3_conn_uri(moto.endpoint)
        ctx = CheckContext()
        try:
            link = await _link(ctx, "bench_s3")
            await link.client.create_bucket(Bucket=bucket)
            moto.seed(bucket, present)
            triggers = [S3KeyTrigger(bucket=bucket, key=k, conn_id="bench_s3") for k in keys]

            async def batched_cycle() -> list:
                chunks = [triggers[i : i + BATCH_SIZE] for i in range(0, len(triggers), BATCH_SIZE)]
                parts = await asyncio.gather(*(S3KeyTrigger.poke_many(c, ctx) for c in chunks))
                return [r for p in parts for r in p]

            sem = asyncio.Semaphore(CONCURRENCY)

            async def head(key: str) -> bool:
                from botocore.exceptions import ClientError

                async with sem:
                    try:
                        await link.client.head_object(Bucket=bucket, Key=key)
                        return True
                    except ClientError:
                        return False

            async def head_cycle() -> list:
                return await asyncio.gather(*(head(k) for k in keys))

            batched = await _cycles(moto, batched_cycle, cycles)
            fired = sum(r is not None for r in await batched_cycle())
            assert fired == len(present), (fired, len(present))
            unbatched = await _cycles(moto, head_cycle, head_cycles)
        finally:
            await ctx.aclose()
        served = None
        if triggerer_sensors:
            served = await through_triggerer(moto, triggerer_sensors, prefixes, interval)
    return {
        "sensors": sensors,
        "prefixes": prefixes,
        "keys_present": len(present),
        "batched": batched,
        "unbatched_head_per_key": unbatched,
        "through_triggerer": served,
    }


async def through_triggerer(
    moto: MotoProcess, sensors: int, prefixes: int, interval: float
) -> dict:
    """Deferrable sensors of one DAG run, served by a real Worker and Triggerer."""
    from executor import DAG
    from executor.store import open_store
    from executor.worker import Worker
    from triggerer.service import Triggerer, TriggererConfig

    bucket = "batching-bench-e2e"
    per_prefix = sensors // prefixes
    keys = [
        f"landing/p{p:02d}/file-{k:05d}.csv" for p in range(prefixes) for k in range(per_prefix)
    ]
    dag = DAG("batching_bench")
    for i, key in enumerate(keys):
        trigger = S3KeyTrigger(bucket=bucket, key=key, conn_id="bench_s3", poke_interval=interval)
        dag.sensor(f"s{i:05d}", trigger, mode="deferrable", timeout=3600)
    with tempfile.TemporaryDirectory(prefix="slotless-batching-") as tmp:
        store = await open_store(f"sqlite:///{tmp}/bench.db")
        setup = CheckContext()
        try:
            await (await _link(setup, "bench_s3")).client.create_bucket(Bucket=bucket)
        finally:
            await setup.aclose()
        triggerer = Triggerer(store.views, config=TriggererConfig(lease_every=0.5, sync_every=0.2))
        worker = Worker(
            store, slots=64, dags={dag.dag_id: dag}, poll_interval=0.05, on_defer=triggerer.poke
        )
        out: dict[str, Any] = {"sensors": sensors, "prefixes": prefixes, "interval_s": interval}
        try:
            run_id = await store.runs.create_run(dag, date(2024, 1, 2))
            t0 = time.perf_counter()
            sidecar = asyncio.create_task(triggerer.run())
            serving = asyncio.create_task(worker.run())
            while (await run_counts(store, run_id)).get("DEFERRED", 0) < sensors:
                await asyncio.sleep(0.2)
            out["seconds_until_all_deferred"] = round(time.perf_counter() - t0, 2)
            # Count whole cycles: from a grid instant, for three intervals.
            await asyncio.sleep((int(time.time() / interval) + 1) * interval - time.time() + 0.01)
            moto.reset()
            n = 3
            await asyncio.sleep(n * interval)
            counts = moto.counts()
            out["cycles_measured"] = n
            out["requests_per_cycle"] = sum(counts.values()) / n
            out["requests_by_operation"] = counts
            out["checks_done"] = triggerer.checks_done
            # Every key lands at once: how long until the whole run has ended?
            moto.seed(bucket, keys)
            t1 = time.perf_counter()
            while (info := await store.views.run_info(run_id)) is not None and info[
                "state"
            ] == "RUNNING":
                await asyncio.sleep(0.1)
            out["seconds_from_all_keys_landing_to_run_end"] = round(time.perf_counter() - t1, 2)
            out["run_state"] = info["state"] if info is not None else None
        finally:
            worker.stop()
            await serving
            triggerer.stop()
            await sidecar
            await store.close()
    return out


async def _cycles(moto: MotoProcess, cycle: Any, n: int) -> dict:
    await cycle()  # warm: connections open, nothing imported lazily
    rows: list[dict[str, Any]] = []
    for _ in range(n):
        moto.reset()
        cpu0, srv0, t0 = time.process_time(), moto.cpu(), time.perf_counter()
        await cycle()
        wall = time.perf_counter() - t0
        rows.append(
            {
                "seconds": wall,
                "client_cpu_s": time.process_time() - cpu0,
                "server_cpu_s": moto.cpu() - srv0,
                "requests": moto.counts(),
            }
        )
    reqs = [sum(r["requests"].values()) for r in rows]
    return {
        "cycles": n,
        "requests_per_cycle": max(reqs),
        "requests_by_operation": rows[-1]["requests"],
        "cycle_seconds_median": _median([r["seconds"] for r in rows]),
        "cycle_seconds": [round(r["seconds"], 4) for r in rows],
        "client_cpu_s_per_cycle": _median([r["client_cpu_s"] for r in rows]),
        "server_cpu_s_per_cycle": _median([r["server_cpu_s"] for r in rows]),
    }


def _median(values: list[float]) -> float:
    s = sorted(values)
    return round(s[len(s) // 2], 4)


# -- SFTP ----------------------------------------------------------------------------------


async def sftp_benchmark(sensors: int, per_connection_sample: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="slotless-sftp-bench-") as tmp:
        tmp_path = Path(tmp)
        keys = SSHKeys(tmp_path / "keys")
        root = tmp_path / "root"
        (root / "inbox").mkdir(parents=True)
        if sshd_available():
            (tmp_path / "sshd").mkdir()
            server: Any = OpenSSHServer(root, keys, tmp_path / "sshd").start()
            kind = "openssh " + _sshd_version()
        else:
            server = await AsyncSFTPServer(root, keys).start()
            kind = "asyncssh (in this process: its CPU counts as the client's)"
        try:
            for i in range(0, sensors, 2):
                (root / "inbox" / f"f{i:05d}.csv").write_text("x")
            os.environ["SLOTLESS_CONN_BENCH_SFTP"] = server.conn_uri()
            paths = [server.path(f"inbox/f{i:05d}.csv") for i in range(sensors)]
            triggers = [SFTPFileTrigger(path=p, conn_id="bench_sftp") for p in paths]
            ctx = CheckContext()
            try:
                link = await sftp_link(ctx, "bench_sftp")
                await SFTPFileTrigger.poke_many(triggers, ctx)  # warm: connect once
                server.reset()
                t0, cpu0 = time.perf_counter(), time.process_time()
                results = await SFTPFileTrigger.poke_many(triggers, ctx)
                batched_s, batched_cpu = time.perf_counter() - t0, time.process_time() - cpu0
                assert sum(r is not None for r in results) == len(range(0, sensors, 2))
                readdirs, connections = server.readdirs, server.connections

                sftp = await link.session()
                sem = asyncio.Semaphore(64)

                async def stat(p: str) -> bool:
                    async with sem:
                        try:
                            await sftp.stat(p)
                            return True
                        except Exception:
                            return False

                t0, cpu0 = time.perf_counter(), time.process_time()
                await asyncio.gather(*(stat(p) for p in paths))
                stat_s, stat_cpu = time.perf_counter() - t0, time.process_time() - cpu0
            finally:
                await ctx.aclose()

            # A new SSH connection per check, one at a time, as a naive sensor does.
            t0 = time.perf_counter()
            for p in paths[:per_connection_sample]:
                one = CheckContext()
                try:
                    await SFTPFileTrigger(path=p, conn_id="bench_sftp").poke(one)
                finally:
                    await one.aclose()
            per_conn_s = (time.perf_counter() - t0) / per_connection_sample
        finally:
            if isinstance(server, AsyncSFTPServer):
                await server.stop()
            else:
                server.stop()
    return {
        "server": kind,
        "sensors": sensors,
        "directories": 1,
        "batched": {
            "cycle_seconds": round(batched_s, 4),
            "client_cpu_s": round(batched_cpu, 4),
            "readdirs_per_cycle": readdirs,
            "ssh_connections_opened_in_cycle": connections,
            "checks_per_second": round(sensors / batched_s),
        },
        "stat_per_file_one_connection": {
            "cycle_seconds": round(stat_s, 4),
            "client_cpu_s": round(stat_cpu, 4),
            "requests_per_cycle": sensors,
            "checks_per_second": round(sensors / stat_s),
        },
        "new_connection_per_check": {
            "sampled_checks": per_connection_sample,
            "seconds_per_check": round(per_conn_s, 4),
            "checks_per_second": round(1 / per_conn_s, 1),
            "cycle_seconds_estimated": round(per_conn_s * sensors, 2),
        },
    }


def _sshd_version() -> str:
    out = subprocess.run(["/usr/sbin/sshd", "-V"], capture_output=True, text=True)
    return (out.stderr or out.stdout).split(",")[0].strip()


# -- report --------------------------------------------------------------------------------


def plot(doc: dict) -> Path:
    s3, sftp = doc["s3"], doc["sftp"]
    fig, (ax1, ax2, ax3) = subplots(3, width=5.0)
    labels = ["batched\n(listing per prefix)", "unbatched\n(HEAD per key)"]
    reqs = [s3["batched"]["requests_per_cycle"], s3["unbatched_head_per_key"]["requests_per_cycle"]]
    bars = ax1.bar(labels, reqs, color=["tab:green", "tab:red"])
    ax1.set_yscale("log")
    ax1.set_ylabel("S3 requests per cycle (log)")
    ax1.set_title(f"S3: {s3['sensors']:,} sensors, {s3['prefixes']} prefixes")
    ax1.bar_label(bars, labels=[f"{r:,}" for r in reqs])
    secs = [
        s3["batched"]["cycle_seconds_median"],
        s3["unbatched_head_per_key"]["cycle_seconds_median"],
    ]
    cpu = [
        s3["batched"]["client_cpu_s_per_cycle"],
        s3["unbatched_head_per_key"]["client_cpu_s_per_cycle"],
    ]
    x = range(2)
    ax2.bar([i - 0.2 for i in x], secs, width=0.4, label="cycle wall time")
    ax2.bar([i + 0.2 for i in x], cpu, width=0.4, label="client CPU")
    ax2.set_xticks(list(x), labels)
    ax2.set_ylabel("seconds per cycle")
    ax2.set_title("S3: time per cycle (moto on 127.0.0.1)")
    ax2.legend()
    modes = ["one listing", "stat per file", "connection\nper check (est.)"]
    times = [
        sftp["batched"]["cycle_seconds"],
        sftp["stat_per_file_one_connection"]["cycle_seconds"],
        sftp["new_connection_per_check"]["cycle_seconds_estimated"],
    ]
    bars = ax3.bar(modes, times, color=["tab:green", "tab:orange", "tab:red"])
    ax3.set_yscale("log")
    ax3.set_ylabel("seconds per cycle (log)")
    ax3.set_title(f"SFTP: {sftp['sensors']:,} sensors, one dir ({sftp['server'].split()[0]})")
    ax3.bar_label(bars, labels=[f"{t:.3g} s" for t in times])
    fig.suptitle(calibration.caption(doc), fontsize=9)
    return save_figure(fig, "batching")


async def main_async(args: argparse.Namespace) -> dict:
    doc = result_document(
        "batching",
        sys.argv[1:],
        {
            "sensors": args.sensors,
            "prefixes": args.prefixes,
            "cycles": args.cycles,
            "head_cycles": args.head_cycles,
            "triggerer_sensors": args.triggerer_sensors,
            "interval": args.interval,
            "sftp_sensors": args.sftp_sensors,
            "batch_size": BATCH_SIZE,
            "concurrency": CONCURRENCY,
        },
        Path(tempfile.gettempdir()),
    )
    with MachineLoad() as load:
        s3 = await s3_benchmark(
            args.sensors,
            args.prefixes,
            args.cycles,
            args.head_cycles,
            args.triggerer_sensors,
            args.interval,
        )
        sftp = await sftp_benchmark(args.sftp_sensors, args.connection_sample)
    batched = s3["batched"]["requests_per_cycle"]
    unbatched = s3["unbatched_head_per_key"]["requests_per_cycle"]
    doc.update(
        {
            "sensors": s3["sensors"],
            "requests_per_cycle_batched": batched,
            "requests_per_cycle_unbatched": unbatched,
            "request_reduction": round(unbatched / batched, 1),
            "cycle_seconds_batched": s3["batched"]["cycle_seconds_median"],
            "cycle_seconds_unbatched": s3["unbatched_head_per_key"]["cycle_seconds_median"],
            "s3": s3,
            "sftp": sftp,
            "run_load": load.summary,
        }
    )
    return doc


def headline(doc: dict[str, Any]) -> dict[str, float | None]:
    """One run's headline figures."""
    sftp = doc["sftp"]
    return {
        "requests_per_cycle_batched": doc["requests_per_cycle_batched"],
        "requests_per_cycle_unbatched": doc["requests_per_cycle_unbatched"],
        "cycle_seconds_batched": doc["cycle_seconds_batched"],
        "cycle_seconds_unbatched": doc["cycle_seconds_unbatched"],
        "sftp_cycle_seconds_batched": sftp["batched"]["cycle_seconds"],
        "sftp_checks_per_second_new_connection": sftp["new_connection_per_check"][
            "checks_per_second"
        ],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batching", description=__doc__)
    p.add_argument("--sensors", type=int, default=10_000)
    p.add_argument("--prefixes", type=int, default=10)
    p.add_argument("--cycles", type=int, default=5, help="batched cycles measured")
    p.add_argument("--head-cycles", type=int, default=2, help="unbatched cycles measured")
    p.add_argument(
        "--triggerer-sensors", type=int, default=10_000, help="0 to skip the end-to-end part"
    )
    p.add_argument("--interval", type=float, default=5.0, help="poke interval end to end (s)")
    p.add_argument("--sftp-sensors", type=int, default=1000)
    p.add_argument("--connection-sample", type=int, default=30)
    calibration.add_repeats_argument(p)
    args = p.parse_args(argv)
    with calibration.Recording(Path(tempfile.gettempdir())) as rec:
        docs = rec.repeat(args.repeats, lambda i: asyncio.run(main_async(args)), headline)
    # The run with the median batched cycle gives the details; each headline figure is
    # its median over the runs.
    doc = docs[rec.kept("cycle_seconds_batched")]
    doc.update(rec.medians())
    doc.update(rec.fields())
    path = write_json("batching", doc)
    png = plot(doc)
    s3, sftp = doc["s3"], doc["sftp"]
    print_table(
        "batching",
        [
            ("S3 sensors / prefixes", f"{s3['sensors']:,} / {s3['prefixes']}"),
            ("S3 requests per cycle, batched", f"{doc['requests_per_cycle_batched']:,}"),
            ("S3 requests per cycle, HEAD per key", f"{doc['requests_per_cycle_unbatched']:,}"),
            ("reduction", f"{doc['request_reduction']:,}x"),
            ("S3 cycle, batched", f"{doc['cycle_seconds_batched']:.3f} s"),
            ("S3 cycle, HEAD per key", f"{doc['cycle_seconds_unbatched']:.2f} s"),
            (
                "S3 client CPU per cycle (batched / HEAD)",
                f"{s3['batched']['client_cpu_s_per_cycle']:.3f} / "
                f"{s3['unbatched_head_per_key']['client_cpu_s_per_cycle']:.2f} s",
            ),
            *(
                [
                    (
                        "through the triggerer: S3 requests per cycle",
                        f"{s3['through_triggerer']['requests_per_cycle']:g} "
                        f"({s3['through_triggerer']['sensors']:,} deferred sensors)",
                    ),
                    (
                        "through the triggerer: all keys land -> run ends",
                        f"{s3['through_triggerer']['seconds_from_all_keys_landing_to_run_end']} s",
                    ),
                ]
                if s3["through_triggerer"]
                else []
            ),
            ("SFTP server", sftp["server"]),
            (
                "SFTP cycle, one listing",
                f"{sftp['batched']['cycle_seconds'] * 1000:.1f} ms "
                f"({sftp['batched']['readdirs_per_cycle']} readdir, "
                f"{sftp['batched']['ssh_connections_opened_in_cycle']} new connections)",
            ),
            (
                "SFTP cycle, stat per file",
                f"{sftp['stat_per_file_one_connection']['cycle_seconds'] * 1000:.0f} ms",
            ),
            (
                "SFTP, connection per check",
                f"{sftp['new_connection_per_check']['checks_per_second']} checks/s",
            ),
            *calibration.repeat_rows(doc["repeats"]),
            calibration.calibration_row(doc["calibration"]),
            load_row(doc["load"]),
        ],
        caption=f"{path.relative_to(REPO)}, {png.relative_to(REPO)}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
