"""``GET /assets``: every asset with its last events, the tasks that produce it (outlets)
and the DAGs scheduled on it, and a lineage graph: producer DAGs -> assets -> consumer
DAGs, three columns laid out here (positions), drawn by templates/assets.html as inline
SVG. A read of three statements (executor/store/assets.py: Assets.list_assets)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from executor.store.assets import AssetListed

from .keys import LIVE, STORE
from .render import View, dag_href
from .respond import respond

PATH = "/assets"
# The graph's geometry (px): a column's x, a row's height, a box's size.
COLUMNS = (10, 330, 650)
ROW = 34
BOX_W, BOX_H = 260, 24
# The graph draws at most this many assets (the table lists all): past it, a line says so.
MAX_DRAWN = 200


@dataclass(frozen=True, slots=True)
class Node:
    key: str
    label: str
    kind: str  # producer | asset | consumer
    x: int
    y: int
    href: str


@dataclass(frozen=True, slots=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int


def add_routes(app: web.Application) -> None:
    app.router.add_get(PATH, assets_page)
    app.router.add_get(LIVE + PATH, assets_page)


def lineage(assets: list[AssetListed]) -> dict[str, Any]:
    """The graph's nodes and edges: a column per layer, each sorted by name."""
    drawn = assets[:MAX_DRAWN]
    producers = sorted({d for a in drawn for d, _ in a.producers})
    consumers = sorted({d for a in drawn for d in a.consumers})
    nodes: dict[str, Node] = {}
    for col, kind, names in ((0, "producer", producers), (2, "consumer", consumers)):
        for i, dag_id in enumerate(names):
            nodes[f"{kind}:{dag_id}"] = Node(
                dag_id, dag_id, kind, COLUMNS[col], 10 + i * ROW, dag_href(dag_id)
            )
    for i, a in enumerate(drawn):
        nodes[f"asset:{a.uri}"] = Node(
            a.uri, a.name or a.uri, "asset", COLUMNS[1], 10 + i * ROW, f"#{_anchor(a.uri)}"
        )
    edges = []
    for a in drawn:
        mid = nodes[f"asset:{a.uri}"]
        for d in sorted({d for d, _ in a.producers}):
            p = nodes[f"producer:{d}"]
            edges.append(Edge(p.x + BOX_W, p.y + BOX_H // 2, mid.x, mid.y + BOX_H // 2))
        for d in sorted(set(a.consumers)):
            c = nodes[f"consumer:{d}"]
            edges.append(Edge(mid.x + BOX_W, mid.y + BOX_H // 2, c.x, c.y + BOX_H // 2))
    rows = max(len(producers), len(drawn), len(consumers), 1)
    return {
        "nodes": list(nodes.values()),
        "edges": edges,
        "width": COLUMNS[2] + BOX_W + 10,
        "height": 20 + rows * ROW,
        "box_w": BOX_W,
        "box_h": BOX_H,
        "cut": len(assets) - len(drawn),
    }


def _anchor(uri: str) -> str:
    return "asset-" + "".join(c if c.isalnum() else "-" for c in uri)


async def assets_page(request: web.Request) -> web.Response:
    assets = await request.app[STORE].assets.list_assets()
    ctx = {"assets": assets, "graph": lineage(assets), "anchor": _anchor}
    return respond(request, View("assets.html", "assets", ctx, live=True))
