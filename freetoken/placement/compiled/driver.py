"""The generic compiled decision: one call (apply_call) or a run of calls (replay_calls), for one policy's hooks.

This file is a template: `specialise.driver_for(module)` loads a copy of it whose `hooks` import names that policy's
module, so numba inlines the policy's hooks into this loop and caches the result on disk per policy. It states the
set-access semantics of freetoken.placement.policy.PlacementPolicy.plan, the reference it must equal Plan by Plan.

kind[i] of the call's i-th key: 0 hit, 1 fetched, 2 cpu; slot[i]: its slot (-1 for cpu, or a fetch that runs from
staging). flags: [admits, orders_admission, prefetches].
"""

import numpy as np
from numba import njit

from freetoken.placement.compiled import lru as hooks  # specialise.py rewrites this line per policy
from freetoken.placement.compiled.base import CALLS, CLOCK, NFREE, STAMP
from freetoken.placement.compiled.split import choose

PREFILL = 0


@njit(cache=True, inline="always")
def _admit(p, st, key, now):
    """A free slot, else the victim's, else -1 (staging: not kept)."""
    slot_of, key_of_slot, free, ints = st[0], st[1], st[2], st[5]
    out = -1
    if ints[NFREE] > 0:
        ints[NFREE] -= 1
        s = free[ints[NFREE]]
    else:
        out = hooks.victim(p, st, key, now)
        if out < 0:
            return -1, -1
        s = slot_of[out]
        slot_of[out] = -1
        hooks.on_evict(p, out)
    slot_of[key] = s
    key_of_slot[s] = key
    hooks.on_admit(p, key, now)
    return s, out


@njit(cache=True)
def apply_call(p, st, keys, tokens, phase, split, flags, kind, slot, ev, pf):
    """Apply one call (keys [n] of one layer, tokens [n]); returns (evictions, prefetches) written to ev / pf."""
    slot_of, last_use, mark, ints = st[0], st[3], st[4], st[5]
    n = keys.size
    capacity = st[1].size
    c = ints[CALLS]
    hooks.begin_call(p, st, c, keys)
    hooks.observe_call(p, st, c, keys, tokens, phase)
    ints[STAMP] += 1
    stamp = ints[STAMP]
    miss = np.empty(n, np.int64)
    m = 0
    for i in range(n):  # hit / miss status is fixed at the call's start; the call's keys are protected
        key = keys[i]
        mark[key] = stamp
        s = slot_of[key]
        slot[i] = s
        if s >= 0:
            kind[i] = 0
        else:
            kind[i] = 2
            miss[m] = i
            m += 1
    choose(split, keys, tokens, last_use, miss, m, slot_of.size, kind)
    admits = flags[0] != 0 and capacity > 0 and (split[7] != 0 or phase != PREFILL)
    deferred = admits and flags[1] != 0
    now = ints[CLOCK]
    start = now
    ne = 0
    nf = 0
    for i in range(n):  # accesses apply in call order
        key = keys[i]
        if kind[i] == 0:
            hooks.on_hit(p, key, now)
        else:
            hooks.on_miss(p, key, now)
            if kind[i] == 1:
                nf += 1
                s = -1
                if admits and not deferred:
                    s, out = _admit(p, st, key, now)
                    if out >= 0:
                        ev[ne] = out
                        ne += 1
                slot[i] = s
        last_use[key] = now
        now += 1
    ints[CLOCK] = now
    if deferred and nf > 0:  # offered slots in the policy's order, each at its own access time
        idx = np.empty(nf, np.int64)
        j = 0
        for i in range(n):
            if kind[i] == 1:
                idx[j] = i
                j += 1
        for j in hooks.admission_order(p, keys[idx]):
            i = idx[j]
            s, out = _admit(p, st, keys[i], start + i)
            if out >= 0:
                ev[ne] = out
                ne += 1
            slot[i] = s
    npf = 0
    if flags[2] != 0 and flags[0] != 0 and capacity > 0:
        for key in hooks.prefetch_for(p, st, c, keys):  # no access: no clock, no on_hit / on_miss
            if slot_of[key] >= 0 or mark[key] == stamp:
                continue
            s, out = _admit(p, st, key, now)
            if s < 0:
                continue
            if out >= 0:
                ev[ne] = out
                ne += 1
            hooks.on_prefetch(p, key, now)
            mark[key] = stamp
            pf[npf] = key
            npf += 1
    ints[CALLS] = c + 1
    return ne, npf


@njit(cache=True)
def replay_calls(p, st, keys, tokens, offsets, phase, c0, c1, split, flags, log):
    """Calls c0..c1-1 of a CallStream; log [8, C] columns: hits, fetched, cpu, evictions, prefetched, hit_tokens,
    fetch_tokens, cpu_tokens."""
    width = 1
    for c in range(c0, c1):
        width = max(width, offsets[c + 1] - offsets[c])
    kind = np.empty(width, np.int64)
    slot = np.empty(width, np.int64)
    ev = np.empty(width + st[1].size, np.int64)
    pf = np.empty(st[1].size + 1, np.int64)
    for c in range(c0, c1):
        lo, hi = offsets[c], offsets[c + 1]
        ne, npf = apply_call(p, st, keys[lo:hi], tokens[lo:hi], phase[c], split, flags, kind, slot, ev, pf)
        counts = np.zeros(3, np.int64)
        toks = np.zeros(3, np.int64)
        for i in range(hi - lo):
            counts[kind[i]] += 1
            toks[kind[i]] += tokens[lo + i]
        for j in range(3):
            log[j, c] = counts[j]
            log[5 + j, c] = toks[j]
        log[3, c] = ne
        log[4, c] = npf
