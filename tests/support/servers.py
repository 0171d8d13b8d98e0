"""Real servers on 127.0.0.1 for the trigger tests and the batching benchmark.

* :class:`MotoS3Server` - moto's ThreadedMotoServer on a free port, wrapped so that it
  counts the requests it receives (and can be told to answer with errors or slowly).
* :class:`AsyncSFTPServer` - an asyncssh SFTP server with generated keys, counting
  connections, directory listings and stats.
* :class:`OpenSSHServer` - Debian's ``/usr/sbin/sshd`` on a high port with its own
  sshd_config, host key and authorized_keys in a temp dir; its sftp subsystem logs every
  ``opendir`` so listings can be counted too.
* :func:`run_dag` - a real DAG run: a worker and a triggerer in the current event loop.

``python -m support.servers moto`` serves a counting moto in its own process (it prints
its endpoint); the benchmark uses that so the client's CPU is measured alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from support.helpers import free_port, wait_until

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
COUNT_PATH = "/_slotless/requests"
SEED_PATH = "/_slotless/seed"


# -- S3: moto's server, counting ---------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    at: float = field(default_factory=time.time)
    target: str = ""  # X-Amz-Target: the operation of a JSON-protocol service (SQS)

    @property
    def operation(self) -> str:
        """The S3 operation, roughly: enough to tell listings from HEADs and GETs; an SQS
        one as ``sqs:ReceiveMessage``."""
        if self.target.startswith("AmazonSQS."):
            return "sqs:" + self.target.split(".", 1)[1]
        if self.method == "HEAD":
            return "HeadObject" if self.path.count("/") > 1 else "HeadBucket"
        if self.method == "GET" and "list-type" in self.query:
            return "ListObjectsV2"
        if self.method == "GET" and self.path.count("/") <= 1 and self.path.strip("/"):
            return "ListObjects"
        return f"{self.method} {self.path}"


@dataclass
class _Faults:
    status: int | None = None  # answer every S3 request with this status ...
    code: str = "SlowDown"  # ... and this error code
    delay: float = 0.0  # seconds to wait before answering


class _Counting:
    """WSGI middleware in front of moto: records each request, injects faults."""

    def __init__(self, app: Any, owner: MotoS3Server) -> None:
        self.app = app
        self.owner = owner

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path in (COUNT_PATH, SEED_PATH):  # for a server in another process
            import json

            if path == SEED_PATH:
                size = int(environ.get("CONTENT_LENGTH") or 0)
                spec = json.loads(environ["wsgi.input"].read(size))
                self.owner.seed(spec["bucket"], spec["keys"], spec.get("body", "x").encode())
            elif environ["REQUEST_METHOD"] == "DELETE":
                self.owner.reset()
            body = json.dumps(self.owner.counts()).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if path.startswith("/moto-api"):
            return self.app(environ, start_response)
        req = Request(
            environ["REQUEST_METHOD"],
            path,
            parse_qs(environ.get("QUERY_STRING", ""), True),
            target=environ.get("HTTP_X_AMZ_TARGET", ""),
        )
        with self.owner.lock:
            self.owner.requests.append(req)
        faults = self.owner.faults
        if faults.delay:
            time.sleep(faults.delay)
        if faults.status is not None:
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{faults.code}</Code>'
                f"<Message>injected by the test</Message></Error>"
            ).encode()
            start_response(
                f"{faults.status} Injected",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [body]
        return self.app(environ, start_response)


class MotoS3Server:
    """moto's ThreadedMotoServer on 127.0.0.1, counting what it receives.

    Data lives in moto's process-wide backends, so a restart on the same port keeps the
    buckets; tests use their own bucket names.
    """

    def __init__(self, port: int = 0) -> None:
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer

        owner = self

        class _Threaded(ThreadedMotoServer):
            def _server_entry(self) -> None:
                from moto.moto_server.werkzeug_app import (
                    DomainDispatcherApplication,
                    MotoRequestHandler,
                    create_backend_app,
                )
                from werkzeug.serving import make_server

                class Quiet(MotoRequestHandler):
                    def log_request(self, *args: Any, **kwargs: Any) -> None:
                        pass  # one line per request would drown the test output

                app = _Counting(DomainDispatcherApplication(create_backend_app), owner)
                self._server = make_server(
                    self._ip_address, self._port, app, True, request_handler=Quiet
                )
                self._server_ready_event.set()
                self._server.serve_forever()

        self._cls = _Threaded
        self.port = port
        self.lock = threading.Lock()
        self.requests: list[Request] = []
        self.faults = _Faults()
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3Server:
        self._server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def restart(self) -> None:
        """Back up on the same port (after :meth:`stop`)."""
        self.start()

    # counting
    def reset(self) -> None:
        with self.lock:
            self.requests.clear()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.lock:
            for r in self.requests:
                out[r.operation] = out.get(r.operation, 0) + 1
        return out

    def count(self, operation: str | None = None) -> int:
        with self.lock:
            return sum(1 for r in self.requests if operation in (None, r.operation))

    # moto's own switches
    def enforce_auth(self, on: bool) -> None:
        """Make moto check credentials (unknown keys refused) or accept anything again."""
        import urllib.request

        req = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth",
            data=b"0" if on else b"inf",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    # test data
    def client(self, key: str = "testing", secret: str = "testing") -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
        )

    def make_bucket(self, bucket: str, keys: Iterable[str] = (), body: bytes = b"x") -> None:
        """Create ``bucket`` with ``keys`` (not counted: setup is not the system under test)."""
        self.client().create_bucket(Bucket=bucket)
        self.seed(bucket, keys, body)
        self.reset()

    @staticmethod
    def seed(bucket: str, keys: Iterable[str], body: bytes = b"x") -> None:
        """Write objects straight into moto's backend: thousands a second, for setup only."""
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for key in keys:
            backend.put_object(bucket, key, body)

    def put(self, bucket: str, key: str, body: bytes = b"x") -> None:
        before = len(self.requests)
        self.client().put_object(Bucket=bucket, Key=key, Body=body)
        with self.lock:  # leave the counters as they were
            del self.requests[before : before + 1]


