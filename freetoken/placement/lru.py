"""LRU over (layer, expert) keys: FreeToken's expert cache, with FreeToken 0.2's pool scopes.

scope unified:   one pool across all layers (the least recent key anywhere leaves).
scope per_layer: each layer owns a quota of the slots (split equal: capacity // L each, the capacity % L leftover
                 to the first layers; split profile: in proportion to the experts each layer uses on a profile,
                 largest remainders to the lower layer). A layer at or over its quota evicts its own least recent
                 key (none unprotected: the fetch runs from staging); a layer under it takes the least recent key
                 of the layer most over its quota (ties to the lower layer). Free slots are taken first, so during
                 warm-up a layer can run over its quota; the pools converge to the quotas once the cache is full.
"""

from __future__ import annotations

import numpy as np

from freetoken.placement.policy import PlacementPolicy

SCOPES, SPLITS = ("unified", "per_layer"), ("equal", "profile")


def layer_quotas(capacity: int, num_layers: int, num_experts: int, split: str, profile=None) -> list[int]:
    """Slots per layer [L] summing to capacity, each at most num_experts."""
    if split == "equal":
        weights = [1] * num_layers
    elif split == "profile":
        if profile is None:
            raise ValueError("lru split=profile needs a profile: expert use counts [layers, experts]")
        profile = np.asarray(profile)
        if profile.shape != (num_layers, num_experts):
            raise ValueError(f"lru profile must have shape ({num_layers}, {num_experts}), got {profile.shape}")
        weights = [int(w) for w in (profile > 0).sum(axis=1)]
        if sum(weights) == 0:
            weights = [1] * num_layers
    else:
        raise ValueError(f"lru split {split!r} is not one of {', '.join(SPLITS)}")
    total = sum(weights)  # integer shares: quota_i = floor(capacity * w_i / total), capped at E
    quota = [min(capacity * w // total, num_experts) for w in weights]
    while sum(quota) < capacity:  # the rest one by one: the largest remainder among layers below E, lower first
        gap = [capacity * w - q * total if q < num_experts else None for w, q in zip(weights, quota)]
        best = max(g for g in gap if g is not None)
        quota[gap.index(best)] += 1
    return quota


def check_scope(scope: str) -> str:
    if scope not in SCOPES:
        raise ValueError(f"lru scope {scope!r} is not one of {', '.join(SCOPES)}")
    return scope


class LRU(PlacementPolicy):
    """The recency order is slot_of's own insertion order (least recently used first): an admitted key is
    inserted at the back, an evicted one popped, a hit moved to the back. No second structure to keep in step."""

    name = "lru"

    @staticmethod
    def needs_profile(options: dict) -> bool:
        """Whether these constructor options read the profile (the cache config then requires one)."""
        return options.get("split", "equal") == "profile"

    def __init__(self, capacity: int, num_layers: int, num_experts: int, scope: str = "unified",
                 split: str = "equal", profile=None):
        super().__init__(capacity, num_layers, num_experts)
        self.scope = check_scope(scope)
        self.quota = layer_quotas(capacity, num_layers, num_experts, split, profile)
        self.held = [0] * num_layers

    def on_hit(self, key: int, now: int) -> None:
        slot_of = self.slot_of
        slot_of[key] = slot_of.pop(key)

    def on_admit(self, key: int, now: int) -> None:
        self.held[key // self.num_experts] += 1

    def on_evict(self, key: int) -> None:
        self.held[key // self.num_experts] -= 1

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        if self.scope == "unified":
            for k in self.slot_of:  # keys of the current call sit at the back: this stops at once unless all are
                if k not in protected:
                    return k
            return None
        E, layer = self.num_experts, key // self.num_experts
        if self.held[layer] < self.quota[layer]:
            excess = [h - q for h, q in zip(self.held, self.quota)]
            layer = excess.index(max(excess))
        for k in self.slot_of:
            if k // E == layer and k not in protected:
                return k
        return None
