"""LRU (scope unified) replaying a CallStream in one tight loop: the same decisions and log as driver.replay_calls
with lru.py's hooks, minus the generic driver's per-access bookkeeping.

Why it equals the generic driver: a call's keys are distinct and protected, so a key resident at the call's start
stays resident through the call and a missing one stays missing until its own admission; so "resident now" is the
hit status the driver fixes at the start, and the driver's kind / slot buffers, its per-call log pass and the Plan
arrays are not needed. held [L] (read only by scope per_layer) is recounted from slot_of on the way out rather than
kept per admission. Which misses a non-offload split fetches is split.choose, as in the driver. Indices are read as
uint64 (numba skips the negative-index wraparound on them).

Loaded like the drivers (specialise.stream_for): a copy named by this package's source digest, so an edit to lru.py
or split.py recompiles it. Same signature as driver.replay_calls; flags are LRU's (admits, nothing else).
"""

from numba import njit
from numba import uint64 as U64

from freetoken.placement.compiled.base import CALLS, CLOCK, NFREE, STAMP
from freetoken.placement.compiled.lru import _append, _unlink
from freetoken.placement.compiled.split import choose

PREFILL = 0


@njit(cache=True, _nrt=False)
def replay_calls(p, st, keys, tokens, offsets, phase, c0, c1, split, flags, buf, log):
    """Calls c0..c1-1; log [8, C] columns as driver.replay_calls."""
    slot_of, key_of_slot, free, last_use, mark, ints = st
    nxt, held, E = p[0], p[2], p[4][1]
    kind, miss, rank, order = buf[0], buf[2], buf[3], buf[4]
    sentinel = U64(nxt.size - 1)
    capacity = key_of_slot.size
    offload = split[0] == 0  # every miss fetched, whatever the other fields say
    admit_prefill = split[7] != 0
    now, nfree, stamp = ints[CLOCK], ints[NFREE], ints[STAMP]
    for c in range(c0, c1):
        lo, hi = offsets[c], offsets[c + 1]
        stamp += 1
        if offload:
            for i in range(lo, hi):
                mark[U64(keys[i])] = stamp
        else:
            m = 0
            for i in range(lo, hi):
                key = U64(keys[i])
                mark[key] = stamp
                if slot_of[key] >= 0:
                    kind[i - lo] = 0
                else:
                    kind[i - lo] = 2
                    miss[m] = i - lo
                    m += 1
            choose(split, keys[lo:hi], tokens[lo:hi], last_use, miss, m, slot_of.size, kind, rank, order)
        admits = flags[0] != 0 and capacity > 0 and (admit_prefill or phase[c] != PREFILL)
        h = f = u = ht = ft = ut = ne = 0
        for i in range(lo, hi):
            key = U64(keys[i])
            t = tokens[i]
            if slot_of[key] >= 0:  # hit: to the back
                h += 1
                ht += t
                _unlink(p, key)
                _append(p, key)
            elif offload or kind[i - lo] == 1:
                f += 1
                ft += t
                if admits:
                    if nfree > 0:
                        nfree -= 1
                        s = free[nfree]
                    else:
                        k = U64(nxt[sentinel])  # the least recent unprotected key
                        while k != sentinel and mark[k] == stamp:
                            k = U64(nxt[k])
                        s = -1  # none: the fetch runs from staging
                        if k != sentinel:
                            s = slot_of[k]
                            slot_of[k] = -1
                            _unlink(p, k)
                            ne += 1
                    if s >= 0:
                        slot_of[key] = s
                        key_of_slot[U64(s)] = key
                        _append(p, key)
            else:
                u += 1
                ut += t
            last_use[key] = now
            now += 1
        log[0, c] = h
        log[1, c] = f
        log[2, c] = u
        log[3, c] = ne
        log[4, c] = 0
        log[5, c] = ht
        log[6, c] = ft
        log[7, c] = ut
    ints[CLOCK], ints[NFREE], ints[STAMP] = now, nfree, stamp
    ints[CALLS] += c1 - c0
    for layer in range(held.size):
        held[layer] = 0
    for key in range(slot_of.size):
        if slot_of[key] >= 0:
            held[key // E] += 1
