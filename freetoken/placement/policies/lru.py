"""LRU over (layer, expert) keys: FreeToken's expert cache, with FreeToken 0.2's pool scopes.

scope unified:   one pool across all layers (the least recent key anywhere leaves).
scope per_layer: each layer owns a quota of the slots (split equal: capacity // L each, the capacity % L leftover
                 to the first layers; split profile: in proportion to the experts each layer uses on a profile,
                 largest remainders to the lower layer). A layer at or over its quota evicts its own least recent
                 key (none unprotected: the fetch runs from staging); a layer under it takes the least recent key
                 of the layer most over its quota (ties to the lower layer). Free slots are taken first, so during
                 warm-up a layer can run over its quota; the pools converge to the quotas once the cache is full.

Three executors decide the same Plans: the reference class (LRU, first below), its compiled hooks (below the banner)
run by the compiled driver, and two faster forms of scope unified, each tested equal to these:
compiled/lru_stream.py replays a whole CallStream in one loop (the simulator; tests/test_lru_stream.py), and
freetoken/kernels/placement.py decides one call on the device, the victim an argmin of last use over the slots
(the CUDA engine; tests/kernels/test_placement_device.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from freetoken.placement.compiled import lru_stream
from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import filled, is_protected
from freetoken.placement.compiled.form import Compiled, Setup
from freetoken.placement.compiled.linked import append, unlink
from freetoken.placement.compiled.split import split_array
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


# ── compiled: the same decision on arrays (freetoken/placement/compiled) ─────────────────────────────────────────────
# slot_of's insertion order is a doubly linked list over keys (head = least recent); held / quota as above.

class State(NamedTuple):
    nxt: np.ndarray  # int64 [K + 1] the next more recent key; index K is the sentinel: nxt[K] = the least recent
    prv: np.ndarray  # int64 [K + 1] the next less recent key; prv[K] = the most recent
    held: np.ndarray  # int64 [L]
    quota: np.ndarray  # int64 [L] (scope per_layer; empty otherwise)
    per_layer: bool  # scope == "per_layer"
    num_experts: int


NO_QUOTA = np.zeros(0, np.int64)  # (never written)


def setup(capacity: int, num_layers: int, num_experts: int, scope: str = "unified", split: str = "equal",
          profile=None) -> Setup:
    """The reference's checks and quotas; scope unified replays streams in compiled/lru_stream.py."""
    per_layer = check_scope(scope) == "per_layer"
    quota = NO_QUOTA  # read by scope per_layer only; a profile split still checks its profile, as the reference does
    if per_layer or split != "equal":
        quota = np.array(layer_quotas(capacity, num_layers, num_experts, split, profile), np.int64)
    K = num_layers * num_experts
    state = State(filled(K + 1, np.int64, K), filled(K + 1, np.int64, K), np.zeros(num_layers, np.int64), quota,
                  per_layer, num_experts)
    return Setup(state, stream=not per_layer)


@jit
def _unlink(p, key):
    unlink(p.nxt, p.prv, key)
    p.nxt[key] = p.prv[key] = p.nxt.size - 1  # off the list: the sentinel (as lru_stream leaves it)


def on_hit(p, key, now):
    _unlink(p, key)
    append(p.nxt, p.prv, p.nxt.size - 1, key)


def on_admit(p, key, now):
    append(p.nxt, p.prv, p.nxt.size - 1, key)
    p.held[key // p.num_experts] += 1


def on_evict(p, key):
    _unlink(p, key)
    p.held[key // p.num_experts] -= 1


def victim(p, st, key, now):
    E, held, quota = p.num_experts, p.held, p.quota
    layer = -1  # unified: any layer
    if p.per_layer:
        layer = key // E
        if held[layer] < quota[layer]:  # take from the layer most over its quota, the lower on ties
            layer = 0
            for i in range(1, held.size):
                if held[i] - quota[i] > held[layer] - quota[layer]:
                    layer = i
    sentinel = p.nxt.size - 1
    k = p.nxt[sentinel]
    while k != sentinel:  # the call's own keys sit at the back: this stops at once unless all are
        if (layer < 0 or k // E == layer) and not is_protected(st, k):
            return k
        k = p.nxt[k]
    return -1


def _stream(policy, stream, split, c0, c1, log):
    """Scope unified: compiled/lru_stream.py over the same arrays."""
    p = policy.state
    return lru_stream.replay_calls(policy.core, p.nxt, p.prv, p.held, p.num_experts, stream.keys, stream.tokens,
                                   stream.offsets, stream.phase, c0, c1, split_array(split), policy.admits, log)


LRU.compiled = Compiled("lru", State, setup, dict(on_hit=on_hit, on_admit=on_admit, on_evict=on_evict, victim=victim),
                        stream=_stream)
