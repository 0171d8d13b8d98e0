"""Headless Chromium for the web page's tests: found (skipped outside CI if missing), and one
page driven over the DevTools protocol through aiohttp's websocket."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support.helpers import async_wait_until

# This machine's network is closed: without the background-networking flags Chromium's
# own connections are refused at every start.
HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,900",
)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.path.exists("/usr/bin/chromium"):
        found = "/usr/bin/chromium"
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium); not CI, so skipped")
    return found


class DevTools:
    """One page of a headless Chromium, driven over the DevTools protocol (a websocket)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.last_id = 0

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.last_id += 1
        await self.ws.send_json({"id": self.last_id, "method": method, "params": params})
        async for msg in self.ws:
            answer = json.loads(msg.data)
            if answer.get("id") == self.last_id:  # anything else is an event: not asked for
                if "error" in answer:
                    raise AssertionError(f"{method}: {answer['error']}")
                return dict(answer["result"])
        raise AssertionError(f"{method}: the browser closed the connection")

    async def eval(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def eval_when(self, expression: str, what: str) -> Any:
        """``expression``'s value once it is truthy on a page parsed to its end; while the
        page loads, the expression may fail (no document yet, or the one being left): that
        only means not yet. Judged on a half-parsed page, a list of rows read too early
        would be short (a grid once lost its last row so)."""
        whole = f"document.readyState === 'complete' ? ({expression}) : null"

        async def value() -> Any:
            with contextlib.suppress(AssertionError):
                return await self.eval(whole)
            return None

        return await async_wait_until(value, what=what)

    async def click(self, x: float, y: float) -> None:
        """A left click at (x, y) in the page's coordinates, as a person's mouse makes it."""
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )

    async def click_on(self, selector: str) -> None:
        """A click in the middle of the first element ``selector`` finds, once it is there."""
        x, y = await self.eval_when(
            f"""(() => {{
                const el = document.querySelector({json.dumps(selector)});
                if (!el) return null;
                el.scrollIntoView({{block: "center"}});
                const r = el.getBoundingClientRect();
                return [r.x + r.width / 2, r.y + r.height / 2];
            }})()""",
            selector,
        )
        await self.click(x, y)


@contextlib.asynccontextmanager
async def devtools(tmp: Path, url: str) -> AsyncIterator[DevTools]:
    profile = tmp / "chromium-devtools"
    shutil.rmtree(profile, ignore_errors=True)  # a stale DevToolsActivePort would mislead
    proc = subprocess.Popen(
        [
            chromium(),
            *HEADLESS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",  # Chromium picks one and writes it in the profile
            url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        port = await async_wait_until(
            lambda: port_file.exists() and port_file.read_text().split("\n")[0],
            what="Chromium's DevTools port",
        )
        async with aiohttp.ClientSession() as http:

            async def pages() -> list[dict[str, Any]]:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    return [t for t in await r.json() if t["type"] == "page"]

            [page] = await async_wait_until(pages, what="Chromium's page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield DevTools(ws)
    finally:
        proc.terminate()
        proc.wait(20)
