"""Importing DAG files, for the CLI and for workers that resume runs created elsewhere."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from pathlib import Path

from .dag import DAG


class DagImportError(RuntimeError):
    """A DAG file that does not import, or holds no (or an ambiguous) DAG."""


_cache: dict[tuple[str, str | None], DAG] = {}


def is_loaded(path: str | Path, dag_id: str | None = None) -> bool:
    """True if :func:`load_dag` has this DAG cached (it would not import the file again)."""
    return (str(Path(path).resolve()), dag_id) in _cache


def load_dag(path: str | Path, dag_id: str | None = None, *, cached: bool = True) -> DAG:
    """Import ``path`` and return its DAG (the one named ``dag_id`` if it holds several).

    Imported once per process unless ``cached=False``: a long-lived process that must see
    the file as it is now (the web page's trigger button) imports it again."""
    path = Path(path).resolve()
    key = (str(path), dag_id)
    if cached and key in _cache:
        return _cache[key]
    dags = import_dags(path)
    if dag_id is not None:
        if dag_id not in dags:
            raise DagImportError(
                f"{path} has no DAG {dag_id!r} (found: {', '.join(dags) or 'none'})"
            )
        dag = dags[dag_id]
    elif len(dags) == 1:
        dag = next(iter(dags.values()))
    else:
        found = ", ".join(dags) or "none"
        raise DagImportError(f"{path} must define exactly one DAG, or name one (found: {found})")
    if cached:
        _cache[key] = dag
    return dag


def import_dags(path: str | Path) -> dict[str, DAG]:
    """Import ``path`` (uncached) and return every DAG it defines at module level, by id."""
    path = Path(path).resolve()
    if not path.is_file():
        raise DagImportError(f"DAG file {path} does not exist")
    name = "slotless_dag_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DagImportError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        # SystemExit too: a file that calls sys.exit() at import is a broken file, and must
        # not end the worker or catalogue child that imports it.
        sys.modules.pop(name, None)
        # The line in the DAG file itself: the last frame may be importlib's (a SyntaxError,
        # whose message already names the line) or a helper module's.
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        where = f" (line {frames[-1].lineno})" if frames else ""
        what = (
            f"called sys.exit({exc.code!r})"
            if isinstance(exc, SystemExit)
            else f"{type(exc).__name__}: {exc}"
        )
        raise DagImportError(f"cannot import {path}: {what}{where}") from exc
    return {v.dag_id: v for v in vars(module).values() if isinstance(v, DAG)}
