"""SFTPFileTrigger against real SSH servers on 127.0.0.1: asyncssh's, and OpenSSH's sshd.

Every test runs against both. OpenSSH is skipped (saying why) only where Debian's
openssh-server is not installed and CI is not set; under CI=true a missing sshd fails.
"""

from __future__ import annotations

import os
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from support.helpers import async_wait_until
from support.servers import (
    AsyncSFTPServer,
    OpenSSHServer,
    SSHKeys,
    all_events_text,
    run_dag,
    sshd_available,
    task_log,
)

from executor import DAG
from triggerer.settling import TRANSIENT
from triggers.base import TransientError, TriggerEvent
from triggers.checking import CheckContext
from triggers.connections import UnknownConnection
from triggers.sftp import SFTPCheckError, SFTPFileTrigger

PASSWORD = "pw-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> SSHKeys:
    return SSHKeys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(params=["asyncssh", "openssh"])
async def server(request, tmp_path: Path, keys: SSHKeys, monkeypatch: pytest.MonkeyPatch):
    """A started SFTP server, and connection ``sf`` (key auth, host key checked) to it."""
    root = tmp_path / "root"
    root.mkdir()
    srv: AsyncSFTPServer | OpenSSHServer
    if request.param == "asyncssh":
        srv = await AsyncSFTPServer(root, keys, password=PASSWORD).start()
    else:
        if not sshd_available():
            if os.environ.get("CI") == "true":
                pytest.fail("CI=true but /usr/sbin/sshd is missing: .ci/run installs it")
            pytest.skip("OpenSSH's sshd is not installed (apt-get install openssh-server)")
        (tmp_path / "sshd").mkdir()
        srv = OpenSSHServer(root, keys, tmp_path / "sshd").start()
    monkeypatch.setenv("SLOTLESS_CONN_SF", srv.conn_uri())
    srv.reset()
    try:
        yield srv
    finally:
        if isinstance(srv, AsyncSFTPServer):
            await srv.stop()
        else:
            srv.stop()


async def stop(srv) -> None:
    if isinstance(srv, AsyncSFTPServer):
        await srv.stop()
    else:
        srv.stop()


async def start(srv) -> None:
    if isinstance(srv, AsyncSFTPServer):
        await srv.start()
    else:
        srv.start()


def touch(srv, rel: str, data: str = "x", mtime: float | None = None) -> None:
    p = srv.local(rel)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data)
    if mtime is not None:
        os.utime(p, (mtime, mtime))


# -- batching over one shared connection -------------------------------------------------


async def test_one_listing_per_directory_per_cycle_over_one_connection(server):
    present = set()
    for d in range(3):
        for f in range(0, 400, 2):
            touch(server, f"in{d}/f{f:03d}.csv")
            present.add(server.path(f"in{d}/f{f:03d}.csv"))
    triggers = [
        SFTPFileTrigger(path=server.path(f"in{d}/f{f:03d}.csv"), conn_id="sf")
        for d in range(3)
        for f in range(400)
    ]
    ctx = CheckContext()
    try:
        server.reset()
        # As the triggerer calls a batched class: at most 1,000 at once, concurrently.
        import asyncio

        parts = await asyncio.gather(
            SFTPFileTrigger.poke_many(triggers[:1000], ctx),
            SFTPFileTrigger.poke_many(triggers[1000:], ctx),
        )
        results = [r for p in parts for r in p]
        fired = {t.path for t, r in zip(triggers, results, strict=True) if r is not None}
        assert fired == present
        assert server.readdirs == 3  # one listing per directory, not 1,200 stats
        assert server.connections == 1

        touch(server, "in2/f001.csv")
        results = await SFTPFileTrigger.poke_many(triggers, ctx)
        assert results[800 + 1] is not None
        assert server.readdirs == 6 and server.connections == 1  # next cycle: same connection
        link = ctx._shared["sftp:sf"]
        assert link.connects == 1
    finally:
        await ctx.aclose()


async def test_globs_newer_than_and_missing_directories(server):
    old = time.time() - 3600
    touch(server, "drop/a.csv", mtime=old)
    touch(server, "drop/b.csv")
    touch(server, "drop/c.txt")
    server.local("drop/sub.csv").mkdir()  # a directory is not a file
    since = datetime.now(UTC) - timedelta(minutes=5)

    def t(rel: str, **kw) -> SFTPFileTrigger:
        return SFTPFileTrigger(path=server.path(rel), conn_id="sf", **kw)

    cases = {
        t("drop/*.csv"): ["drop/a.csv", "drop/b.csv"],
        t("drop/[ab].csv"): ["drop/a.csv", "drop/b.csv"],
        t("drop/?.txt"): ["drop/c.txt"],
        t("drop/*.csv", newer_than=since): ["drop/b.csv"],
        t("drop/a.csv", newer_than=since): None,
        t("drop/a.csv", newer_than=since.replace(tzinfo=None) - timedelta(hours=2)): ["drop/a.csv"],
        t("drop/sub.csv"): None,
        t("drop/*.json"): None,
        t("not-yet/*.csv"): None,  # the directory does not exist: not yet, not an error
    }
    ctx = CheckContext()
    try:
        results = await SFTPFileTrigger.poke_many(list(cases), ctx)
        for trig, result in zip(cases, results, strict=True):
            want = cases[trig]
            got = None if result is None else result.payload["paths"]
            assert got == (None if want is None else [server.path(w) for w in want]), trig.path
        assert (await t("drop/b.csv").poke(ctx)).payload["count"] == 1
    finally:
        await ctx.aclose()


