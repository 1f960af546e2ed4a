"""Sustained rates: an operation repeated for seconds over buffers larger than the last-level cache.

A short burst over a buffer that fits the cache overstates what a decode loop sees; every rate here is total bytes
over total wall time of the whole run, and the best single pass is kept only to show how far a burst overstates it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

GB = 1e9


@dataclass(frozen=True, slots=True)
class Rate:
    gb_s: float  # sustained: all bytes / all seconds
    peak_gb_s: float  # best single pass
    seconds: float
    passes: int
    bytes_per_pass: int

    def to_dict(self) -> dict:
        return {"gb_s": significant(self.gb_s), "peak_gb_s": significant(self.peak_gb_s), "seconds": round(self.seconds, 3),
                "passes": self.passes, "bytes_per_pass": self.bytes_per_pass}


def significant(x: float, digits: int = 4) -> float:
    """A rate kept to `digits` significant digits: a fixed number of decimals turns a slow lane (a tiny model's
    experts on a loaded machine) into 0, which a profile must never hold."""
    return float(f"{x:.{digits}g}")


def sustain(one_pass: Callable[[], None], bytes_per_pass: int, seconds: float, min_passes: int = 3,
            sync: Callable[[], None] = lambda: None, warmup: int = 1, until: threading.Event | None = None) -> Rate:
    """Runs one_pass until `seconds` have passed (or `until` is set) and at least min_passes ran.

    sync() waits for queued device work, so a pass is timed to completion, not to its launch.
    """
    for _ in range(warmup):
        one_pass()
    sync()
    times = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        one_pass()
        sync()
        times.append(time.perf_counter() - t0)
        if len(times) >= min_passes and (time.perf_counter() - start >= seconds or (until and until.is_set())):
            break
    total = time.perf_counter() - start
    return Rate(bytes_per_pass * len(times) / total / GB, bytes_per_pass / min(times) / GB, total, len(times),
                bytes_per_pass)


def last_level_cache_bytes() -> int:
    """Largest CPU cache (Linux sysfs); 32 MiB when unknown."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return max(sizes, default=32 << 20)


def host_read(buffer_bytes: int, seconds: float) -> Rate:
    """Multi-threaded streaming read of host memory: a reduction over an fp32 buffer on torch's intra-op threads."""
    buf = torch.ones(buffer_bytes // 4, dtype=torch.float32)
    return sustain(lambda: buf.sum(), buf.numel() * 4, seconds)
