"""Compiled static policies (static_layers, frequency): residency fixed at the start, nothing admitted. Their
pinned set comes from the reference class's own rule (same validation, same slot order)."""

from __future__ import annotations

import numpy as np

from freetoken.placement.compiled.base import (admission_order, begin_call, on_admit, on_evict, on_hit,  # noqa: F401
                                               on_miss, on_prefetch, prefetch_for, victim, observe_call)
from freetoken.placement.compiled.setup import Setup


def setup(name: str, capacity: int, num_layers: int, num_experts: int, **options) -> Setup:
    from freetoken.placement import POLICIES

    reference = POLICIES[name](capacity, num_layers, num_experts, **options)
    pinned = sorted(reference.slot_of, key=reference.slot_of.__getitem__)  # slot order = placement order
    return Setup((np.zeros(1, np.int64),), tuple(pinned), admits=False)
