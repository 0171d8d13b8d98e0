"""A run's graph with its task groups folded, in headless Chromium against a real
`slotless ui`: a run of examples/task_groups.py (setup done halfway, one task RUNNING),
its groups folded one click at a time (``?fold=`` in the URL), each folded group one box
coloured as the grid colours a folded group's cell, the edges into and out of it drawn
once, and a click on the box unfolding it."""

from __future__ import annotations

import base64
import json
import shutil
from datetime import date
from pathlib import Path
from urllib.parse import quote

import pytest
from support.browser import devtools
from support.catalogued import catalogue_file
from support.exchanging import claim, complete
from support.helpers import REPO, attempt_of, sql
from support.ops import ui_process

from executor.loader import load_dag
from executor.outcomes import Succeeded
from executor.store import open_store
from slotless.web.dag_page import GROUP_STATE

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"


async def _half_run(url: str, path: Path) -> str:
    """A run whose roots succeeded and whose setup.make_batch is RUNNING (claimed, never
    completed): setup holds a SUCCESS and a RUNNING task, per_file waits."""
    store = await open_store(url)
    try:
        await catalogue_file(store, path)
        run_id = await store.runs.create_run(load_dag(str(path)), date(2026, 6, 1),
                                             dag_file=str(path))  # fmt: skip
        roots = await claim(store, "test", 10)
        assert sorted(r.task_id for r in roots) == ["list_files", "setup.check_quota"]
        outputs = {"list_files": '["a.csv", "b.csv"]', "setup.check_quota": "{}"}
        await complete(
            store, [Succeeded(**attempt_of(r), output_json=outputs[r.task_id]) for r in roots]
        )
        [batch] = await claim(store, "test", 1)
        assert batch.task_id == "setup.make_batch"
        return run_id
    finally:
        await store.close()


def drawn_js() -> str:
    """The graph as the page draws it: its tasks' and folded groups' boxes, and its edges."""
    return """document.readyState === 'complete' && document.querySelector('svg a') && {
        search: location.search,
        tasks: [...document.querySelectorAll('svg a[data-task]')].map(a => a.dataset.task),
        groups: Object.fromEntries([...document.querySelectorAll('svg a[data-group]')]
            .map(a => [a.dataset.group, a.dataset.state])),
        edges: document.querySelectorAll('svg path.edge').length,
        links: [...document.querySelectorAll('a[data-fold]')].map(a => a.dataset.fold),
    }"""


async def test_in_chromium_groups_fold_to_one_box_and_a_click_unfolds(tmp_path: Path):
    db = tmp_path / "groups.db"
    url = f"sqlite:///{db}"
    path = tmp_path / "task_groups.py"
    shutil.copy(REPO / "examples" / "task_groups.py", path)
    run_id = await _half_run(url, path)
    rows = sql(db, "SELECT task_id, state FROM task WHERE run_id = ? AND map_index = -1", run_id)
    states = {r["task_id"]: r["state"] for r in rows}
    rows = sql(db, "SELECT parent, child FROM edge WHERE run_id = ?", run_id)
    edges = {(r["parent"], r["child"]) for r in rows}

    def folded_edges(*groups: str) -> int:
        """How many edges the graph has with ``groups`` each drawn as one node."""

        def node(t: str) -> str:
            return next((g for g in groups if t.startswith(g + ".")), t)

        return len({(node(p), node(c)) for p, c in edges if node(p) != node(c)})

    def summary(group: str) -> str:
        """The grid's colour for a folded group: the first of its tasks' states in
        GROUP_STATE (what most needs a look)."""
        held = {s for t, s in states.items() if t.startswith(group + ".")}
        return next(s for s in GROUP_STATE if s in held)

    log = tmp_path / "ui.log"
    with ui_process(url, log, ready=f"/runs/{quote(run_id, safe='')}") as base:
        page_url = f"{base}/runs/{quote(run_id, safe='')}"
        async with devtools(tmp_path, page_url) as page:
            whole = await page.eval_when(drawn_js(), "the run's graph")
            assert sorted(whole["tasks"]) == sorted(states) and whole["groups"] == {}
            assert whole["edges"] == len(edges)
            assert whole["links"] == ["setup", "per_file", "per_file.checks"]

            # Fold setup, then per_file, by their links: each one box, its edges once.
            await page.click_on('a[data-fold="setup"]')
            one = await page.eval_when(
                f"(() => {{ const d = {drawn_js()}; return d && d.search === '?fold=setup'"
                " && d; })()",
                "setup folded",
            )
            assert one["groups"] == {"setup": summary("setup")} == {"setup": "RUNNING"}
            assert not any(t.startswith("setup.") for t in one["tasks"])
            assert one["edges"] == folded_edges("setup")
            await page.click_on('a[data-fold="per_file"]')
            both = await page.eval_when(
                f"(() => {{ const d = {drawn_js()}; return d && d.search === "
                f"{json.dumps('?fold=setup&fold=per_file')} && d; }})()",
                "setup and per_file folded",
            )
            assert both["groups"] == {"setup": "RUNNING", "per_file": summary("per_file")}
            assert sorted(both["tasks"]) == ["list_files", "report"]
            assert both["edges"] == folded_edges("setup", "per_file")
            assert "per_file.checks" not in both["links"]  # inside a folded group
            shot = await page.send("Page.captureScreenshot", format="png")
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "web-run-graph-groups.png").write_bytes(base64.b64decode(shot["data"]))

            # A click on per_file's box unfolds it; setup stays folded.
            await page.click_on('svg a[data-group="per_file"]')
            back = await page.eval_when(
                f"(() => {{ const d = {drawn_js()}; return d && d.search === '?fold=setup'"
                " && d; })()",
                "per_file unfolded",
            )
            assert set(back["groups"]) == {"setup"}
            assert {t for t in states if not t.startswith("setup.")} == set(back["tasks"])
