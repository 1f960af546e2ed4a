"""Frequency pinning (KTransformers style): a fixed set of experts is pinned on the GPU; misses go to the split.

strategy (KTransformers' --kt-expert-placement-strategy, every slot used by each):
    frequency      scope per_layer: each layer pins its top N = capacity // num_layers experts of the profile, and
                   the capacity - N * L leftover slots go to the hottest remaining (layer, expert) keys of the profile;
                   scope global: the top `capacity` keys of the profile overall.
    uniform        no statistics: each layer pins experts 0..N-1, the leftover slots go to expert N of the first
                   layers (the frequency rule on an all-zero profile).
    front_loading  no statistics: keys in (layer, expert) order from the first MoE layer on until the slots run out.
Ties go to the lower key (layer * E + expert), so the pinned set is deterministic.
"""

from __future__ import annotations

import numpy as np

from freetoken.placement.compiled.form import pinned
from freetoken.placement.policy import PlacementPolicy

STRATEGIES = ("frequency", "uniform", "front_loading")
SCOPES = ("per_layer", "global")


def _hottest(flat: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n largest values, ties to the lower index."""
    return np.lexsort((np.arange(flat.size), -flat))[:n]


def pinned_keys(counts: np.ndarray, capacity: int, scope: str) -> list[int]:
    """counts: [L, E] uses per (layer, expert) on the profile. Returns keys layer * E + expert, per layer pins
    first (layer order), then the leftover slots' keys hottest first."""
    L, E = counts.shape
    capacity = min(capacity, L * E)
    flat = np.asarray(counts, dtype=np.float64).reshape(-1)  # [L*E]
    if scope == "per_layer":
        n = capacity // L
        keys = [int(layer * E + e) for layer in range(L) for e in _hottest(flat[layer * E:(layer + 1) * E], n)]
        rest = np.ones(L * E, bool)
        rest[keys] = False
        left = np.flatnonzero(rest)  # [L*E - n*L], ascending keys
        keys.extend(int(k) for k in left[_hottest(flat[left], capacity - len(keys))])
        return keys
    if scope == "global":
        return [int(k) for k in _hottest(flat, capacity)]
    raise ValueError(f"frequency scope {scope!r} is not one of {', '.join(SCOPES)}")


def strategy_keys(strategy: str, counts: np.ndarray | None, capacity: int, num_layers: int, num_experts: int,
                  scope: str) -> list[int]:
    """The pinned keys of a KTransformers placement strategy (counts only for `frequency`)."""
    if strategy == "frequency":
        return pinned_keys(counts, capacity, scope)
    if strategy == "uniform":
        return pinned_keys(np.zeros((num_layers, num_experts)), capacity, "per_layer")
    if strategy == "front_loading":
        return list(range(min(capacity, num_layers * num_experts)))
    raise ValueError(f"frequency strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")


class Frequency(PlacementPolicy):
    name = "frequency"
    admits = False

    @staticmethod
    def needs_profile(options: dict) -> bool:
        """Whether these constructor options read the profile (the cache config then requires one)."""
        return options.get("strategy", "frequency") == "frequency"

    def __init__(self, capacity: int, num_layers: int, num_experts: int, profile: np.ndarray | None = None,
                 scope: str = "per_layer", strategy: str = "frequency"):
        super().__init__(capacity, num_layers, num_experts)
        if strategy not in STRATEGIES:
            raise ValueError(f"frequency strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        if scope not in SCOPES:
            raise ValueError(f"frequency scope {scope!r} is not one of {', '.join(SCOPES)}")
        if strategy == "frequency":
            if profile is None:
                raise ValueError("frequency policy needs a profile: expert use counts [layers, experts] "
                                 "from a profile trace")
            profile = np.asarray(profile)
            if profile.shape != (num_layers, num_experts):
                raise ValueError(f"frequency profile must have shape ({num_layers}, {num_experts}), "
                                 f"got {profile.shape}")
        self.scope, self.strategy = scope, strategy
        self._place_pinned(strategy_keys(strategy, profile, capacity, num_layers, num_experts, scope))


# ── compiled: residency fixed at the start, nothing to decide but the split (compiled/form.py) ──────────────────────
Frequency.compiled = pinned(Frequency)