def test_malformed_globs_are_refused_with_a_clear_message():
    for bad in ("/in/[abc.csv", "/in/a].csv", "/in/[].csv"):
        with pytest.raises(ValidationError, match="malformed glob"):
            SFTPFileTrigger(path=bad)
    with pytest.raises(ValidationError, match="file name only"):
        SFTPFileTrigger(path="/in/*/x.csv")
    with pytest.raises(ValidationError, match="must name a file"):
        SFTPFileTrigger(path="/in/")


def test_describe_names_the_connection_not_its_secrets():
    t = SFTPFileTrigger(path="/in/{{ ds }}.csv", conn_id="bank")
    assert t.describe() == "sftp://bank/in/{{ ds }}.csv"
    assert SFTPFileTrigger(path="in/x", conn_id="bank").describe() == "sftp://bank/~/in/x"


# -- faults ----------------------------------------------------------------------------------


async def test_refused_key_fails_with_a_clear_message(server, keys, monkeypatch):
    monkeypatch.setenv("SLOTLESS_CONN_SFBAD", server.conn_uri(key_file=keys.other_client_key()))
    ctx = CheckContext()
    try:
        (result,) = await SFTPFileTrigger.poke_many(
            [SFTPFileTrigger(path=server.path("x"), conn_id="sfbad")], ctx
        )
    finally:
        await ctx.aclose()
    assert isinstance(result, SFTPCheckError) and not isinstance(result, TRANSIENT)
    assert "refused the credentials" in str(result)


async def test_wrong_host_key_fails_with_a_clear_message(server, tmp_path, monkeypatch):
    import asyncssh

    stranger = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    kh = tmp_path / "kh"
    kh.write_text(f"[127.0.0.1]:{server.port} {stranger}")
    uri = server.conn_uri().rsplit("known_hosts=", 1)[0] + f"known_hosts={kh}"
    monkeypatch.setenv("SLOTLESS_CONN_SFMITM", uri)
    ctx = CheckContext()
    try:
        (result,) = await SFTPFileTrigger.poke_many(
            [SFTPFileTrigger(path=server.path("x"), conn_id="sfmitm")], ctx
        )
    finally:
        await ctx.aclose()
    assert isinstance(result, SFTPCheckError) and "host key" in str(result)


async def test_missing_key_file_is_a_configuration_error(server, tmp_path, monkeypatch):
    uri = server.conn_uri(key_file=tmp_path / "no-such-key")
    monkeypatch.setenv("SLOTLESS_CONN_SFNOKEY", uri)
    ctx = CheckContext()
    try:
        (result,) = await SFTPFileTrigger.poke_many(
            [SFTPFileTrigger(path=server.path("x"), conn_id="sfnokey")], ctx
        )
    finally:
        await ctx.aclose()
    assert isinstance(result, SFTPCheckError) and not isinstance(result, TRANSIENT)
    assert "cannot load the keys" in str(result)


async def test_password_auth_and_refused_password(tmp_path, keys, monkeypatch):
    # Against asyncssh's server only: the sshd under test allows keys only.
    server = await AsyncSFTPServer(tmp_path, keys, password=PASSWORD).start()
    touch(server, "p/x")
    monkeypatch.setenv("SLOTLESS_CONN_SFPW", server.conn_uri(password=PASSWORD))
    monkeypatch.setenv("SLOTLESS_CONN_SFPWBAD", server.conn_uri(password=PASSWORD + "-wrong"))
    ctx = CheckContext()
    try:
        ok, bad = await SFTPFileTrigger.poke_many(
            [
                SFTPFileTrigger(path=server.path("p/x"), conn_id="sfpw"),
                SFTPFileTrigger(path=server.path("p/x"), conn_id="sfpwbad"),
            ],
            ctx,
        )
    finally:
        await ctx.aclose()
        await server.stop()
    assert isinstance(ok, TriggerEvent)
    assert isinstance(bad, SFTPCheckError) and "refused the credentials" in str(bad)
    assert PASSWORD not in str(bad)