def s3_conn_uri(endpoint: str, key: str = "testing", secret: str = "testing") -> str:
    return (
        f"s3://{quote(key, safe='')}:{quote(secret, safe='')}@"
        f"?endpoint_url={quote(endpoint, safe='')}&region_name=us-east-1&max_attempts=1"
        "&connect_timeout=2&read_timeout=5"
    )


def serve_moto_forever() -> None:
    """``python -m support.servers moto``: a counting moto in this process until killed."""
    server = MotoS3Server().start()
    print(server.endpoint, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    server.stop()


# -- SFTP: asyncssh's server ---------------------------------------------------------------


@dataclass
class SSHKeys:
    """A client key pair and a host key, written under ``directory``."""

    directory: Path
    client_key: Path = field(init=False)
    client_pub: str = field(init=False)
    host_key: Path = field(init=False)
    host_pub: str = field(init=False)

    def __post_init__(self) -> None:
        import asyncssh

        self.directory.mkdir(parents=True, exist_ok=True)
        ck = asyncssh.generate_private_key("ssh-ed25519")
        hk = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = self.directory / "id_ed25519"
        self.host_key = self.directory / "ssh_host_ed25519_key"
        ck.write_private_key(str(self.client_key))
        hk.write_private_key(str(self.host_key))
        os.chmod(self.client_key, 0o600)
        os.chmod(self.host_key, 0o600)
        self.client_pub = ck.export_public_key().decode()
        self.host_pub = hk.export_public_key().decode()
        (self.directory / "authorized_keys").write_text(self.client_pub)
        (self.directory / "ssh_host_ed25519_key.pub").write_text(self.host_pub)

    def other_client_key(self) -> Path:
        """A key the server does not know (for "credentials refused")."""
        import asyncssh

        path = self.directory / "stranger_ed25519"
        if not path.exists():
            asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(path))
            os.chmod(path, 0o600)
        return path

    def known_hosts(self, port: int) -> Path:
        path = self.directory / f"known_hosts_{port}"
        path.write_text(f"[127.0.0.1]:{port} {self.host_pub}")
        return path


