"""ideep's per-shape cache kept small, so a long-running process stops growing with every new GEMM shape.

torch runs a bf16 matmul on the CPU through ideep over oneDNN, and each caches an entry per shape: ideep's LRU
(LRU_CACHE_CAPACITY, 1024 entries by default) and oneDNN's primitive cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY, 1024).
ideep's entries only repeat oneDNN's. Measured on this project's 2-core Zen 4 machine (1 thread): 300 matmuls of
distinct row counts kept 170 MB with both caches, 89 MB with ideep's at 16 entries. Four 512-token prefills of `ft
bench cpu`'s random qwen3_moe took 1.17-1.20 s each either way. oneDNN's cache keeps its size, because it is what
makes a repeated shape cheap: at 128 or 256 entries those prefills ran 4-5% slower. Instead, grouped.py pads the
expert groups so that few shapes reach it.

Both variables are read on first use, so this must run before the process's first bf16 matmul; a value already in
the environment is kept. (ideep crashes the process at 0, so a value that is not a positive integer is refused here.)
"""

from __future__ import annotations

import os

IDEEP_CACHE_ENTRIES = 16
VARIABLE = "LRU_CACHE_CAPACITY"


def bound_ideep_cache() -> int:
    """Sets LRU_CACHE_CAPACITY unless given; returns the capacity in force."""
    value = os.environ.setdefault(VARIABLE, str(IDEEP_CACHE_ENTRIES)).strip()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{VARIABLE}={value!r}: ideep's GEMM cache needs a positive entry count (0 crashes it); "
                         f"unset it for freetoken's {IDEEP_CACHE_ENTRIES}")
    return int(value)
