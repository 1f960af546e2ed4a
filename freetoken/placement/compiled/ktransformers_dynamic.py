"""Compiled ktransformers_dynamic: the reference's re-pin (freetoken.placement.ktransformers_dynamic) on flat arrays.
Counts are taken in observe_call (the reference takes them in prefetch_for; both before the re-pin decision);
leavers are an array walked by a pointer, cleared at each call's start as the reference's list."""

from __future__ import annotations

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import (admission_order, is_protected, on_admit, on_evict,  # noqa: F401
                                               on_hit, on_miss, on_prefetch)
from freetoken.placement.compiled.setup import Setup

N_LEAVERS, NEXT_LEAVER, PASSES, PAIRS, PHASE = 0, 1, 2, 3, 4
WINDOW, PREFILL_PAIRS, LAYERS, EXPERTS, CAPACITY = 0, 1, 2, 3, 4


def setup(name: str, capacity: int, num_layers: int, num_experts: int, **options) -> Setup:
    from freetoken.placement.ktransformers_dynamic import KTransformersDynamic

    reference = KTransformersDynamic(capacity, num_layers, num_experts, **options)  # validation + pinned order
    pinned = sorted(reference.slot_of, key=reference.slot_of.__getitem__)
    K = num_layers * num_experts
    params = np.array([reference.window, reference.prefill_pairs, num_layers, num_experts, capacity], np.int64)
    state = (np.zeros(K, np.int64), np.zeros(num_experts, np.int64), np.zeros(K, np.int64),
             np.zeros(5, np.int64), params)  # recent [K], call counts [E], leavers [K], ints, params
    return Setup(state, tuple(pinned), admits=True, prefetches=True)


@nb.njit(cache=True)
def begin_call(p, st, c, keys):
    p[3][N_LEAVERS] = 0
    p[3][NEXT_LEAVER] = 0


@nb.njit(cache=True)
def observe_call(p, st, c, keys, tokens, phase):
    recent, counts, ints, E = p[0], p[1], p[3], p[4][EXPERTS]
    counts[:] = 0
    pairs = 0
    for i in range(keys.size):
        recent[keys[i]] += tokens[i]
        counts[keys[i] % E] += tokens[i]
        pairs += tokens[i]
    ints[PAIRS] = pairs
    ints[PHASE] = phase


@nb.njit(cache=True)
def victim(p, st, key, now):
    leavers, ints = p[2], p[3]
    while ints[NEXT_LEAVER] < ints[N_LEAVERS]:
        out = leavers[ints[NEXT_LEAVER]]
        ints[NEXT_LEAVER] += 1
        if st[0][out] >= 0 and not is_protected(st, out):
            return out
    return -1


@nb.njit(cache=True)
def _fair_target(score, capacity, L, E):
    """frequency.pinned_keys(per_layer) as a mask [L*E]."""
    target = np.zeros(L * E, np.bool_)
    n = capacity // L
    for layer in range(L):
        order = np.argsort(-score[layer * E:(layer + 1) * E], kind="mergesort")
        for j in range(min(n, E)):
            target[layer * E + order[j]] = True
    left = capacity - min(n, E) * L
    for k in np.argsort(-score, kind="mergesort"):
        if left <= 0:
            break
        if not target[k]:
            target[k] = True
            left -= 1
    return target


@nb.njit(cache=True)
def prefetch_for(p, st, c, keys):
    recent, counts, leavers, ints, prm = p
    slot_of = st[0]
    L, E = prm[LAYERS], prm[EXPERTS]
    if keys.size == 0:
        return np.zeros(0, np.int64)
    base = (keys[0] // E) * E
    if ints[PHASE] == 0 and ints[PAIRS] >= prm[PREFILL_PAIRS]:
        score = np.empty(E, np.int64)
        held = 0
        for e in range(E):
            r = 1 if slot_of[base + e] >= 0 else 0
            held += r
            score[e] = 2 * counts[e] + r
        target = np.zeros(E, np.bool_)
        order = np.argsort(-score, kind="mergesort")
        for j in range(held):
            target[order[j]] = True
    elif base // E == L - 1:
        ints[PASSES] += 1
        if ints[PASSES] < prm[WINDOW]:
            return np.zeros(0, np.int64)
        ints[PASSES] = 0
        base = 0
        score = np.empty(L * E, np.int64)
        for k in range(L * E):
            score[k] = 2 * recent[k] + (1 if slot_of[k] >= 0 else 0)
        target = _fair_target(score, prm[CAPACITY], L, E)
        recent[:] = 0
    else:
        return np.zeros(0, np.int64)
    n = 0
    for i in np.argsort(score, kind="mergesort"):  # coldest first
        if slot_of[base + i] >= 0 and not target[i]:
            leavers[n] = base + i
            n += 1
    ints[N_LEAVERS] = n
    ints[NEXT_LEAVER] = 0
    incoming = np.empty(score.size, np.int64)
    m = 0
    for i in np.argsort(-score, kind="mergesort"):  # hottest first
        if target[i] and slot_of[base + i] < 0:
            incoming[m] = base + i
            m += 1
    return incoming[:m]
