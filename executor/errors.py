"""Errors every layer may raise: here, below them all, so that the store can refuse a DAG
without importing the authoring API. Authors import them from ``executor`` or ``executor.dag``."""

from __future__ import annotations


class DagError(ValueError):
    """A DAG that cannot run: unknown parent, duplicate id, cycle, bad option."""
