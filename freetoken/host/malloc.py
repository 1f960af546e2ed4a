"""Freed host memory kept for reuse by glibc's allocator.

By default glibc gives large freed blocks back to the kernel (a block over its mmap threshold is a mapping of its
own, unmapped on free, and the heap's top is trimmed), so a prefill temporary of a few MB is faulted in again,
page by page, zeroed by the kernel. glibc raises its threshold as it sees large blocks freed, so this costs most
in a process's first requests. Measured on this project's 2-core Zen 4 machine (1 thread, `ft bench cpu`'s random
qwen3_5_moe, 2048-token prefill, `benchmarks/host_malloc.py`, best of 3 after one warm-up): ft 569 -> 544 ms
(1.05x), HF transformers with the same setting 660 -> 613 ms, peak RSS 0.81 -> 0.82 GB; a process's first
prefills 638 -> 549 ms. The engine asks glibc once (mallopt) to serve blocks below 32 MB (its ceiling) from the
heap and to keep up to TRIM_BYTES of freed heap: memory is reused rather than added, so the peak resident set
stays about the same, while the set between requests stays near that peak. FT_HOST_MALLOC=0 leaves glibc's
defaults.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit: bigger blocks are always their own mapping
TRIM_BYTES = 512 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
_DONE: list[bool | None] = [None]


def wanted() -> bool:
    value = os.environ.get("FT_HOST_MALLOC", "1").strip().lower()
    if value not in ("1", "on", "0", "off"):
        raise ValueError(f"FT_HOST_MALLOC={value!r}: use 1 / on (keep freed host memory for reuse, the default) "
                         f"or 0 / off (glibc's defaults)")
    return value in ("1", "on")


def keep_freed_memory() -> bool:
    """Sets glibc's thresholds once per process (True where set; False: turned off, or not glibc)."""
    if _DONE[0] is None:
        _DONE[0] = wanted() and _mallopt()
    return _DONE[0]


def _mallopt() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES) == 1
