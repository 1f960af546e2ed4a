"""The line printed before numba compiles placement code: what, about how long, where it is kept afterwards.

A listener on numba's compile events: a compile starts only when no cached copy fits (cache.py), so a warm run
prints nothing. The estimate is this machine's last compile of the same code when one is recorded (in the cache
folder), else the time measured on a 2-core development machine.
"""

from __future__ import annotations

import json
import sys
import time

from numba.core import event

from freetoken.placement.compiled.cache import cache_dir

TYPICAL_CPU_S = {"lru": 2, "lru's stream replay": 3, "lru's stream replay (cpu, hybrid)": 2,
                 "pinned (static_layers, frequency)": 1, "pinned's stream replay (offload)": 1, "belady": 2,
                 "the layer-sweep family": 8, "s3fifo": 2, "ktransformers_dynamic": 3, "moe_infinity": 2,
                 "the call builder": 1}  # measured on the development machine (ft warmup --all on a fresh clone)
_LABELS: dict[object, str] = {}  # dispatcher -> what the line calls it


def label(dispatcher, what: str):
    """Announce `dispatcher`'s compiles as `what`; returns the dispatcher."""
    _LABELS[dispatcher] = what
    return dispatcher


class _Notes(event.Listener):
    def __init__(self) -> None:
        self.started: list[tuple[str, float]] = []  # (label, CPU time) of the labelled compiles under way
        self.announced: set[str] = set()  # once per process (the call builder is two compiles)

    def on_start(self, ev) -> None:
        what = _LABELS.get(ev.data["dispatcher"])
        if what is not None and not self.started and what not in self.announced:
            self.announced.add(what)
            seconds = _recorded().get(what, TYPICAL_CPU_S.get(what, 2))
            print(f"compiling {what} (first use, ~{seconds:.0f} s, cached after in {cache_dir()})", file=sys.stderr,
                  flush=True)
        if what is not None:
            self.started.append((what, time.process_time()))

    def on_end(self, ev) -> None:
        if _LABELS.get(ev.data["dispatcher"]) is not None and self.started:
            what, t0 = self.started.pop()
            if not self.started:
                _record(what, time.process_time() - t0)


def _path():
    return cache_dir() / "compile_seconds.json"


def _recorded() -> dict:
    try:
        return json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}


def _record(what: str, seconds: float) -> None:
    try:
        _path().write_text(json.dumps({**_recorded(), what: max(1.0, round(seconds))}))
    except OSError:
        pass  # (a read-only cache: the estimate stays the typical one)


event.register("numba:compile", _Notes())
