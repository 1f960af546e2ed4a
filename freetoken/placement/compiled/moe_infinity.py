"""Compiled moe_infinity: the reference's EAM ring, match, prefetch and eviction (freetoken.placement.moe_infinity)
on flat arrays. The sequence boundary and the counts are taken in observe_call, the match in prefetch_for (the
reference does both in prefetch_for; nothing reads the current EAM in between). Hooks allocate nothing: the sort
buffers live in the state."""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import (admission_order, begin_call, is_protected, on_admit,  # noqa: F401
                                               on_evict, on_hit, on_miss, on_prefetch)
from freetoken.placement.compiled.order import stable_order
from freetoken.placement.compiled.setup import Setup

STORED, NEXT_ROW, PREVIOUS_PHASE = 0, 1, 2
DEPTH, WIDTH, LAYERS, EXPERTS = 0, 1, 2, 3
CURRENT, PAST, PREDICTED, INTS, PARAMS, ORDER, TMP = range(7)


def setup(name: str, capacity: int, num_layers: int, num_experts: int, library: int = 64, depth: int = 1,
          width: int = 2, past=None) -> Setup:
    from freetoken.placement.moe_infinity import check_options, seed_ring

    check_options(library, depth, width)
    K = num_layers * num_experts
    ring, stored, next_row = seed_ring(past, library, K)
    ints = np.array([stored, next_row, 1], np.int64)  # previous phase: decode
    params = np.array([depth, width, num_layers, num_experts], np.int64)
    state = (np.zeros(K, np.int64), ring, np.zeros(K, np.int64), ints, params,
             np.zeros(num_experts, np.int64), np.zeros(num_experts, np.int64))
    return Setup(state, (), admits=True, prefetches=True)  # current [K], past [R, K], predicted [K], order, tmp [E]


@nb.njit(cache=True, inline="always")
def observe_call(p, st, c, keys, tokens, phase):
    current, past, ints, E = p[CURRENT], p[PAST], p[INTS], p[PARAMS][EXPERTS]
    if keys.size > 0 and phase == 0 and keys[0] // E == 0 and ints[PREVIOUS_PHASE] == 1:
        used = False
        for k in range(current.size):
            if current[k] != 0:
                used = True
                break
        if used:
            row = ints[NEXT_ROW]
            for k in range(current.size):
                past[row, k] = current[k]
            ints[NEXT_ROW] = (row + 1) % past.shape[0]
            ints[STORED] = min(ints[STORED] + 1, past.shape[0])
        for k in range(current.size):
            current[k] = 0
    ints[PREVIOUS_PHASE] = phase
    for i in range(keys.size):
        current[keys[i]] += tokens[i]


@nb.njit(cache=True, inline="always")
def victim(p, st, key, now):
    predicted = p[PREDICTED]
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


@nb.njit(cache=True, inline="always")
def prefetch_for(p, st, c, keys, out):
    current, past, predicted, ints, prm = p[CURRENT], p[PAST], p[PREDICTED], p[INTS], p[PARAMS]
    order, tmp = p[ORDER], p[TMP]
    E, L, K = prm[EXPERTS], prm[LAYERS], current.size
    best = -1
    best_sim = 0.0
    own = 0
    for k in range(K):
        own += current[k] * current[k]
    norm = math.sqrt(float(own))
    for r in range(ints[STORED]):
        dot = 0
        sq = 0
        for k in range(K):
            dot += past[r, k] * current[k]
            sq += past[r, k] * past[r, k]
        if dot == 0:
            continue
        sim = dot / (norm * math.sqrt(float(sq)))
        if sim > best_sim:
            best = r
            best_sim = sim
    if best < 0:
        for k in range(K):
            predicted[k] = 0
        return 0
    for k in range(K):
        predicted[k] = past[best, k]
    if keys.size == 0:  # no layer to predict from
        return 0
    layer = keys[0] // E
    n = 0
    for nxt in range(layer + 1, min(layer + 1 + prm[DEPTH], L)):
        stable_order(predicted, nxt * E, E, True, order, tmp)
        for j in range(min(prm[WIDTH], E)):
            e = order[j]
            if predicted[nxt * E + e] > 0:
                out[n] = nxt * E + e
                n += 1
    return n
