"""Compiled S3-FIFO (placement.s3fifo.S3FIFO): the small, main and ghost FIFOs as three doubly linked lists over
one pair of next / previous arrays (a key is in at most one queue at a time; sentinels K, K+1, K+2), `where` says
which, `freq` the capped hit count. The victim loop is the reference's, step for step; the protected keys it
counts per queue are the current call's, kept by begin_call."""

from __future__ import annotations

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import (admission_order, is_protected, on_miss, on_prefetch,  # noqa: F401
                                               prefetch_for, observe_call)
from freetoken.placement.compiled.linked import append, unlink
from freetoken.placement.compiled.setup import Setup
from freetoken.placement.s3fifo import MAX_FREQ

NONE, SMALL, MAIN, GHOST = 0, 1, 2, 3
# ints: queue lengths (indexed by SMALL, MAIN, GHOST), then the targets and the current call's key count
LEN0, SMALL_TARGET, GHOST_SIZE, NCALL = 0, 4, 5, 6


def setup(name: str, capacity: int, num_layers: int, num_experts: int, small: float = 0.1) -> Setup:
    from freetoken.placement.s3fifo import S3FIFO

    ref = S3FIFO(capacity, num_layers, num_experts, small=small)  # the reference's validation and targets
    K = num_layers * num_experts
    nxt = np.arange(K + 3, dtype=np.int64)  # an empty queue's sentinel points at itself
    prv = np.arange(K + 3, dtype=np.int64)
    ints = np.zeros(7, np.int64)
    ints[SMALL_TARGET], ints[GHOST_SIZE] = ref._small_target, ref._ghost_size
    return Setup((nxt, prv, np.zeros(K, np.int64), np.zeros(K, np.int64), np.zeros(num_experts, np.int64), ints))


@nb.njit(cache=True, inline="always")
def _sentinel(p, queue):
    return p[2].size + queue - 1  # K + 0, K + 1, K + 2 for SMALL, MAIN, GHOST


@nb.njit(cache=True, inline="always")
def _unlink(p, key):
    where, ints = p[2], p[5]
    unlink(p[0], p[1], key)
    ints[LEN0 + where[key]] -= 1
    where[key] = NONE


@nb.njit(cache=True, inline="always")
def _append(p, queue, key):
    where, ints = p[2], p[5]
    append(p[0], p[1], _sentinel(p, queue), key)
    where[key] = queue
    ints[LEN0 + queue] += 1


@nb.njit(cache=True, inline="always")
def begin_call(p, st, c, keys):
    call, ints = p[4], p[5]
    for i in range(keys.size):
        call[i] = keys[i]
    ints[NCALL] = keys.size


@nb.njit(cache=True, inline="always")
def on_hit(p, key, now):
    freq = p[3]
    if freq[key] < MAX_FREQ:
        freq[key] += 1


@nb.njit(cache=True, inline="always")
def on_admit(p, key, now):
    p[3][key] = 0
    if p[2][key] == GHOST:
        _unlink(p, key)
        _append(p, MAIN, key)
    else:
        _append(p, SMALL, key)


@nb.njit(cache=True, inline="always")
def on_evict(p, key):
    ints = p[5]
    if p[2][key] == SMALL:
        _unlink(p, key)
        _append(p, GHOST, key)
        if ints[LEN0 + GHOST] > ints[GHOST_SIZE]:
            _unlink(p, p[0][_sentinel(p, GHOST)])
    else:
        _unlink(p, key)


@nb.njit(cache=True, inline="always")
def victim(p, st, key, now):
    nxt, where, freq, call, ints = p[0], p[2], p[3], p[4], p[5]
    held_s = 0  # protected keys stay in their queue while this runs
    held_m = 0
    for i in range(ints[NCALL]):
        k = call[i]
        if is_protected(st, k):
            if where[k] == SMALL:
                held_s += 1
            elif where[k] == MAIN:
                held_m += 1
    if held_s + held_m >= ints[LEN0 + SMALL] + ints[LEN0 + MAIN]:
        return -1  # every resident is needed by this call
    while True:
        n_s, n_m = ints[LEN0 + SMALL], ints[LEN0 + MAIN]
        if n_s > held_s and (n_s >= ints[SMALL_TARGET] or n_m == held_m):
            k = nxt[_sentinel(p, SMALL)]
            if is_protected(st, k):
                _unlink(p, k)
                _append(p, SMALL, k)
            elif freq[k] > 1:
                _unlink(p, k)
                _append(p, MAIN, k)
            else:
                return k
        else:
            k = nxt[_sentinel(p, MAIN)]
            if is_protected(st, k):
                _unlink(p, k)
                _append(p, MAIN, k)
            elif freq[k] > 0:
                freq[k] -= 1
                _unlink(p, k)
                _append(p, MAIN, k)
            else:
                return k
