"""Compiled ktransformers_dynamic: the reference's re-pin (freetoken.placement.ktransformers_dynamic) on flat arrays.
Counts are taken in observe_call (the reference takes them in prefetch_for; both before the re-pin decision);
leavers are an array walked by a pointer, cleared at each call's start as the reference's list. Scores, the target
mask and the sort buffers live in the state (hooks allocate nothing)."""

from __future__ import annotations

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import (admission_order, is_protected, on_admit, on_evict,  # noqa: F401
                                               on_hit, on_miss, on_prefetch)
from freetoken.placement.compiled.order import stable_order
from freetoken.placement.compiled.setup import Setup

N_LEAVERS, NEXT_LEAVER, PASSES, PAIRS, PHASE = 0, 1, 2, 3, 4
WINDOW, PREFILL_PAIRS, LAYERS, EXPERTS, CAPACITY = 0, 1, 2, 3, 4
RECENT, COUNTS, LEAVERS, INTS, PARAMS, SCORE, TARGET, ORDER, TMP = range(9)


def setup(name: str, capacity: int, num_layers: int, num_experts: int, **options) -> Setup:
    from freetoken.placement.ktransformers_dynamic import KTransformersDynamic

    reference = KTransformersDynamic(capacity, num_layers, num_experts, **options)  # validation + pinned order
    pinned = sorted(reference.slot_of, key=reference.slot_of.__getitem__)
    K = num_layers * num_experts
    params = np.array([reference.window, reference.prefill_pairs, num_layers, num_experts, capacity], np.int64)
    state = (np.zeros(K, np.int64), np.zeros(num_experts, np.int64), np.zeros(K, np.int64),
             np.zeros(5, np.int64), params,  # recent [K], call counts [E], leavers [K], ints, params
             np.zeros(K, np.int64), np.zeros(K, np.int64), np.zeros(K, np.int64), np.zeros(K, np.int64))
    return Setup(state, tuple(pinned), admits=True, prefetches=True)  # + score, target, order, tmp [K]


@nb.njit(cache=True, inline="always")
def begin_call(p, st, c, keys):
    p[INTS][N_LEAVERS] = 0
    p[INTS][NEXT_LEAVER] = 0


@nb.njit(cache=True, inline="always")
def observe_call(p, st, c, keys, tokens, phase):
    recent, counts, ints, E = p[RECENT], p[COUNTS], p[INTS], p[PARAMS][EXPERTS]
    for e in range(E):
        counts[e] = 0
    pairs = 0
    for i in range(keys.size):
        recent[keys[i]] += tokens[i]
        counts[keys[i] % E] += tokens[i]
        pairs += tokens[i]
    ints[PAIRS] = pairs
    ints[PHASE] = phase


@nb.njit(cache=True, inline="always")
def victim(p, st, key, now):
    leavers, ints = p[LEAVERS], p[INTS]
    while ints[NEXT_LEAVER] < ints[N_LEAVERS]:
        out = leavers[ints[NEXT_LEAVER]]
        ints[NEXT_LEAVER] += 1
        if st[0][out] >= 0 and not is_protected(st, out):
            return out
    return -1


@nb.njit(cache=True, inline="always")
def _fair_target(p, capacity, L, E):
    """frequency.pinned_keys(per_layer) over score [L*E] as the mask target [L*E]."""
    score, target, order, tmp = p[SCORE], p[TARGET], p[ORDER], p[TMP]
    for k in range(L * E):
        target[k] = 0
    n = min(capacity // L, E)
    for layer in range(L):
        stable_order(score, layer * E, E, True, order, tmp)
        for j in range(n):
            target[layer * E + order[j]] = 1
    left = capacity - n * L
    stable_order(score, 0, L * E, True, order, tmp)
    for j in range(L * E):
        if left <= 0:
            break
        k = order[j]
        if target[k] == 0:
            target[k] = 1
            left -= 1


@nb.njit(cache=True, inline="always")
def prefetch_for(p, st, c, keys, out):
    recent, counts, leavers, ints, prm = p[RECENT], p[COUNTS], p[LEAVERS], p[INTS], p[PARAMS]
    score, target, order, tmp = p[SCORE], p[TARGET], p[ORDER], p[TMP]
    slot_of = st[0]
    L, E = prm[LAYERS], prm[EXPERTS]
    if keys.size == 0:
        return 0
    base = (keys[0] // E) * E
    if ints[PHASE] == 0 and ints[PAIRS] >= prm[PREFILL_PAIRS]:
        n_keys = E
        held = 0
        for e in range(E):
            r = 1 if slot_of[base + e] >= 0 else 0
            held += r
            score[e] = 2 * counts[e] + r
            target[e] = 0
        stable_order(score, 0, E, True, order, tmp)
        for j in range(held):
            target[order[j]] = 1
    elif base // E == L - 1:
        ints[PASSES] += 1
        if ints[PASSES] < prm[WINDOW]:
            return 0
        ints[PASSES] = 0
        base = 0
        n_keys = L * E
        for k in range(n_keys):
            score[k] = 2 * recent[k] + (1 if slot_of[k] >= 0 else 0)
        _fair_target(p, prm[CAPACITY], L, E)
        for k in range(n_keys):
            recent[k] = 0
    else:
        return 0
    stable_order(score, 0, n_keys, False, order, tmp)  # coldest first
    n = 0
    for j in range(n_keys):
        i = order[j]
        if slot_of[base + i] >= 0 and target[i] == 0:
            leavers[n] = base + i
            n += 1
    ints[N_LEAVERS] = n
    ints[NEXT_LEAVER] = 0
    stable_order(score, 0, n_keys, True, order, tmp)  # hottest first
    m = 0
    for j in range(n_keys):
        i = order[j]
        if target[i] != 0 and slot_of[base + i] < 0:
            out[m] = base + i
            m += 1
    return m
