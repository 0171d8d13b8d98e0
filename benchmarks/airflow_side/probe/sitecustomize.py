"""The same probe inside both triggerers (benchmarks/vs_airflow.py puts this folder on
PYTHONPATH of the process it measures; a no-op without VS_PROBE_DIR).

* checks, counted inside the trigger: every ``glob.glob`` call (Airflow's FileTrigger checks
  with one) and every ``os.scandir`` call (slotless's FileTrigger lists a directory once per
  batch), by an audit hook; the distinct globbed paths until VS_EXPECT_PATHS were seen
  (when every Airflow wait has been checked once: "all held");
* loop stalls: a coroutine on every asyncio loop the process runs sleeps 20 ms at a time and
  records each wake-up more than 50 ms late.

A daemon thread writes the counters to VS_PROBE_DIR/<pid>.json twice a second; nothing is
written per check, so the probe costs the measured process next to nothing.
"""

from __future__ import annotations

import os

_DIR = os.environ.get("VS_PROBE_DIR")

if _DIR:
    import asyncio
    import asyncio.base_events
    import json
    import sys
    import threading
    import time
    from typing import Any

    _expect = int(os.environ.get("VS_EXPECT_PATHS", "0"))
    _state: dict[str, Any] = {"glob": 0, "scandir": 0, "distinct": 0, "all_seen_at": None}
    _paths: set[str] | None = set()
    _stalls: list[tuple[float, float]] = []

    def _hook(event: str, args: tuple[Any, ...]) -> None:
        global _paths
        if event == "glob.glob":
            _state["glob"] += 1
            if _paths is not None:
                _paths.add(args[0])
                if len(_paths) >= _expect > 0:
                    _state["distinct"] = len(_paths)
                    _state["all_seen_at"] = time.monotonic()
                    _paths = None  # the set is not part of the triggerer's memory
        elif event == "os.scandir":
            _state["scandir"] += 1

    sys.addaudithook(_hook)

    async def _probe() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.02)
            late = time.monotonic() - before - 0.02
            if late > 0.05:
                _stalls.append((before, late))

    _run_forever = asyncio.base_events.BaseEventLoop.run_forever

    def _run_forever_probed(self: asyncio.base_events.BaseEventLoop) -> None:
        if not getattr(self, "_vs_probed", False):
            self._vs_probed = True  # type: ignore[attr-defined]
            self.create_task(_probe())
        _run_forever(self)

    asyncio.base_events.BaseEventLoop.run_forever = _run_forever_probed  # type: ignore[method-assign]

    # uvloop's loop is not a BaseEventLoop: `slotless` runs its commands on uvloop where
    # it is installed (Airflow's environment has it). Its Python class's run_forever is
    # patched the same way, when asked (VS_PROBE_UVLOOP=1: the import is then paid by
    # every process measured alike, and the benchmarks that do not ask are unchanged).
    if os.environ.get("VS_PROBE_UVLOOP") == "1":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            _uv_run_forever = uvloop.Loop.run_forever

            def _uv_run_forever_probed(self: Any) -> None:
                if not getattr(self, "_vs_probed", False):
                    self._vs_probed = True
                    self.create_task(_probe())
                _uv_run_forever(self)

            uvloop.Loop.run_forever = _uv_run_forever_probed

    def _flush() -> None:
        path = os.path.join(_DIR or ".", f"{os.getpid()}.json")
        while True:
            time.sleep(0.5)
            if _paths is not None:
                _state["distinct"] = len(_paths)
            doc = {**_state, "t": time.monotonic(), "stalls": list(_stalls)}
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, path)

    def _start() -> None:
        threading.Thread(target=_flush, name="vs-probe", daemon=True).start()

    def _forked() -> None:
        # A forked child (Airflow's trigger runner may be one) counts its own, from zero.
        global _paths
        _state.update(glob=0, scandir=0, distinct=0, all_seen_at=None)
        _paths = set()
        _stalls.clear()
        _start()

    os.register_at_fork(after_in_child=_forked)
    _start()
