"""Compiled LRU: recency as a doubly linked list over keys (head = least recent), mirroring placement.lru.LRU,
whose order is slot_of's insertion order (admit appends, hit moves to the back, eviction unlinks). scope=per_layer
keeps held / quota per layer and walks the same list for the chosen layer's least recent key."""

from __future__ import annotations

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import (admission_order, begin_call, is_protected, on_miss,  # noqa: F401
                                               on_prefetch, prefetch_for, observe_call)
from freetoken.placement.compiled.linked import append, unlink
from freetoken.placement.compiled.setup import Setup
from freetoken.placement.lru import check_scope, layer_quotas


def setup(name: str, capacity: int, num_layers: int, num_experts: int, scope: str = "unified", split: str = "equal",
          profile=None) -> Setup:
    """The reference's validation and quotas (placement.lru), without building the reference."""
    per_layer = check_scope(scope) == "per_layer"
    quota = ()  # read by scope per_layer only; a profile split still checks its profile, as the reference does
    if per_layer or split != "equal":
        quota = layer_quotas(capacity, num_layers, num_experts, split, profile)
    K = num_layers * num_experts
    nxt, prv = np.empty(K + 1, np.int64), np.empty(K + 1, np.int64)  # index K: the sentinel; nxt[K] = head,
    nxt.fill(K)  # prv[K] = tail
    prv.fill(K)
    return Setup((nxt, prv, np.zeros(num_layers, np.int64), np.array(quota, np.int64),
                  np.array([per_layer, num_experts], np.int64)), stream=None if per_layer else "lru_stream.py")


@nb.njit(cache=True, inline="always")
def _unlink(p, key):
    nxt, prv = p[0], p[1]
    unlink(nxt, prv, key)
    nxt[key] = prv[key] = nxt.size - 1  # off the list: the sentinel (a canonical state, as lru_stream leaves it)


@nb.njit(cache=True, inline="always")
def _append(p, key):
    append(p[0], p[1], p[0].size - 1, key)


@nb.njit(cache=True, inline="always")
def on_hit(p, key, now):
    _unlink(p, key)
    _append(p, key)


@nb.njit(cache=True, inline="always")
def on_admit(p, key, now):
    _append(p, key)
    p[2][key // p[4][1]] += 1


@nb.njit(cache=True, inline="always")
def on_evict(p, key):
    _unlink(p, key)
    p[2][key // p[4][1]] -= 1


@nb.njit(cache=True, inline="always")
def victim(p, st, key, now):
    nxt, held, quota, E = p[0], p[2], p[3], p[4][1]
    sentinel = nxt.size - 1
    layer = -1  # unified: any layer
    if p[4][0] != 0:
        layer = key // E
        if held[layer] < quota[layer]:  # take from the layer most over its quota, the lower on ties
            best = held[0] - quota[0]
            layer = 0
            for i in range(1, held.size):
                if held[i] - quota[i] > best:
                    best = held[i] - quota[i]
                    layer = i
    k = nxt[sentinel]
    while k != sentinel:  # the call's own keys sit at the back: this stops at once unless all are
        if (layer < 0 or k // E == layer) and not is_protected(st, k):
            return k
        k = nxt[k]
    return -1
