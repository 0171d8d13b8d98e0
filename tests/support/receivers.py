"""Real local receivers for callbacks and notifications, each on its own thread and port.

* :class:`HttpReceiver`: an HTTP server that records every request's JSON body (a webhook,
  apprise's ``json://`` notifications, a callback that POSTs); it can answer 500 for a
  while (``fail_next``) to exercise retries.
* :class:`SmtpReceiver`: aiosmtpd, a real SMTP server, keeping every mail it receives
  (apprise's ``mailto://``).

Both are pytest fixtures (``http_receiver``, ``smtp_receiver``, registered in
tests/conftest.py); worker processes reach them over 127.0.0.1. Wait on them with
``receiver.wait_for(n)`` (a deadline, never a bare sleep)::

    def test_alert(http_receiver):
        url = http_receiver.json_url("alerts")      # json://127.0.0.1:PORT/alerts
        ...                                         # a DAG with notify=url fails a task
        [got] = http_receiver.wait_for(1)
        assert got.path == "/alerts" and "failure" in got.json["title"]
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass(frozen=True)
class Received:
    path: str
    json: Any  # the body parsed as JSON (None if it was not JSON)
    body: bytes
    at: float


class HttpReceiver:
    """Records each request's body; ``fail_next = n`` answers 500 to the next n."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.refused = 0  # requests answered 500 on purpose
        self.fail_next = 0
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._cond:
                    if receiver.fail_next > 0:
                        receiver.fail_next -= 1
                        receiver.refused += 1
                        status = 500
                    else:
                        try:
                            parsed = json.loads(body) if body else None
                        except ValueError:
                            parsed = None
                        receiver.received.append(Received(self.path, parsed, body, time.time()))
                        receiver._cond.notify_all()
                        status = 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_PUT = do_POST

            def log_message(self, *args: Any) -> None:  # quiet in the test output
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> HttpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def json_url(self, path: str = "notify") -> str:
        """An apprise URL that POSTs its notification as JSON here."""
        return f"json://127.0.0.1:{self.port}/{path}"

    def matching(self, pred: Callable[[Received], bool] | None = None) -> list[Received]:
        with self._cond:
            return [r for r in self.received if pred is None or pred(r)]

    def wait_for(
        self,
        n: int,
        pred: Callable[[Received], bool] | None = None,
        timeout: float = 60.0,
    ) -> list[Received]:
        """At least ``n`` requests (matching ``pred``) within ``timeout``, else fail naming them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                got = [r for r in self.received if pred is None or pred(r)]
                left = deadline - time.monotonic()
                if len(got) >= n or left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
        if len(got) < n:
            raise AssertionError(
                f"expected {n} requests within {timeout:g} s, got {len(got)}: "
                f"{[(r.path, r.json) for r in self.received]}"
            )
        return got


class SmtpReceiver:
    """aiosmtpd on its own thread; ``messages`` are the mails received, parsed."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[Message] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                msg = message_from_bytes(envelope.original_content or envelope.content)
                with receiver._cond:
                    receiver.messages.append(msg)
                    receiver._cond.notify_all()
                return "250 OK"

        self.port = free_port()
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def start(self) -> SmtpReceiver:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

    def mailto_url(self, to: str = "ops@example.com", sender: str = "slotless@example.com") -> str:
        """An apprise URL that sends its notification as mail here (plain SMTP, no login)."""
        return f"mailto://localhost:{self.port}?from={sender}&to={to}&mode=insecure"

    def wait_for(self, n: int, timeout: float = 60.0) -> list[Message]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.messages) < n and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(min(left, 0.5))
            got = list(self.messages)
        if len(got) < n:
            raise AssertionError(f"expected {n} mails within {timeout:g} s, got {len(got)}")
        return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unreachable_url(path: str = "notify") -> str:
    """A json:// URL nothing listens on (a port bound once, then closed)."""
    return f"json://127.0.0.1:{free_port()}/{path}"


def mail_text(msg: Message) -> str:
    """Subject and body of a received mail, as text."""
    parts = [str(msg.get("Subject", ""))]
    for part in msg.walk() if msg.is_multipart() else [msg]:
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            parts.append(payload.decode(errors="replace"))
    return "\n".join(parts)


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    r = HttpReceiver().start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def smtp_receiver() -> Iterator[SmtpReceiver]:
    r = SmtpReceiver().start()
    try:
        yield r
    finally:
        r.stop()