class AsyncSFTPServer:
    """An asyncssh SFTP server on 127.0.0.1, chrooted to ``root``, counting its work.

    Accepts the generated client key, or ``user``/``password``. Runs in the caller's event
    loop; :meth:`stop` also drops the open connections (the server "goes away").
    """

    def __init__(self, root: Path, keys: SSHKeys, user: str = "tester", password: str = "pw"):
        self.root = root
        self.keys = keys
        self.user = user
        self.password = password
        self.port = 0
        self.connections = 0
        self.readdirs = 0
        self.stats = 0
        self._acceptor: Any = None
        self._open: set[Any] = set()

    def path(self, rel: str) -> str:
        """The path a client uses for ``rel`` (the server is chrooted)."""
        return "/" + rel.lstrip("/")

    def local(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def reset(self) -> None:
        self.connections = self.readdirs = self.stats = 0

    async def start(self) -> AsyncSFTPServer:
        import asyncssh

        owner = self

        class Server(asyncssh.SSHServer):
            def connection_made(self, conn: Any) -> None:
                owner.connections += 1
                owner._open.add(conn)

            def connection_lost(self, exc: Exception | None) -> None:
                pass

            def password_auth_supported(self) -> bool:
                return True

            def validate_password(self, username: str, password: str) -> bool:
                return username == owner.user and password == owner.password

        class SFTP(asyncssh.SFTPServer):
            def __init__(self, chan: Any) -> None:
                super().__init__(chan, chroot=str(owner.root).encode())

            async def scandir(self, path: bytes) -> Any:
                owner.readdirs += 1
                async for name in super().scandir(path):
                    yield name

            def stat(self, path: bytes) -> Any:
                owner.stats += 1
                return super().stat(path)

            def lstat(self, path: bytes) -> Any:
                owner.stats += 1
                return super().lstat(path)

        self._acceptor = await asyncssh.listen(
            "127.0.0.1",
            self.port,
            server_host_keys=[str(self.keys.host_key)],
            authorized_client_keys=asyncssh.import_authorized_keys(self.keys.client_pub),
            server_factory=Server,
            sftp_factory=SFTP,
            allow_scp=False,
        )
        self.port = self._acceptor.get_port()
        return self

    async def stop(self) -> None:
        if self._acceptor is None:
            return
        self._acceptor.close()
        for conn in list(self._open):
            conn.abort()
        self._open.clear()
        await self._acceptor.wait_closed()
        self._acceptor = None

    def conn_uri(self, *, password: str | None = None, key_file: Path | None = None) -> str:
        """``sftp://`` URI: the generated key by default, or a password."""
        if password is not None:
            pw = quote(password, safe="")
            return f"sftp://{self.user}:{pw}@127.0.0.1:{self.port}?known_hosts=none"
        key = key_file or self.keys.client_key
        kh = self.keys.known_hosts(self.port)
        return f"sftp://{self.user}@127.0.0.1:{self.port}?key_file={key}&known_hosts={kh}"


# -- SFTP: OpenSSH's sshd -------------------------------------------------------------------


def sshd_available() -> bool:
    return all(os.access(p, os.X_OK) for p in (SSHD, SFTP_SERVER))


class OpenSSHServer:
    """Debian's sshd on a high port of 127.0.0.1 with its own config, keys and log.

    Logs in as the current user with the generated key; files are real absolute paths
    under ``root``. The sftp subsystem (OpenSSH's sftp-server) logs each ``opendir`` to a
    file, which :attr:`readdirs` counts.
    """

    def __init__(self, root: Path, keys: SSHKeys, workdir: Path) -> None:
        import getpass

        self.root = root
        self.keys = keys
        self.workdir = workdir
        self.user = getpass.getuser()
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "sshd.log"
        self.sftp_log = workdir / "sftp-server.log"
        self._log_base = 0
        self._sftp_base = 0

    def path(self, rel: str) -> str:
        return str(self.root / rel.lstrip("/"))

    def local(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def start(self) -> OpenSSHServer:
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privsep dir
        self.port = self.port or free_port()
        config = self.workdir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.keys.host_key}",
                    f"PidFile {self.workdir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.keys.directory / 'authorized_keys'}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",
                    "UsePAM no",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "LogLevel INFO",
                    # Run through the login shell, so its log can go to a file we read.
                    f"Subsystem sftp {SFTP_SERVER} -e -l VERBOSE 2>>{self.sftp_log}",
                    "",
                ]
            )
        )
        base = len(self._log())  # the log is appended to across restarts
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept by the child
        self.proc = proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_until(
            lambda: proc.poll() is not None or "Server listening" in self._log()[base:],
            timeout=15.0,
            what="sshd to listen",
        )
        if self.proc.poll() is not None:
            raise RuntimeError(f"sshd exited {self.proc.returncode}:\n{self._log()[-2000:]}")
        return self

    def stop(self) -> None:
        """Stop the daemon and every session it forked (the server goes away)."""
        if self.proc is None:
            return
        sessions = _descendants(self.proc.pid)  # before they are orphaned
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None
        for pid in sessions:  # each session runs in its own session id: end it by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def reset(self) -> None:
        self._log_base = len(self._log())
        self._sftp_base = self.sftp_log.stat().st_size if self.sftp_log.exists() else 0

    @property
    def readdirs(self) -> int:
        try:
            data = self.sftp_log.read_bytes()
        except FileNotFoundError:
            return 0
        return data[self._sftp_base :].count(b"opendir ")

    @property
    def connections(self) -> int:
        return self._log()[self._log_base :].count("Accepted publickey for")

    def conn_uri(self, *, key_file: Path | None = None) -> str:
        key = key_file or self.keys.client_key
        kh = self.keys.known_hosts(self.port)
        return f"sftp://{self.user}@127.0.0.1:{self.port}?key_file={key}&known_hosts={kh}"


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


