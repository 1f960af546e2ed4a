"""LRU (scope unified) replaying a CallStream in one tight loop: the same decisions and log as driver.replay_calls
with lru.py's hooks, minus the generic driver's per-access bookkeeping.

Why it equals the generic driver: a call's keys are distinct and protected, so a key resident at the call's start
stays resident through the call and a missing one stays missing until its own admission; so "resident now" is the
hit status the driver fixes at the start, and the driver's kind / slot buffers, its per-call log pass and the Plan
arrays are not needed. held [L] (read only by scope per_layer) is recounted from slot_of on the way out rather than
kept per admission. Which misses a non-offload split fetches is split.choose, as in the driver. Indices are read as
uint64 (numba skips the negative-index wraparound on them).

Recency inside the loop is a lazy queue, not the linked list: a hit or an admission appends the key and records
pos[key], the index of its live entry (older entries of the key are stale; an eviction clears pos). The victim is
the first live unprotected entry from the front, as the list's first unprotected key. A live protected entry older
than the call is dropped (its key is hit later in this call and appended then); one from this call stops the search
(all later entries are this call's keys). A hit costs two stores instead of the list's eight dependent ones. An
offload call of at most SMALL keys skips the marking pass and reads no mark or clock: an entry is protected if its
key is among the call's keys, and from this call if among those before the access. The list is read into the queue
on entry and rebuilt from it on the way out (O(keys) per chunk), so plan() and the generic driver continue from the
same state (mark included).

The loop writes the log columns that vary and _fill derives the rest after it (fetched, fetch tokens, the constant
prefetched, rows 8 and 9) in a pass without branches on the decisions, summing the totals there too. Per call the
loop keeps two packed counters, stored in rows 0 and 5 until _fill splits them: hits | evictions << 32 and
hit tokens | all tokens << 32 (fewer registers and stores: ~7% on Mixtral, ~15% on DeepSeek prefill). Both halves
fit: a call has at most E keys, and at most prefill_chunk x top-k < 2^31 (token, expert) pairs (callstream checks
it). cpu and cpu tokens are written as they are, unless offload (0). The offload and other-split copies are
entry points of their own (~3% on the offload loop: fewer spills than both inlined in one), each compiled on
its first use (an offload run compiles half the loop code).

It reads LRU's recency list (nxt, prv) and per-layer counts (held) as arrays, so it is compiled once, whatever else
LRU's state holds (policies/lru.py calls it).
"""

from typing import NamedTuple

import numpy as np
from numba import int64 as I64
from numba import uint64 as U64

from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import CALLS, CLOCK, STAMP, USED
from freetoken.placement.compiled.linked import append
from freetoken.placement.compiled.notes import label
from freetoken.placement.compiled.split import choose

PREFILL = 0
SMALL = 4  # offload calls of at most this many keys skip the marking pass
LOW = (1 << 32) - 1  # the low half of a packed pair


@jit(inline=True)
def _compact(queue, pos, head, tail):
    """Live entries of [head, tail) moved to the front, in order; returns their count (<= capacity + 1)."""
    n = 0
    for j in range(head, tail):
        k = U64(queue[U64(j)])
        if pos[k] == j:
            queue[U64(n)] = k
            pos[k] = n
            n += 1
    return n


@jit(inline=True)  # (the hot path: in the loop's own code)
def _among(keys, lo, hi, key):
    for j in range(lo, hi):
        if U64(keys[U64(j)]) == key:  # (an int32 against a uint64 would compare as floats)
            return True
    return False


@jit(inline=True)
def _push(queue, pos, head, tail, key):
    """key to the back of the queue (compacting it first when full); returns (head, tail)."""
    if tail == queue.size:
        tail = _compact(queue, pos, head, tail)
        head = 0
    queue[U64(tail)] = key
    pos[key] = tail
    return head, tail + 1


class Buffers(NamedTuple):
    """The loop's scratch (see scratch(): nothing in it outlives a replay)."""

    kind: np.ndarray  # int64 [E] (non-offload splits) per key of the call: 0 hit, 1 fetched, 2 cpu
    miss: np.ndarray  # int64 [E] its misses
    rank: np.ndarray  # int64 [E] the split's ranking of them
    order: np.ndarray  # int64 [E]
    queue: np.ndarray  # int64 [2K + 2] the recency queue (live entries <= capacity + 1 <= K + 1)
    pos: np.ndarray  # int64 [K] each key's live entry in it


