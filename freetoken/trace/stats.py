"""Summary statistics of a routing trace: popularity and reuse."""

from __future__ import annotations

import numpy as np

from freetoken.trace.format import RoutingTrace


def expert_counts(trace: RoutingTrace) -> np.ndarray:
    """[L, E]: how many tokens picked each expert at each layer."""
    L, E = trace.num_layers, trace.num_experts
    keys = trace.experts.astype(np.int64) + (np.arange(L, dtype=np.int64) * E)[None, :, None]
    return np.bincount(keys.reshape(-1), minlength=L * E).reshape(L, E)
