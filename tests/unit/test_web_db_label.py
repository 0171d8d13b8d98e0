"""The page's header names the database as it was given: a relative SQLite URL stays
relative (the screenshots in docs/images/ depend on it, and a shared screenshot or page
should not tell the machine's folders)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from executor.store import open_store
from slotless.web import open_for_reading, safe_url
from slotless.web.app import make_app


async def test_a_relative_database_is_named_relative_in_every_pages_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    await (await open_store("sqlite:///demo.db")).close()  # what a worker would have created
    store = await open_for_reading("sqlite:///demo.db")  # as `slotless ui --db` opens it
    try:
        assert (tmp_path / "demo.db").exists()  # relative to the current folder
        app = make_app(store, db_label=safe_url(store.url), token="alice:admin:SECRET")
        async with TestClient(TestServer(app)) as client:
            for page in ("/", "/dags", "/runs", "/waits", "/needs-you", "/login"):
                r = await client.get(page)
                html = await r.text()
                assert r.status == 200, (page, html[-300:])
                assert '<span class="db">sqlite:///demo.db</span>' in html, page
                assert str(tmp_path) not in html, page
    finally:
        await store.close()
