"""Frequency pinning (KTransformers style): the experts used most on a profile trace are pinned on the GPU.

per_layer: each layer pins its top N = capacity // num_layers experts (slots left over stay empty);
global:    the top `capacity` (layer, expert) keys overall.
Ties go to the lower expert id (then lower layer), so the pinned set is deterministic.
"""

from __future__ import annotations

import numpy as np

from freetoken.placement.policy import PlacementPolicy


def pinned_keys(counts: np.ndarray, capacity: int, scope: str) -> list[int]:
    """counts: [L, E] uses per (layer, expert) on the profile. Returns keys layer * E + expert."""
    L, E = counts.shape
    if scope == "per_layer":
        n = capacity // L
        keys = []
        for layer in range(L):
            order = np.lexsort((np.arange(E), -counts[layer]))  # most used first, then lowest id
            keys.extend(int(layer * E + e) for e in order[:n])
        return keys
    if scope == "global":
        flat = counts.reshape(-1)
        order = np.lexsort((np.arange(L * E), -flat))  # key order = (layer, expert) order for ties
        return [int(k) for k in order[:capacity]]
    raise ValueError(f"frequency scope {scope!r} is not one of per_layer, global")


class Frequency(PlacementPolicy):
    name = "frequency"
    admits = False

    def __init__(self, capacity: int, num_layers: int, num_experts: int, profile: np.ndarray | None = None,
                 scope: str = "per_layer"):
        super().__init__(capacity, num_layers, num_experts)
        if profile is None:
            raise ValueError("frequency policy needs a profile: expert use counts [layers, experts] "
                             "from a profile trace")
        profile = np.asarray(profile)
        if profile.shape != (num_layers, num_experts):
            raise ValueError(f"frequency profile must have shape ({num_layers}, {num_experts}), got {profile.shape}")
        self.scope = scope
        self._place_pinned(pinned_keys(profile, capacity, scope))
