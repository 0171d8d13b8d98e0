"""Tiled raster processing (seed 003): validate, route by size, tile fan-out, merge fan-in,
and a finalize join that runs after whichever route ran.

    make_scene -> validate -> route_by_size --(small)--> process_direct --------------+
                                            \\                                        |
                                             (large)-> generate_tiles                 v
                                                          -> process_tile[0..n-1]  finalize (any_of)
                                                          -> merge_tiles ---------------^
    cleanup (all_done) removes the scratch tiles however the run went.

The scene is a synthetic 8-bit elevation grid (a PGM file), made from the logical date so
that every run of a day sees the same data. ``RASTER_SIZE`` (pixels per side, default 512)
sets its size: above 64 KiB it is cut into 128-pixel tiles processed in parallel, below it
is processed in one piece. Both routes apply the same per-pixel stretch, so they produce
the same image.

    slotless run examples/raster.py
    RASTER_SIZE=48 slotless run examples/raster.py --logical-date 2026-04-25
"""

import json
import math
import os
import random
import shutil
from pathlib import Path

from executor import DAG

DATA = Path(os.environ.get("SLOTLESS_DEMO_DIR", "demo-data")).resolve() / "raster"
SIZE = int(os.environ.get("RASTER_SIZE", "512"))
TILE = 128  # pixels per tile side
TILE_ABOVE = 64 * 1024  # bytes: larger scenes are tiled
GAMMA = 0.8
# The stretch every route applies: one lookup per pixel, so tiles and whole scenes agree.
STRETCH = bytes(round(255 * (v / 255) ** GAMMA) for v in range(256))

dag = DAG("raster", description="seed 003: size-routed, tiled raster processing")


# -- a tiny PGM (P5) reader and writer: enough raster format for a demo ---------------------


