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
offload call of at most SMALL keys skips the marking pass: an entry is protected if marked by an earlier access of
the call or among its remaining keys. The list is read into the queue on entry and rebuilt from it on the way out
(O(keys) per chunk), so plan() and the generic driver continue from the same state (mark included).

Loaded like the drivers (specialise.stream_for): a copy named by this package's source digest, so an edit to lru.py
or split.py recompiles it. Same signature as driver.replay_calls; flags are LRU's (admits, nothing else).
"""

from numba import njit
from numba import uint64 as U64

from freetoken.placement.compiled.base import CALLS, CLOCK, NFREE, STAMP
from freetoken.placement.compiled.split import choose

PREFILL = 0
SMALL = 4  # offload calls of at most this many keys skip the marking pass


@njit(cache=True, inline="always")
def _compact(queue, pos, head, tail):
    """Live entries of [head, tail) moved to the front, in order; returns their count (<= capacity + 1)."""
    n = 0
    for j in range(head, tail):
        k = U64(queue[j])
        if pos[k] == j:
            queue[n] = k
            pos[k] = n
            n += 1
    return n


@njit(cache=True, inline="always")
def _among(keys, lo, hi, key):
    for j in range(lo, hi):
        if keys[j] == key:
            return True
    return False


@njit(cache=True, _nrt=False)
def replay_calls(p, st, keys, tokens, offsets, phase, c0, c1, split, flags, buf, log):
    """Calls c0..c1-1; log [8, C] columns as driver.replay_calls."""
    slot_of, key_of_slot, free, last_use, mark, ints = st
    nxt, prv, held, E = p[0], p[1], p[2], p[4][1]
    kind, miss, rank, order = buf[0], buf[2], buf[3], buf[4]
    queue, pos = buf[7], buf[8]  # queue [2K + 2] (live entries <= capacity + 1 <= K + 1); pos [K] of its live entry
    size = queue.size
    sentinel = U64(nxt.size - 1)
    capacity = key_of_slot.size
    offload = split[0] == 0  # every miss fetched, whatever the other fields say
    admit_prefill = split[7] != 0
    now, nfree, stamp = ints[CLOCK], ints[NFREE], ints[STAMP]
    head = tail = 0
    for key in range(slot_of.size):
        pos[key] = -1
    k = U64(nxt[sentinel])
    while k != sentinel:  # the list, least recent first, as live entries
        queue[tail] = k
        pos[k] = tail
        tail += 1
        k = U64(nxt[k])
    base_admits = flags[0] != 0 and capacity > 0
    hits, fetched, cpu, evicted, prefetched, hit_tokens, fetch_tokens, cpu_tokens = (  # log's rows, each [C]
        log[0], log[1], log[2], log[3], log[4], log[5], log[6], log[7])
    hi = offsets[c0]
    for c in range(c0, c1):
        lo, hi = hi, offsets[U64(c + 1)]
        start = now  # entries from this call have times >= start
        stamp += 1
        scan = offload and hi - lo <= SMALL  # no marking pass: protection read from the call's remaining keys
        if offload and not scan:
            for i in range(lo, hi):
                mark[U64(keys[i])] = stamp
        elif not offload:
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
        admits = base_admits and (admit_prefill or phase[U64(c)] != PREFILL)
        h = f = u = ht = ft = ut = ne = 0
        for i in range(lo, hi):
            key = U64(keys[i])
            t = tokens[i]
            cached = slot_of[key] >= 0
            if cached:  # hit: to the back
                h += 1
                ht += t
            elif offload or kind[i - lo] == 1:
                f += 1
                ft += t
                if admits:
                    s = -1
                    if nfree > 0:
                        nfree -= 1
                        s = free[nfree]
                        cached = True
                    else:
                        while head < tail:  # the least recent live unprotected entry
                            k = U64(queue[head])
                            if pos[k] != head:  # stale
                                head += 1
                                continue
                            if mark[k] == stamp or (scan and _among(keys, i + 1, hi, k)):
                                if last_use[k] >= start:
                                    break  # none: the fetch runs from staging
                                head += 1  # hit later in this call
                                continue
                            s = slot_of[k]
                            slot_of[k] = -1
                            pos[k] = -1
                            head += 1
                            ne += 1
                            cached = True
                            break
                    if cached:
                        slot_of[key] = s
                        key_of_slot[U64(s)] = key
            else:
                u += 1
                ut += t
            if cached:
                if tail == size:
                    tail = _compact(queue, pos, head, tail)
                    head = 0
                queue[tail] = key
                pos[key] = tail
                tail += 1
            mark[key] = stamp  # (already, unless scan)
            last_use[key] = now
            now += 1
        cu = U64(c)
        hits[cu] = h
        fetched[cu] = f
        cpu[cu] = u
        evicted[cu] = ne
        prefetched[cu] = 0
        hit_tokens[cu] = ht
        fetch_tokens[cu] = ft
        cpu_tokens[cu] = ut
    ints[CLOCK], ints[NFREE], ints[STAMP] = now, nfree, stamp
    ints[CALLS] += c1 - c0
    for layer in range(held.size):
        held[layer] = 0
    for key in range(slot_of.size):  # off the list: both links at the sentinel, as lru._unlink leaves them
        nxt[key] = prv[key] = sentinel
        if slot_of[key] >= 0:
            held[key // E] += 1
    last = sentinel
    for j in range(head, tail):  # the live entries, least recent first, as the list
        k = U64(queue[j])
        if pos[k] == j:
            nxt[last] = k
            prv[k] = last
            last = k
    nxt[last] = sentinel
    prv[sentinel] = last
