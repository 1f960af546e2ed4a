"""The generic compiled decision: one call (apply_call) or a run of calls (replay_calls), for one policy's 

This file is a template: `specialise.driver_for(module)` loads a copy of it whose hooks import names that policy's
module, so numba inlines the policy's hooks into this loop and caches the result on disk per policy. Hooks and the
helpers they call are declared inline="always", and the driver is compiled without numba's reference counting
(_nrt=False: every inlined call would otherwise incref / decref each array of the state tuples, atomics that cost ten
times the decision). So nothing here or in a hook allocates: scratch buffers come in `buf` (numba refuses to compile
an allocation without NRT, so a hook that allocates fails at compile time, not silently). It states the
set-access semantics of freetoken.placement.policy.PlacementPolicy.plan, the reference it must equal Plan by Plan.

kind[i] of the call's i-th key: 0 hit, 1 fetched, 2 cpu; slot[i]: its slot (-1 for cpu, or a fetch that runs from
staging). flags: [admits, orders_admission, prefetches]. buf: scratch (see policy.scratch): kind, slot, miss, rank,
order, fetched [E]; ev [E + C]; pf, want [K].
"""

from numba import njit

from freetoken.placement.compiled.lru import (admission_order, begin_call, observe_call, on_admit, on_evict,
                                              on_hit, on_miss, on_prefetch, prefetch_for, victim)  # specialise.py
# names the policy's module in the import above
from freetoken.placement.compiled.base import CALLS, CLOCK, NFREE, STAMP
from freetoken.placement.compiled.split import choose

PREFILL = 0


NO_NRT = dict(cache=True, _nrt=False)


@njit(inline="always")
def _admit(p, st, key, now):
    """A free slot, else the victim's, else -1 (staging: not kept). Returns (slot, evicted key or -1)."""
    slot_of, key_of_slot, free, ints = st[0], st[1], st[2], st[5]
    out = -1
    if ints[NFREE] > 0:
        ints[NFREE] -= 1
        s = free[ints[NFREE]]
    else:
        out = victim(p, st, key, now)
        if out < 0:
            return -1, -1
        s = slot_of[out]
        slot_of[out] = -1
        on_evict(p, out)
    slot_of[key] = s
    key_of_slot[s] = key
    on_admit(p, key, now)
    return s, out


@njit(inline="always")
def _apply(p, st, keys, tokens, phase, split, flags, buf):
    slot_of, last_use, mark, ints = st[0], st[3], st[4], st[5]
    kind, slot, miss, rank, order, fetched, ev, pf, want = buf
    n = keys.size
    capacity = st[1].size
    c = ints[CALLS]
    begin_call(p, st, c, keys)
    observe_call(p, st, c, keys, tokens, phase)
    ints[STAMP] += 1
    stamp = ints[STAMP]
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
    choose(split, keys, tokens, last_use, miss, m, slot_of.size, kind, rank, order)
    admits = flags[0] != 0 and capacity > 0 and (split[7] != 0 or phase != PREFILL)
    deferred = admits and flags[1] != 0
    now = ints[CLOCK]
    start = now
    ne = 0
    nf = 0
    for i in range(n):  # accesses apply in call order
        key = keys[i]
        if kind[i] == 0:
            on_hit(p, key, now)
        else:
            on_miss(p, key, now)
            if kind[i] == 1:
                s = -1
                if deferred:
                    miss[nf] = i  # (the misses' list is spent): the fetched, in call order
                    fetched[nf] = key
                elif admits:
                    s, out = _admit(p, st, key, now)
                    if out >= 0:
                        ev[ne] = out
                        ne += 1
                slot[i] = s
                nf += 1
        last_use[key] = now
        now += 1
    ints[CLOCK] = now
    if deferred and nf > 0:  # offered slots in the policy's order, each at its own access time
        admission_order(p, fetched, nf, order)
        for j in range(nf):
            i = miss[order[j]]
            s, out = _admit(p, st, keys[i], start + i)
            if out >= 0:
                ev[ne] = out
                ne += 1
            slot[i] = s
    npf = 0
    if flags[2] != 0 and flags[0] != 0 and capacity > 0:
        for j in range(prefetch_for(p, st, c, keys, want)):  # no access: no clock, no on_hit / on_miss
            key = want[j]
            if slot_of[key] >= 0 or mark[key] == stamp:
                continue
            s, out = _admit(p, st, key, now)
            if s < 0:
                continue
            if out >= 0:
                ev[ne] = out
                ne += 1
            on_prefetch(p, key, now)
            mark[key] = stamp
            pf[npf] = key
            npf += 1
    ints[CALLS] = c + 1
    return ne, npf


@njit(**NO_NRT)
def apply_call(p, st, keys, tokens, phase, split, flags, buf):
    """Apply one call (keys [n] of one layer, tokens [n]); returns (evictions, prefetches) written to buf's ev / pf;
    buf's kind / slot [:n] say what each key got."""
    return _apply(p, st, keys, tokens, phase, split, flags, buf)


@njit(**NO_NRT)
def replay_calls(p, st, keys, tokens, offsets, phase, c0, c1, split, flags, buf, log):
    """Calls c0..c1-1 of a CallStream; log [8, C] columns: hits, fetched, cpu, evictions, prefetched, hit_tokens,
    fetch_tokens, cpu_tokens."""
    kind = buf[0]
    for c in range(c0, c1):
        lo, hi = offsets[c], offsets[c + 1]
        ne, npf = _apply(p, st, keys[lo:hi], tokens[lo:hi], phase[c], split, flags, buf)
        h = f = u = ht = ft = ut = 0
        for i in range(hi - lo):
            k = kind[i]
            t = tokens[lo + i]
            if k == 0:
                h += 1
                ht += t
            elif k == 1:
                f += 1
                ft += t
            else:
                u += 1
                ut += t
        log[0, c] = h
        log[1, c] = f
        log[2, c] = u
        log[3, c] = ne
        log[4, c] = npf
        log[5, c] = ht
        log[6, c] = ft
        log[7, c] = ut