def scratch(num_keys: int, num_experts: int) -> Buffers:
    """The loop's Buffers, allocated by the caller: the compiled loop allocates nothing (no runtime to start when
    its cached code loads). Arrays of their own: as views of one block the loop ran ~10% slower (DeepSeek, Mixtral)."""
    e, E, K = np.empty, num_experts, num_keys
    return Buffers(e(E, np.int64), e(E, np.int64), e(E, np.int64), e(E, np.int64), e(2 * K + 2, np.int64),
                   e(K, np.int64))


def replay_calls(st, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, buf, log):
    """Calls c0..c1-1 of LRU (its recency list nxt / prv, per-layer counts held, E experts per layer; admits: its
    flag; buf: scratch()'s) as the driver's replay_calls. With log [10, C], rows 8 and 9 get each call's distinct
    experts and (token, expert) pairs (sim.replay's experts / tokens columns). Returns the sums of hits, cpu,
    evictions and cpu tokens over these calls (summed by _fill, so sim.replay needs no pass over the log).
    Offload (every miss fetched, whatever the split's other fields say) runs a copy with the split folded; the
    other splits the general copy, each compiled on its own first use."""
    run = _offload if split[0] == 0 else _other
    return run(st, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, buf, log)


@jit(entry=True)
def _offload(st, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, buf, log):
    return _replay(st, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, buf, log, True)


@jit(entry=True)
def _other(st, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, buf, log):
    return _replay(st, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, buf, log, False)


@jit(inline=True)  # (into _offload and _other: each its own loop, `offload` folded)
def _replay(st, nxt, prv, held, E, keys, tokens, offsets, phase, c0, c1, split, admits, buf, log, offload):
    slot_of, key_of_slot, last_use, mark, ints = st
    kind, miss, rank, order, queue, pos = buf
    sentinel = U64(nxt.size - 1)
    capacity = key_of_slot.size
    admit_prefill = split[7] != 0
    now, used, stamp = ints[CLOCK], ints[USED], ints[STAMP]
    head = tail = 0
    for key in range(slot_of.size):
        pos[key] = -1
    k = U64(nxt[sentinel])
    while k != sentinel:  # the list, least recent first, as live entries
        queue[tail] = k
        pos[k] = tail
        tail += 1
        k = U64(nxt[k])
    base_admits = admits and capacity > 0
    hi = offsets[c0]
    for c in range(c0, c1):
        lo, hi = hi, offsets[U64(c + 1)]
        start = now  # entries from this call have times >= start
        stamp += 1
        scan = offload and hi - lo <= SMALL  # no marking pass: protection read from the call's keys
        if offload and not scan:
            for i in range(lo, hi):
                mark[U64(keys[U64(i)])] = stamp
        elif not offload:
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
            if slot_of[key] >= 0:  # hit
                hn += 1
                tok += t
            elif offload or kind[i - lo] == 1:
                if admits:
                    s = -1
                    if used < capacity:
                        s = used
                        used += 1
                    else:
                        while head < tail:  # the least recent live unprotected entry
                            k = U64(queue[U64(head)])
                            if pos[k] != head:  # stale
                                head += 1
                                continue
                            if (_among(keys, lo, hi, k) if scan else mark[k] == stamp):  # protected
                                if (_among(keys, lo, i, k) if scan else last_use[k] >= start):  # from this call
                                    break  # none: the fetch runs from staging
                                head += 1  # hit later in this call
                                continue
                            s = slot_of[k]
                            slot_of[k] = -1
                            pos[k] = -1
                            head += 1
                            hn += 1 << 32
                            break
                    if s >= 0:
                        slot_of[key] = s
                        key_of_slot[U64(s)] = key
            else:
                u += 1
                ut += t
            if slot_of[key] >= 0:  # resident now (hit or admitted): to the back, one push for both
                head, tail = _push(queue, pos, head, tail, key)
            mark[key] = stamp  # (already, unless scan)
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
    for key in range(slot_of.size):  # off the list: both links at the sentinel, as lru._unlink leaves them
        nxt[key] = prv[key] = sentinel
        if slot_of[key] >= 0:
            held[key // E] += 1
    nxt[sentinel] = prv[sentinel] = sentinel
    for j in range(head, tail):  # the live entries, least recent first, as the list
        k = U64(queue[j])
        if pos[k] == j:
            append(nxt, prv, sentinel, k)
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
