"""HttpTrigger against a real aiohttp server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import secrets

import pytest
from aiohttp import web
from pydantic import ValidationError
from support.helpers import async_wait_until
from support.servers import all_events_text, run_dag, task_log

from executor import DAG
from triggerer.settling import TRANSIENT
from triggers.base import TransientError, TriggerEvent
from triggers.checking import CheckContext
from triggers.connections import UnknownConnection
from triggers.http import HttpCheckError, HttpTrigger

PASSWORD = "pw-" + secrets.token_hex(8)


class Api:
    """A small job API: /job reports a state the test flips; plus fault routes."""

    def __init__(self) -> None:
        self.state = "running"
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Api:
        app = web.Application(middlewares=[self._count])
        app.router.add_get("/job", self._job)
        app.router.add_get("/status/{code}", self._status)
        app.router.add_get("/moved", self._redirect("/job"))
        app.router.add_get("/loop", self._redirect("/loop"))
        app.router.add_get("/slow", self._slow)
        app.router.add_get("/text", self._text)
        app.router.add_get("/private/job", self._private)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _count(self, request, handler):
        self.requests += 1
        return await handler(request)

    async def _job(self, request):
        return web.json_response({"job": {"state": self.state, "steps": [{"ok": True}]}})

    @staticmethod
    def _redirect(to: str):
        async def handler(request):
            raise web.HTTPFound(to)

        return handler

    async def _text(self, request):
        return web.Response(text="not json")

    async def _status(self, request):
        return web.Response(status=int(request.match_info["code"]), text="status")

    async def _slow(self, request):
        await asyncio.sleep(2)
        return web.json_response({})

    async def _private(self, request):
        want = "Basic " + base64.b64encode(f"robot:{PASSWORD}".encode()).decode()
        if request.headers.get("Authorization") != want:
            return web.Response(status=401)
        return await self._job(request)


@pytest.fixture
async def api():
    server = await Api().start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def ctx():
    c = CheckContext()
    try:
        yield c
    finally:
        await c.aclose()


async def test_status_and_json_predicate(api, ctx):
    job = HttpTrigger(url=f"{api.base}/job", json_predicate={"path": "job.state", "equals": "done"})
    assert await job.poke(ctx) is None
    api.state = "done"
    event = await job.poke(ctx)
    assert isinstance(event, TriggerEvent)
    assert event.payload["status"] == 200 and event.payload["json"]["job"]["state"] == "done"

    exists = HttpTrigger(
        url=f"{api.base}/job", json_predicate={"path": "job.steps.0.ok", "exists": True}
    )
    assert await exists.poke(ctx) is not None
    missing = HttpTrigger(
        url=f"{api.base}/job", json_predicate={"path": "job.steps.3", "exists": True}
    )
    assert await missing.poke(ctx) is None
    assert await HttpTrigger(url=f"{api.base}/status/404").poke(ctx) is None  # not there yet
    assert await HttpTrigger(url=f"{api.base}/status/204", expected_status=[200, 204]).poke(ctx)
    not_json = HttpTrigger(url=f"{api.base}/text", json_predicate={"path": "a", "exists": True})
    assert await not_json.poke(ctx) is None
    plain = await HttpTrigger(url=f"{api.base}/text").poke(ctx)
    assert plain.payload == {"url": f"{api.base}/text", "status": 200}


async def test_one_shared_session(api, ctx):
    t = HttpTrigger(url=f"{api.base}/job")
    await t.poke(ctx)
    session = ctx._shared["http:session"]
    await HttpTrigger(url=f"{api.base}/status/200").poke(ctx)
    assert ctx._shared["http:session"] is session and not session.closed


async def test_redirects_followed_or_not(api, ctx):
    assert await HttpTrigger(url=f"{api.base}/moved").poke(ctx) is not None
    assert await HttpTrigger(url=f"{api.base}/moved", follow_redirects=False).poke(ctx) is None
    assert await HttpTrigger(
        url=f"{api.base}/moved", follow_redirects=False, expected_status=302
    ).poke(ctx)
    with pytest.raises(HttpCheckError, match="too many redirects"):
        await HttpTrigger(url=f"{api.base}/loop").poke(ctx)


async def test_server_errors_slowness_and_down_are_transient(api, ctx):
    for code in (500, 502, 503, 429):
        with pytest.raises(TransientError, match=f"answered {code}"):
            await HttpTrigger(url=f"{api.base}/status/{code}").poke(ctx)
    with pytest.raises(TransientError, match=r"no answer within 0\.3 s"):
        await HttpTrigger(url=f"{api.base}/slow", timeout=0.3).poke(ctx)
    await api.stop()
    with pytest.raises(TransientError):
        await HttpTrigger(url=f"{api.base}/job").poke(ctx)


async def test_credentials_through_a_connection(api, ctx, monkeypatch):
    monkeypatch.setenv("SLOTLESS_CONN_API", f"http://robot:{PASSWORD}@127.0.0.1:{api.port}")
    monkeypatch.setenv("SLOTLESS_CONN_APIBAD", f"http://robot:nope@127.0.0.1:{api.port}")
    t = HttpTrigger(url="private/job", conn_id="api")
    assert (await t.poke(ctx)).payload["json"]["job"]["state"] == "running"
    assert PASSWORD not in t.describe() and PASSWORD not in repr(t.serialize())
    with pytest.raises(HttpCheckError, match="answered 401: the server refused connection") as e:
        await HttpTrigger(url="/private/job", conn_id="apibad").poke(ctx)
    assert not isinstance(e.value, TRANSIENT)
    with pytest.raises(UnknownConnection):
        await HttpTrigger(url="/job", conn_id="nowhere").poke(ctx)


def test_bad_input_is_refused():
    with pytest.raises(ValidationError, match="must not carry credentials"):
        HttpTrigger(url="http://u:p@host/x")
    with pytest.raises(ValidationError, match="only http and https"):
        HttpTrigger(url="ftp://host/x")
    with pytest.raises(ValidationError, match="is relative"):
        HttpTrigger(url="/x")
    with pytest.raises(ValidationError, match="needs 'equals'"):
        HttpTrigger(url="http://h/x", json_predicate={"path": "a"})
    with pytest.raises(ValidationError):
        HttpTrigger(url="http://h/x", json_predicate={"path": "a", "equals": 1, "code": "x"})
    t = HttpTrigger(url="http://h/x?token=abc")
    assert "abc" not in t.describe()


# -- end to end ------------------------------------------------------------------------------


def sensor_dag(trigger: HttpTrigger, timeout: float = 30) -> DAG:
    dag = DAG("http_" + secrets.token_hex(3))
    wait = dag.sensor("wait", trigger, mode="deferrable", timeout=timeout)

    @dag.task(parents=[wait])
    def use(ctx):
        return ctx.inputs["wait"]["json"]["job"]["state"]

    return dag


async def test_e2e_sensor_fires_when_the_job_is_done(api, store):
    dag = sensor_dag(
        HttpTrigger(
            url=f"{api.base}/job",
            json_predicate={"path": "job.state", "equals": "done"},
            poke_interval=0.2,
        )
    )

    async def finish(run_id: str) -> None:
        await async_wait_until(lambda: api.requests >= 2, what="two checks")
        api.state = "done"

    run_id, info = await run_dag(store, dag, during=finish)
    assert info["state"] == "SUCCESS", await all_events_text(store, run_id)
    assert "trigger fired: GET" in await task_log(store, run_id, "wait")


async def test_e2e_server_down_retried_until_timeout(api, store):
    await api.stop()
    dag = sensor_dag(HttpTrigger(url=f"{api.base}/job", poke_interval=0.2), timeout=3)
    run_id, info = await run_dag(store, dag)
    assert info["state"] == "FAILED"
    log = await task_log(store, run_id, "wait")
    assert "failed (TransientError" in log and log.count("retry ") >= 2
    assert "sensor timeout" in log
