"""LRU (scope unified) replaying a CallStream in one tight loop: the same decisions and log as driver.replay_calls
with lru.py's hooks, minus the generic driver's per-access bookkeeping.

Why it equals the generic driver: a call's keys are distinct and protected, so a key resident at the call's start
stays resident through the call and a missing one stays missing until its own admission; so "resident now" is the
hit status the driver fixes at the start, and the driver's kind / slot buffers, its per-call log pass and the Plan
arrays are not needed. Which misses a non-offload split fetches is split.choose, as in the driver. Indices are read
as uint64 (numba skips the negative-index wraparound on them).

The loop works on LRU's own recency list (nxt, prv: least recent first): a hit moves its key to the back, an
admission appends it, the victim is the first key from the front that is not the call's (mark); a key of this call
already used (last use >= the call's start) ends the walk, as every key behind it is the call's too (none: the fetch
runs from staging). An evicted key's links and the per-layer counts (held, read by scope per_layer only) are set on
the way out, in one O(keys) pass, as lru.py's hooks leave them.

The loop writes the log columns that vary and _fill derives the rest after it (fetched, fetch tokens, the constant
prefetched, rows 8 and 9) in a pass without branches on the decisions, summing the totals there too. Per call the
loop keeps two packed counters, stored in rows 0 and 5 until _fill splits them: hits | evictions << 32 and
hit tokens | all tokens << 32 (fewer registers and stores). Both halves fit: a call has at most E keys, and at most
prefill_chunk x top-k < 2^31 (token, expert) pairs (callstream checks it). cpu and cpu tokens are written as they
are, unless offload (0). The offload and other-split copies are entry points of their own, each compiled on its
first use (an offload run compiles half the loop code).
"""

import numpy as np
from numba import int64 as I64
from numba import uint64 as U64

from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import CALLS, CLOCK, STAMP, USED
from freetoken.placement.compiled.notes import label
from freetoken.placement.compiled.split import choose

PREFILL = 0
LOW = (1 << 32) - 1  # the low half of a packed pair
NO_BUFFERS = np.zeros((4, 0), np.int64)  # an offload replay's (it reads none)


def scratch(num_experts: int) -> np.ndarray:
    """The split's buffers [4, E] (kind, miss, rank, order of the call's keys), allocated by the caller: the compiled
    loop allocates nothing (no runtime to start when its cached code loads)."""
    return np.empty((4, num_experts), np.int64)


def replay_calls(core, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, log):
    """Calls c0..c1-1 of LRU (its recency list nxt / prv, per-layer counts held, E experts per layer; admits: its
    flag) as the driver's replay_calls. With log [10, C], rows 8 and 9 get each call's distinct experts and (token,
    expert) pairs (sim.replay's experts / tokens columns). Returns the sums of hits, cpu, evictions and cpu tokens
    over these calls (summed by _fill, so sim.replay needs no pass over the log). Offload (every miss fetched,
    whatever the split's other fields say) runs a copy with the split folded; the other splits the general copy,
    each compiled on its own first use."""
    if split[0] == 0:
        return _offload(*core, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, NO_BUFFERS,
                        log)
    return _other(*core, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, scratch(E), log)


@jit(entry=True)
def _offload(slot_of, key_of_slot, last_use, mark, ints, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1,
             split, admits, buf, log):
    return _replay(slot_of, key_of_slot, last_use, mark, ints, nxt, prv, held, E, keys, tokens, offsets, phase,
                   c0, c1, split, admits, buf, log, True)


@jit(entry=True)
def _other(slot_of, key_of_slot, last_use, mark, ints, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1,
           split, admits, buf, log):
    return _replay(slot_of, key_of_slot, last_use, mark, ints, nxt, prv, held, E, keys, tokens, offsets, phase,
                   c0, c1, split, admits, buf, log, False)


