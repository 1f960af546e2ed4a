"""Compiled Belady (placement.belady.Belady): each resident key's next uses (the next call, then the two after it,
as a pair hi = next call, lo = the later two in one int) sit in an indexed max-heap; the victim is the unprotected
resident with the furthest next use (ties: lowest key), found by walking down from the root past protected keys
only, so a call's own keys cost no pops and re-pushes. Next uses come from one backward pass over the future."""

from __future__ import annotations

import numba as nb
import numpy as np

from freetoken.placement.compiled.base import (is_protected, observe_call, on_miss, on_prefetch,  # noqa: F401
                                               prefetch_for)
from freetoken.placement.compiled.heap import before, refile, remove_key
from freetoken.placement.compiled.setup import Setup

TIE_DEPTH = 3  # as placement.belady: the next call, then the two after it


def setup(name: str, capacity: int, num_layers: int, num_experts: int, future=None, bypass: bool = True) -> Setup:
    if future is None:
        raise ValueError("belady needs the future key stream (an offline bound: simulator, or a recorded trace)")
    K = num_layers * num_experts
    keys = np.ascontiguousarray(future.keys, np.int64)
    offsets = np.ascontiguousarray(future.offsets, np.int64)
    if keys.size and (keys.min() < 0 or keys.max() >= K):
        raise ValueError(f"belady: the future's keys must lie in [0, {K}) ({num_layers} layers x {num_experts} "
                         f"experts), got [{keys.min()}, {keys.max()}]")
    hi, lo = due_pairs(keys, offsets, K)
    state = (keys, offsets, hi, lo,
             np.zeros(K, np.int64), np.zeros(K, np.int64),  # the current call's keys: their dues
             np.zeros(K, np.int64), np.zeros(K, np.int64),  # each resident key: its due
             np.zeros(capacity + 1, np.int64), np.full(K, -1, np.int64),  # heap of resident keys, position in it
             np.zeros(capacity + 1, np.int64),  # scratch: the walk's stack
             np.array([0, int(bool(bypass))], np.int64))  # heap size, bypass
    return Setup(state, orders_admission=bool(bypass))


@nb.njit(cache=True, nogil=True)
def due_pairs(keys, offsets, num_keys):
    """[N] each access's next uses as (hi: call of the next use, lo: calls of the two after as one int); a use
    that never comes counts as call C (after every call)."""
    N = keys.size
    C = offsets.size - 1
    call_of = np.empty(N, np.int64)
    for c in range(C):
        for i in range(offsets[c], offsets[c + 1]):
            call_of[i] = c
    nxt = np.empty(N, np.int64)
    last = np.full(num_keys, -1, np.int64)
    for i in range(N - 1, -1, -1):
        nxt[i] = last[keys[i]]
        last[keys[i]] = i
    hi = np.empty(N, np.int64)
    lo = np.empty(N, np.int64)
    base = C + 1
    for i in range(N):
        at = nxt[i]
        hi[i] = call_of[at] if at >= 0 else C
        code = 0
        for _ in range(TIE_DEPTH - 1):
            if at >= 0:
                at = nxt[at]
            code = code * base + (call_of[at] if at >= 0 else C)
        lo[i] = code
    return hi, lo


@nb.njit(cache=True, inline="always")
def _above(p, a, b):
    """a is the better victim than b: later due, ties to the lower key (the heap's order)."""
    return before(p[6], p[7], True, a, b)


@nb.njit(cache=True, inline="always")
def begin_call(p, st, c, keys):
    fut, offsets, hi, lo, now_hi, now_lo = p[0], p[1], p[2], p[3], p[4], p[5]
    if c >= offsets.size - 1:
        raise ValueError("belady: a call is past the end of the future it was given")
    start = offsets[c]
    if offsets[c + 1] - start != keys.size:
        raise ValueError("belady: a call's keys differ from the future it was given (calls must come in its order)")
    for i in range(keys.size):
        k = keys[i]
        if fut[start + i] != k:
            raise ValueError("belady: a call's keys differ from the future it was given (calls must come in its order)")
        now_hi[k] = hi[start + i]
        now_lo[k] = lo[start + i]


@nb.njit(cache=True, inline="always")
def _remember(p, key):
    p[6][key] = p[4][key]
    p[7][key] = p[5][key]
    refile(p[8], p[9], p[11], 0, p[6], p[7], True, key)


@nb.njit(cache=True, inline="always")
def on_hit(p, key, now):
    _remember(p, key)


@nb.njit(cache=True, inline="always")
def on_admit(p, key, now):
    _remember(p, key)


@nb.njit(cache=True, inline="always")
def on_evict(p, key):
    remove_key(p[8], p[9], p[11], 0, p[6], p[7], True, key)


@nb.njit(cache=True, inline="always")
def victim(p, st, key, now):
    heap, stack, n = p[8], p[10], p[11][0]
    best = -1
    top = 0
    if n > 0:
        stack[0] = 0
        top = 1
    while top > 0:  # unprotected nodes whose ancestors are all protected: the best of them is the heap's best
        top -= 1
        i = stack[top]
        k = heap[i]
        if is_protected(st, k):
            for child in (2 * i + 1, 2 * i + 2):
                if child < n:
                    stack[top] = child
                    top += 1
        elif best < 0 or _above(p, k, best):
            best = k
    if best >= 0 and p[11][1] != 0:  # bypass: not cached if used no sooner than the victim
        if (p[4][key], p[5][key]) >= (p[6][best], p[7][best]):
            return -1
    return best


@nb.njit(cache=True, inline="always")
def admission_order(p, keys, n, order):
    """Soonest next use first, ties to the lower key (insertion sort: a call's fetches are few)."""
    now_hi, now_lo = p[4], p[5]
    for a in range(n):
        order[a] = a
    for a in range(1, n):
        j = order[a]
        b = a - 1
        while b >= 0:
            o = order[b]
            ko, kj = keys[o], keys[j]
            if (now_hi[ko], now_lo[ko], ko) <= (now_hi[kj], now_lo[kj], kj):
                break
            order[b + 1] = o
            b -= 1
        order[b + 1] = j
