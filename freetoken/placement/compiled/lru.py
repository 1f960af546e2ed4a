"""Compiled LRU: recency as a doubly linked list over keys (head = least recent), mirroring placement.lru.LRU,
whose order is slot_of's insertion order (admit appends, hit moves to the back, eviction unlinks)."""

from __future__ import annotations

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import (admission_order, begin_call, is_protected, on_miss,  # noqa: F401
                                               on_prefetch, prefetch_for, observe_call)
from freetoken.placement.compiled.setup import Setup


def setup(name: str, capacity: int, num_layers: int, num_experts: int) -> Setup:
    K = num_layers * num_experts
    nxt = np.full(K + 1, K, np.int64)  # index K: the sentinel; nxt[K] = head, prv[K] = tail
    prv = np.full(K + 1, K, np.int64)
    return Setup((nxt, prv))


@nb.njit(cache=True, inline="always")
def _unlink(p, key):
    nxt, prv = p
    a, b = prv[key], nxt[key]
    nxt[a] = b
    prv[b] = a


@nb.njit(cache=True, inline="always")
def _append(p, key):
    nxt, prv = p
    tail = prv[-1]
    sentinel = nxt.size - 1
    nxt[tail] = key
    prv[key] = tail
    nxt[key] = sentinel
    prv[sentinel] = key


@nb.njit(cache=True)
def on_hit(p, key, now):
    _unlink(p, key)
    _append(p, key)


@nb.njit(cache=True)
def on_admit(p, key, now):
    _append(p, key)


@nb.njit(cache=True)
def on_evict(p, key):
    _unlink(p, key)


@nb.njit(cache=True)
def victim(p, st, key, now):
    nxt = p[0]
    sentinel = nxt.size - 1
    k = nxt[sentinel]
    while k != sentinel:  # the call's own keys sit at the back: this stops at once unless all are
        if not is_protected(st, k):
            return k
        k = nxt[k]
    return -1