@jit(inline=True)  # (into _offload and _other: each its own loop, `offload` folded)
def _replay(slot_of, key_of_slot, last_use, mark, ints, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split,
            admits, buf, log, offload):
    kind, miss, rank, order = buf[0], buf[1], buf[2], buf[3]
    sentinel = U64(nxt.size - 1)
    capacity = key_of_slot.size
    admit_prefill = split[7] != 0
    now, used, stamp = ints[CLOCK], ints[USED], ints[STAMP]
    base_admits = admits and capacity > 0
    hi = offsets[c0]
    for c in range(c0, c1):
        lo, hi = hi, offsets[U64(c + 1)]
        start = now  # keys used in this call have last use >= start
        stamp += 1
        if offload:
            for i in range(lo, hi):
                mark[U64(keys[U64(i)])] = stamp
        else:
            m = I64(0)  # (not a literal 0: one compile of choose with the driver's)
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
        admits = base_admits and (admit_prefill or phase[U64(c)] != PREFILL)
        hn = tok = u = ut = 0  # packed pairs (see the docstring): hits | evictions << 32, hit | all tokens << 32
        for i in range(lo, hi):
            key = U64(keys[U64(i)])
            t = I64(tokens[U64(i)])
            tok += t << 32
            if slot_of[key] >= 0:  # hit: out of its place, to the back below
                hn += 1
                tok += t
                a, b = U64(prv[key]), U64(nxt[key])
                nxt[a] = b
                prv[b] = a
            elif offload or kind[i - lo] == 1:
                s = -1
                if not admits:
                    pass
                elif used < capacity:
                    s = used
                    used += 1
                else:
                    v = U64(nxt[sentinel])  # the least recent key that is not the call's
                    while v != sentinel and mark[v] == stamp and last_use[v] < start:
                        v = U64(nxt[v])  # (the call's, hit later in it)
                    if v != sentinel and mark[v] != stamp:
                        s = slot_of[v]
                        slot_of[v] = -1
                        a, b = U64(prv[v]), U64(nxt[v])
                        nxt[a] = b
                        prv[b] = a
                        hn += 1 << 32
                if s < 0:  # not admitted, or no victim: the fetch runs from staging
                    last_use[key] = now
                    now += 1
                    continue
                slot_of[key] = s
                key_of_slot[U64(s)] = key
            else:  # computed on the CPU: not admitted
                u += 1
                ut += t
                last_use[key] = now
                now += 1
                continue
            back = U64(prv[sentinel])  # resident now (hit or admitted): the most recent
            nxt[back] = key
            prv[key] = back
            nxt[key] = sentinel
            prv[sentinel] = key
            last_use[key] = now
            now += 1
        cu = U64(c)
        log[0, cu] = hn  # unpacked by _fill
        log[5, cu] = tok
        if not offload:  # (offload: both 0, written by _fill)
            log[2, cu] = u
            log[7, cu] = ut
    ints[CLOCK], ints[USED], ints[STAMP] = now, used, stamp
    ints[CALLS] += c1 - c0
    for layer in range(held.size):
        held[layer] = 0
    for key in range(slot_of.size):
        if slot_of[key] >= 0:
            held[key // E] += 1
        else:  # off the list: both links at the sentinel, as lru._unlink leaves them
            nxt[key] = prv[key] = sentinel
    return _fill(offsets, c0, c1, log, offload)


@jit(inline=True)
def _fill(offsets, c0, c1, log, offload):
    """The log columns the loop leaves (fetched, prefetched, fetch tokens; cpu and cpu tokens under offload; rows 8
    and 9 of a log [10, C]), from those it wrote; returns the sums of hits, cpu, evictions and cpu tokens."""
    sums = log.shape[0] > 8
    total_h = total_u = total_ne = total_ut = 0
    for c in range(c0, c1):
        cu = U64(c)
        n = offsets[U64(c + 1)] - offsets[cu]
        hn, tok = log[0, cu], log[5, cu]
        h, ne, ht, tt = hn & LOW, hn >> 32, tok & LOW, tok >> 32
        log[0, cu] = h
        log[3, cu] = ne
        log[5, cu] = ht
        u = 0 if offload else log[2, cu]
        ut = 0 if offload else log[7, cu]
        log[1, cu] = n - h - u
        log[2, cu] = u
        log[4, cu] = 0
        log[6, cu] = tt - ht - ut
        log[7, cu] = ut
        if sums:
            log[8, cu] = n
            log[9, cu] = tt
        total_h += h
        total_u += u
        total_ne += ne
        total_ut += ut
    return total_h, total_u, total_ne, total_ut


label(_offload, "lru's stream replay")
label(_other, "lru's stream replay (cpu, hybrid)")