# -- a real DAG run ------------------------------------------------------------------------


async def run_dag(
    store: Any,
    dag: Any,
    *,
    logical_date: date = date(2024, 1, 2),
    timeout: float = 60.0,
    slots: int = 4,
    run_id: str | None = None,
    during: Callable[[str], Any] | None = None,
    extra_dags: Iterable[Any] = (),
) -> tuple[str, dict[str, Any]]:
    """Create a run of ``dag`` and serve it with a worker and a triggerer in this loop.

    ``during(run_id)``, if given, is awaited alongside (e.g. to drop a file later);
    ``extra_dags`` are other DAGs the worker may run meanwhile.
    Returns the run id and its run row once the run has ended.
    """
    from executor.worker import Worker
    from triggerer.service import Triggerer, TriggererConfig

    run_id = await store.runs.create_run(dag, logical_date, run_id=run_id)
    config = TriggererConfig(lease_every=0.5, sync_every=0.1, timeouts_every=0.2, flush_every=0.02)
    triggerer = Triggerer(store.views, config=config)
    worker = Worker(
        store,
        slots=slots,
        dags={d.dag_id: d for d in (dag, *extra_dags)},
        poll_interval=0.05,
        on_defer=triggerer.poke,
    )

    async def ended() -> bool:
        info = await store.views.run_info(run_id)
        return info is not None and info["state"] != "RUNNING"

    sidecar = asyncio.create_task(triggerer.run())
    side = asyncio.create_task(during(run_id)) if during is not None else None
    try:
        await asyncio.wait_for(worker.run(until=ended), timeout)
        if side is not None:
            await asyncio.wait_for(side, timeout)
    finally:
        if side is not None and not side.done():
            side.cancel()
            await asyncio.gather(side, return_exceptions=True)
        triggerer.stop()
        await _stopped(sidecar)
    info = await store.views.run_info(run_id)
    return run_id, dict(info)


async def _stopped(sidecar: asyncio.Task[None], grace: float = 15.0) -> None:
    """Wait for the triggerer to stop; cancel it if one of its loops missed the stop.

    (On Python 3.11 ``asyncio.wait_for`` can swallow a cancellation that races its inner
    wait completing, which left a stopped triggerer waiting on that loop for ever.)
    """
    try:
        await asyncio.wait_for(asyncio.shield(sidecar), grace)
        return
    except TimeoutError:
        sidecar.cancel()
    try:
        await asyncio.wait_for(sidecar, grace)
    except asyncio.CancelledError:
        pass
    except TimeoutError:
        raise AssertionError(f"the triggerer did not stop, even cancelled: {sidecar}") from None
    import warnings

    warnings.warn("the triggerer missed stop() and had to be cancelled", stacklevel=2)


async def task_log(store: Any, run_id: str, task_id: str) -> str:
    """Every line of a task's log (transitions and check lines), one string."""
    lines = []
    for e in await store.views.task_log(run_id, task_id) or []:
        lines.append(f"{e['kind']} {e['from_state']}->{e['to_state']} {e['message']}")
    return "\n".join(lines)


async def all_events_text(store: Any, run_id: str) -> str:
    out = []
    for t in await store.views.run_tasks(run_id):
        out.append(await task_log(store, run_id, t["task_id"]))
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:] == ["moto"]:
        serve_moto_forever()
    else:
        sys.exit("usage: python -m support.servers moto")
