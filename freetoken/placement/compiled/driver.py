"""The compiled decision, written once: calls c0..c1-1 of a CallStream through one policy's hooks (compiled/hooks.py).

It states the set-access semantics of freetoken.placement.policy.PlacementPolicy.plan, the reference it must equal
Plan by Plan: hit / miss status is fixed at the call's start and the call's keys are protected from each other; the
split picks the misses to fetch; accesses apply in call order (on_hit / on_miss, a fetched key is offered a slot:
a free one, else the victim's, else it runs from staging); a policy that orders admission offers the slots after
the call's accesses instead; prefetches come last. plan() runs one call through the same loop.

Per key of the last call, scratch.kind (0 hit, 1 fetched, 2 cpu) and scratch.slot; its evictions and prefetches in
scratch.evicted / prefetched. flags: (admits, orders_admission, prefetches). log [8, C] columns: hits, fetched, cpu,
evictions, prefetched, hit_tokens, fetch_tokens, cpu_tokens.

What does not depend on the policy (marking the call, the split, the log) is compiled once for all of them; the
loop that calls hooks is compiled per policy, and cached per policy (entry(): numba's disk cache is per function).
"""

from __future__ import annotations

import functools
import types

import numpy as np

from freetoken.placement.call import CPU, FETCH, HIT, PREFILL
from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import CALLS, CLOCK, STAMP, USED
from freetoken.placement.compiled.hooks import (admission_order, begin_call, on_admit, on_evict, on_hit, on_miss,
                                                on_prefetch, prefetch_for, victim)
from freetoken.placement.compiled.ref import by_ref
from freetoken.placement.compiled.split import choose

ADMITS, ORDERS_ADMISSION, PREFETCHES = 0, 1, 2  # flags


@jit
def _start(st, keys, tokens, split, buf):
    """Stamp the call's keys (protected), fix each one's hit / miss status, and let the split pick the fetches."""
    st.counters[STAMP] += 1
    stamp = st.counters[STAMP]
    m = 0
    for i in range(keys.size):
        key = keys[i]
        st.mark[key] = stamp
        s = st.slot_of[key]
        buf.slot[i] = s
        if s >= 0:
            buf.kind[i] = HIT
        else:
            buf.kind[i] = CPU
            buf.miss[m] = i
            m += 1
    choose(split, keys, tokens, st.last_use, buf.miss, m, st.slot_of.size, buf.kind, buf.rank, buf.order)


@jit(per_policy=True)
def _admit(p, st, key, now):
    """A slot for `key`: a free one, else the victim's, else none (-1: it runs from staging). Returns (slot,
    evicted key or -1)."""
    out = -1
    if st.counters[USED] < st.key_of_slot.size:
        s = st.counters[USED]
        st.counters[USED] += 1
    else:
        out = victim(p, st, key, now)
        if out < 0:
            return -1, -1
        s = st.slot_of[out]
        st.slot_of[out] = -1
        on_evict(p, out)
    st.slot_of[key] = s
    st.key_of_slot[s] = key
    on_admit(p, key, now)
    return s, out


@jit
def _log(kind, tokens, c, ne, npf, log):
    """Call c's log column from its keys' kinds."""
    h = f = u = ht = ft = ut = 0
    for i in range(tokens.size):
        t = tokens[i]
        if kind[i] == HIT:
            h += 1
            ht += t
        elif kind[i] == FETCH:
            f += 1
            ft += t
        else:
            u += 1
            ut += t
    log[0, c], log[1, c], log[2, c], log[3, c] = h, f, u, ne
    log[4, c], log[5, c], log[6, c], log[7, c] = npf, ht, ft, ut


def replay_calls(p, st, keys, tokens, offsets, phase, c0, c1, split, flags, buf, log):
    """Calls c0..c1-1 of a CallStream (keys [N], tokens [N], offsets [C + 1], phase [C]); fills log[:, c0:c1].
    One function, not a loop around a per-call one: numba optimises each function it compiles on its own and again
    inside its callers, so every level of calls lengthens the compile of every policy."""
    p, st, buf = by_ref(p), by_ref(st), by_ref(buf)  # (callees get addresses: compiled/ref.py)
    for call in range(c0, c1):
        lo, hi = offsets[call], offsets[call + 1]
        ks, ts = keys[lo:hi], tokens[lo:hi]  # the call's keys (one layer's) and tokens
        c = st.counters[CALLS]  # the policy's call count (a stream replayed in parts, plan() one call at a time)
        begin_call(p, st, c, ks, ts, phase[call])
        _start(st, ks, ts, split, buf)
        kind, slot = buf.kind, buf.slot
        admits = flags[ADMITS] != 0 and st.key_of_slot.size > 0 and (split[7] != 0 or phase[call] != PREFILL)
        deferred = admits and flags[ORDERS_ADMISSION] != 0
        start = now = st.counters[CLOCK]
        ne = nf = 0  # evictions, fetches
        for i in range(ks.size):  # accesses apply in call order
            key = np.int64(ks[i])  # (hooks see every key as int64: one compile of each)
            if kind[i] == HIT:
                on_hit(p, key, now)
            else:
                on_miss(p, key, now)
                if kind[i] == FETCH:
                    s = -1
                    if deferred:
                        buf.miss[nf] = i  # (the misses are spent): the fetched, in call order
                        buf.fetched[nf] = key
                    elif admits:
                        s, out = _admit(p, st, key, now)
                        if out >= 0:
                            buf.evicted[ne] = out
                            ne += 1
                    slot[i] = s
                    nf += 1
            st.last_use[key] = now
            now += 1
        st.counters[CLOCK] = now
        if deferred and nf > 0:  # slots offered in the policy's order, each at its key's own access time
            admission_order(p, buf.fetched, nf, buf.order)
            for j in range(nf):
                i = buf.miss[buf.order[j]]
                s, out = _admit(p, st, np.int64(ks[i]), start + i)
                if out >= 0:
                    buf.evicted[ne] = out
                    ne += 1
                slot[i] = s
        npf = 0  # prefetches
        if flags[PREFETCHES] != 0 and flags[ADMITS] != 0 and st.key_of_slot.size > 0:
            for j in range(prefetch_for(p, st, c, ks, buf.wanted)):  # no access: no clock, no on_hit / on_miss
                key = buf.wanted[j]
                if st.slot_of[key] >= 0 or st.mark[key] == st.counters[STAMP]:
                    continue
                s, out = _admit(p, st, key, now)
                if s < 0:
                    continue
                if out >= 0:
                    buf.evicted[ne] = out
                    ne += 1
                on_prefetch(p, key, now)
                st.mark[key] = st.counters[STAMP]
                buf.prefetched[npf] = key
                npf += 1
        st.counters[CALLS] = c + 1
        _log(kind, ts, call, ne, npf, log)


@functools.lru_cache(maxsize=None)
def entry(module: str, name: str):
    """replay_calls as a dispatcher of the policy module's own, so that numba caches it per policy (its disk cache
    is one index per function, stamped by cache.Locator with that module's files and the engine room's). One per
    (module, name): policies of one State share it."""
    fn = types.FunctionType(replay_calls.__code__, replay_calls.__globals__, "replay_calls")
    fn.__module__, fn.__qualname__ = module, f"replay_calls.{name}"
    return jit(fn, entry=True)