def write_pgm(path: Path, width: int, height: int, pixels: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(b"P5\n%d %d\n255\n" % (width, height) + pixels)
    tmp.rename(path)  # atomic: a reader never sees half a file


def read_pgm(path: Path) -> tuple[int, int, bytes]:
    data = Path(path).read_bytes()
    magic, dims, maxval, pixels = data.split(b"\n", 3)
    if magic != b"P5" or maxval != b"255":
        raise ValueError(f"{path} is not an 8-bit binary PGM")
    width, height = (int(v) for v in dims.split())
    if len(pixels) != width * height:
        raise ValueError(f"{path}: {len(pixels)} pixel bytes for {width}x{height}")
    return width, height, pixels


def stats(pixels: bytes) -> dict:
    return {"min": min(pixels), "max": max(pixels), "mean": round(sum(pixels) / len(pixels), 3)}


# -- the workflow ------------------------------------------------------------------------


@dag.task
def make_scene(ctx):
    """Stand-in for the upload that starts the workflow: a synthetic elevation grid."""
    rng = random.Random(ctx.ds)
    peaks = [
        (rng.uniform(0, SIZE), rng.uniform(0, SIZE), rng.uniform(SIZE / 8, SIZE / 3))
        for _ in range(5)
    ]
    pixels = bytearray(SIZE * SIZE)
    for y in range(SIZE):
        for x in range(SIZE):
            h = sum(math.exp(-((x - px) ** 2 + (y - py) ** 2) / (2 * r * r)) for px, py, r in peaks)
            pixels[y * SIZE + x] = min(255, int(120 * h + rng.random() * 8))
    path = DATA / ctx.ds / "scene.pgm"
    write_pgm(path, SIZE, SIZE, bytes(pixels))
    ctx.log(f"wrote a {SIZE}x{SIZE} scene to {path}")
    return str(path)


@dag.task(parents=[make_scene])
def validate(ctx):
    path = Path(ctx.inputs["make_scene"])
    width, height, _ = read_pgm(path)  # raises (and fails the task) on a bad file
    size = path.stat().st_size
    ctx.log(f"{path.name}: {width}x{height}, {size} bytes")
    return {"path": str(path), "width": width, "height": height, "size_bytes": size}


@dag.task(parents=[validate], branch=True)
def route_by_size(ctx):
    """Large scenes are tiled and processed in parallel; small ones in one piece."""
    size = ctx.inputs["validate"]["size_bytes"]
    route = "generate_tiles" if size > TILE_ABOVE else "process_direct"
    ctx.log(f"{size} bytes {'>' if size > TILE_ABOVE else '<='} {TILE_ABOVE}: {route}")
    return route


@dag.task(parents=[route_by_size, validate])
def process_direct(ctx):
    scene = ctx.inputs["validate"]
    width, height, pixels = read_pgm(Path(scene["path"]))
    out = pixels.translate(STRETCH)
    path = Path(scene["path"]).with_name("processed.pgm")
    write_pgm(path, width, height, out)
    return {"path": str(path), "tiles": 1, "stats": stats(out)}


@dag.task(parents=[route_by_size, validate])
def generate_tiles(ctx):
    """The tiling scheme: one item per tile, which process_tile fans out over."""
    scene = ctx.inputs["validate"]
    w, h = scene["width"], scene["height"]
    return [
        {"x": x, "y": y, "w": min(TILE, w - x), "h": min(TILE, h - y)}
        for y in range(0, h, TILE)
        for x in range(0, w, TILE)
    ]


@dag.task(expand=generate_tiles, parents=[validate], retries=2, retry_delay=0.2)
def process_tile(ctx):
    tile = ctx.item
    scene = ctx.inputs["validate"]
    width, _, pixels = read_pgm(Path(scene["path"]))
    rows = [
        pixels[
            (tile["y"] + r) * width + tile["x"] : (tile["y"] + r) * width + tile["x"] + tile["w"]
        ]
        for r in range(tile["h"])
    ]
    out = b"".join(rows).translate(STRETCH)
    path = Path(scene["path"]).parent / "tiles" / f"tile_{ctx.index:04d}.pgm"
    write_pgm(path, tile["w"], tile["h"], out)
    ctx.log(f"tile {ctx.index + 1} of {ctx.total} at ({tile['x']}, {tile['y']})")
    return {**tile, "path": str(path)}


@dag.task(parents=[process_tile, validate])
def merge_tiles(ctx):
    """Fan-in: every tile's output, in index order, stitched back into one image."""
    scene = ctx.inputs["validate"]
    width, height = scene["width"], scene["height"]
    merged = bytearray(width * height)
    covered = 0
    for tile in ctx.inputs["process_tile"]:
        w, h, pixels = read_pgm(Path(tile["path"]))
        for r in range(h):
            start = (tile["y"] + r) * width + tile["x"]
            merged[start : start + w] = pixels[r * w : (r + 1) * w]
        covered += w * h
    if covered != width * height:
        raise ValueError(f"tiles cover {covered} of {width * height} pixels")
    path = Path(scene["path"]).with_name("processed.pgm")
    write_pgm(path, width, height, bytes(merged))
    tiles = len(ctx.inputs["process_tile"])
    ctx.log(f"merged {tiles} tiles into {path}")
    return {"path": str(path), "tiles": tiles, "stats": stats(bytes(merged))}


@dag.task(parents=[process_direct, merge_tiles], trigger_rule="any_of")
def finalize(ctx):
    """The join: runs after whichever route ran (the other ended SKIPPED). any_of fires on
    the first success; none_failed_min_one_success would wait for both sides to end."""
    direct, tiled = ctx.inputs["process_direct"], ctx.inputs["merge_tiles"]
    result = tiled or direct
    item = {
        "type": "Feature",
        "stac_version": "1.0.0",
        "id": f"scene-{ctx.ds}",
        "properties": {
            "datetime": f"{ctx.ds}T00:00:00Z",
            "route": "tiled" if tiled else "direct",
            "tiles": result["tiles"],
            "stats": result["stats"],
        },
        "assets": {"data": {"href": result["path"], "type": "image/x-portable-graymap"}},
    }
    path = Path(result["path"]).with_name("item.json")
    path.write_text(json.dumps(item, indent=2))
    ctx.log(f"registered {item['id']} ({item['properties']['route']}) at {path}")
    return item


@dag.task(parents=[finalize, process_tile], trigger_rule="all_done")
def cleanup(ctx):
    """Remove the scratch tiles, whatever happened upstream."""
    tiles = DATA / ctx.ds / "tiles"
    shutil.rmtree(tiles, ignore_errors=True)
    return str(tiles)
