"""`slotless status --airflow`: reading running airflow-triggerers' /status, without
Airflow. Bad input is one line and exit 2; two instances are shown together."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from support.helpers import free_port

from slotless.cli import main


def _serving(body: bytes, content_type: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[list[ThreadingHTTPServer]]:
    made: list[ThreadingHTTPServer] = []
    yield made
    for s in made:
        s.shutdown()
        s.server_close()


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], servers: list[ThreadingHTTPServer]
) -> None:
    assert main(["status", "--airflow"]) == 2
    assert "--airflow needs --url" in _one_line(capsys)

    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["status", "--airflow", "--url", dead]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"slotless: error: cannot read {dead}/status"), line

    servers.append(_serving(b"<html>hello</html>", "text/html"))
    servers.append(_serving(json.dumps({"status": "ok"}).encode(), "application/json"))
    for s in servers:
        assert main(["status", "--airflow", "--url", _url(s)]) == 2
        assert "is not a slotless airflow-triggerer's status" in _one_line(capsys)


def _snapshot(job: int, path: str, tasks: list[str]) -> dict[str, Any]:
    return {
        "slotless": "airflow-triggerer",
        "format": 1,
        "job_id": job,
        "now": 0.0,
        "live": [7, 8],
        "triggers": len(tasks),
        "assigned": len(tasks),
        "pool": 5,
        "check_count": 1,
        "checks": [
            {
                "check": f"FileTrigger ({path!r}, False)",
                "kind": "file",
                "classpath": "airflow.providers.standard.triggers.file.FileTrigger",
                "key": repr(("file", path, False)),
                "checked_by": job,
                "waiting": len(tasks),
                "dags": {"d": len(tasks)},
                "since": 1.0,
                "checking_since": 1.0,
                "interval": 0.5,
                "fires_at": None,
                "last_check": 2.0,
                "last_result": "no match yet",
                "events": 0,
                "tasks": [
                    {"trigger_id": i, "dag_id": "d", "task_id": t, "run_id": "r", "map_index": -1}
                    for i, t in enumerate(tasks)
                ],
            }
        ],
        "recent": [],
    }


def test_two_instances_are_listed_together_by_check(
    capsys: pytest.CaptureFixture[str], servers: list[ThreadingHTTPServer]
) -> None:
    servers.append(
        _serving(json.dumps(_snapshot(7, "/a", ["t1", "t2"])).encode(), "application/json")
    )
    servers.append(_serving(json.dumps(_snapshot(8, "/b", ["t3"])).encode(), "application/json"))
    urls = [a for s in servers for a in ("--url", _url(s))]
    assert main(["status", "--airflow", *urls, "--tasks", "1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [i["job_id"] for i in shown["instances"]] == [7, 8]

    assert main(["status", "--airflow", *urls, "--tasks", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "held: 3 trigger rows in 2 checks" in out, out
    assert "d.t1 r -1 (trigger 0)" in out and "... and 1 more" in out, out
    assert "d.t2" not in out, out
    assert "TriggererJob 7" in out and "TriggererJob 8" in out, out
    # The check with more task instances waiting first.
    assert out.index("'/a'") < out.index("'/b'"), out