async def test_server_down_is_transient_then_one_reconnect(server):
    touch(server, "in/a.csv")
    trig = SFTPFileTrigger(path=server.path("in/a.csv"), conn_id="sf")
    ctx = CheckContext()
    try:
        assert isinstance((await SFTPFileTrigger.poke_many([trig], ctx))[0], TriggerEvent)
        link = ctx._shared["sftp:sf"]
        await stop(server)
        for _ in range(2):  # the lost connection, then refused reconnects
            (result,) = await SFTPFileTrigger.poke_many([trig], ctx)
            assert isinstance(result, TransientError), result
        await start(server)
        server.reset()
        results = [await trig.poke(ctx) for _ in range(3)]
        assert all(isinstance(r, TriggerEvent) for r in results)
        assert server.connections == 1  # reconnected once, then reused
        assert ctx._shared["sftp:sf"] is link and link.connects == 2
    finally:
        await ctx.aclose()


async def test_a_server_that_never_answers_is_transient(monkeypatch):
    """Accepts TCP but never speaks SSH (hung sshd, a black-holing proxy): a timeout."""
    import asyncio

    async def silent(reader, writer):
        await reader.read()  # until the client gives up

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv(
        "SLOTLESS_CONN_SFSLOW", f"sftp://u:p@127.0.0.1:{port}?known_hosts=none&connect_timeout=0.5"
    )
    ctx = CheckContext()
    try:
        started = time.monotonic()
        (result,) = await SFTPFileTrigger.poke_many(
            [SFTPFileTrigger(path="/x", conn_id="sfslow")], ctx
        )
        assert time.monotonic() - started < 5
    finally:
        await ctx.aclose()
        server.close()
    assert isinstance(result, TransientError), result
    assert "p@" not in str(result)  # the password is redacted


async def test_unknown_connection_is_not_transient():
    ctx = CheckContext()
    try:
        (result,) = await SFTPFileTrigger.poke_many(
            [SFTPFileTrigger(path="/x", conn_id="nowhere")], ctx
        )
    finally:
        await ctx.aclose()
    assert isinstance(result, UnknownConnection) and not isinstance(result, TRANSIENT)


# -- end to end ------------------------------------------------------------------------------


def sensor_dag(trigger: SFTPFileTrigger, timeout: float = 30.0) -> DAG:
    dag = DAG("sftp_" + secrets.token_hex(3))
    wait = dag.sensor("wait", trigger, mode="deferrable", timeout=timeout)

    @dag.task(parents=[wait])
    def use(ctx):
        return ctx.inputs["wait"]["paths"]

    return dag


async def test_e2e_sensor_fires_when_the_file_lands(server, store):
    dag = sensor_dag(
        SFTPFileTrigger(path=server.path("bank/{{ ds }}-*.csv"), conn_id="sf", poke_interval=0.2)
    )

    async def land(run_id: str) -> None:
        async def deferred() -> bool:
            rows = await store.views.run_tasks(run_id)
            return any(t["task_id"] == "wait" and t["state"] == "DEFERRED" for t in rows)

        await async_wait_until(deferred, what="the sensor to defer")
        await async_wait_until(lambda: server.connections >= 1, what="the first check")
        touch(server, "bank/2024-01-02-final.csv")

    run_id, info = await run_dag(store, dag, during=land, timeout=30)
    assert info["state"] == "SUCCESS", await all_events_text(store, run_id)
    log = await task_log(store, run_id, "wait")
    assert "sftp://sf" in log and "trigger fired" in log
    assert server.connections == 1


async def test_e2e_poke_mode_checks_in_the_worker_slot(server, store):
    dag = DAG("sftp_poke_" + secrets.token_hex(3))
    dag.sensor(
        "wait",
        SFTPFileTrigger(path=server.path("in/ready.flag"), conn_id="sf", poke_interval=0.2),
        mode="poke",
        timeout=30,
    )

    async def land(run_id: str) -> None:
        await async_wait_until(lambda: server.connections >= 2, what="two checks")
        touch(server, "in/ready.flag")

    run_id, info = await run_dag(store, dag, during=land)
    assert info["state"] == "SUCCESS", await all_events_text(store, run_id)


async def test_e2e_server_down_retried_logged_until_timeout(server, store):
    await stop(server)
    dag = sensor_dag(
        SFTPFileTrigger(path=server.path("in/x.csv"), conn_id="sf", poke_interval=0.2), timeout=3
    )
    run_id, info = await run_dag(store, dag, timeout=30)
    assert info["state"] == "FAILED"
    log = await task_log(store, run_id, "wait")
    assert "failed (TransientError: cannot connect over SSH" in log, log
    assert log.count("retry ") >= 2 and "sensor timeout" in log


async def test_e2e_refused_credentials_fail_the_task(server, keys, store, monkeypatch):
    monkeypatch.setenv("SLOTLESS_CONN_SFBAD", server.conn_uri(key_file=keys.other_client_key()))
    dag = sensor_dag(SFTPFileTrigger(path=server.path("x"), conn_id="sfbad"), timeout=600)
    run_id, info = await run_dag(store, dag, timeout=30)
    assert info["state"] == "FAILED"
    log = await task_log(store, run_id, "wait")
    assert "refused the credentials" in log and "sensor timeout" not in log
    assert PASSWORD not in await all_events_text(store, run_id)
