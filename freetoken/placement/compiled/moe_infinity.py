"""Compiled moe_infinity: the reference's EAM ring, match, prefetch and eviction (freetoken.placement.moe_infinity)
on flat arrays. The sequence boundary and the counts are taken in observe_call, the match in prefetch_for (the
reference does both in prefetch_for; nothing reads the current EAM in between)."""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import (admission_order, begin_call, is_protected, on_admit,  # noqa: F401
                                               on_evict, on_hit, on_miss, on_prefetch)
from freetoken.placement.compiled.setup import Setup

STORED, NEXT_ROW, PREVIOUS_PHASE = 0, 1, 2
DEPTH, WIDTH, LAYERS, EXPERTS = 0, 1, 2, 3


def setup(name: str, capacity: int, num_layers: int, num_experts: int, library: int = 64, depth: int = 1,
          width: int = 2, past=None) -> Setup:
    from freetoken.placement.moe_infinity import check_options, seed_ring

    check_options(library, depth, width)
    K = num_layers * num_experts
    ring, stored, next_row = seed_ring(past, library, K)
    ints = np.array([stored, next_row, 1], np.int64)  # previous phase: decode
    params = np.array([depth, width, num_layers, num_experts], np.int64)
    state = (np.zeros(K, np.int64), ring, np.zeros(K, np.int64), ints, params)
    return Setup(state, (), admits=True, prefetches=True)  # current [K], past [R, K], predicted [K]


@nb.njit(cache=True)
def observe_call(p, st, c, keys, tokens, phase):
    current, past, _, ints, prm = p
    E = prm[EXPERTS]
    if keys.size > 0 and phase == 0 and keys[0] // E == 0 and ints[PREVIOUS_PHASE] == 1:
        if current.any():
            past[ints[NEXT_ROW]] = current
            ints[NEXT_ROW] = (ints[NEXT_ROW] + 1) % past.shape[0]
            ints[STORED] = min(ints[STORED] + 1, past.shape[0])
        current[:] = 0
    ints[PREVIOUS_PHASE] = phase
    for i in range(keys.size):
        current[keys[i]] += tokens[i]


@nb.njit(cache=True)
def victim(p, st, key, now):
    predicted = p[2]
    key_of_slot, last_use = st[1], st[3]
    best = -1
    for s in range(key_of_slot.size):
        k = key_of_slot[s]
        if k < 0 or is_protected(st, k):
            continue
        if best < 0 or predicted[k] < predicted[best] or (predicted[k] == predicted[best] and (
                last_use[k] < last_use[best] or (last_use[k] == last_use[best] and k < best))):
            best = k
    return best


@nb.njit(cache=True)
def prefetch_for(p, st, c, keys):
    current, past, predicted, ints, prm = p
    E, L = prm[EXPERTS], prm[LAYERS]
    best = -1
    best_sim = 0.0
    norm = math.sqrt(float(np.sum(current * current)))
    for r in range(ints[STORED]):
        dot = np.sum(past[r] * current)
        if dot == 0:
            continue
        sim = dot / (norm * math.sqrt(float(np.sum(past[r] * past[r]))))
        if sim > best_sim:
            best = r
            best_sim = sim
    if best < 0:
        predicted[:] = 0
        return np.zeros(0, np.int64)
    predicted[:] = past[best]
    if keys.size == 0:  # no layer to predict from
        return np.zeros(0, np.int64)
    layer = keys[0] // E
    wanted = np.empty(prm[DEPTH] * prm[WIDTH] + 1, np.int64)
    n = 0
    for nxt in range(layer + 1, min(layer + 1 + prm[DEPTH], L)):
        counts = predicted[nxt * E:(nxt + 1) * E]
        order = np.argsort(-counts, kind="mergesort")
        for j in range(min(prm[WIDTH], E)):
            e = order[j]
            if counts[e] > 0:
                wanted[n] = nxt * E + e
                n += 1
    return wanted[:n]
