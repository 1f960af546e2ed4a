"""Validation that reads device data only when the device is the CPU (on a GPU it would sync): a launch count
(freetoken/engine/launch_count.py) leaves what runs inside out, as it would not run on a GPU. A root module
without imports beyond the standard library, so kernels and engine both read it."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_state = threading.local()


@contextmanager
def cpu_only() -> Iterator[None]:
    _state.depth = depth() + 1
    try:
        yield
    finally:
        _state.depth -= 1


def depth() -> int:
    return getattr(_state, "depth", 0)
