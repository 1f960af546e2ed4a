"""The physical anchor of `ft bench sim`'s race: the plainest compiled set-access LRU over the same key stream, which
our replay must not lose to. A call's keys are looked up at its start and protected from each other; a hit moves its
key to the most recent end of a doubly linked list, a miss is admitted there, evicting the least recent key that is
not the call's (none: the miss runs from staging, uncached). It counts misses and nothing else."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def plain_lru_misses(keys, offsets, num_keys, capacity):
    nxt = np.full(num_keys + 1, num_keys, np.int64)  # index num_keys: the sentinel (nxt = least recent)
    prv = np.full(num_keys + 1, num_keys, np.int64)
    resident = np.zeros(num_keys, np.bool_)
    mark = np.full(num_keys, -1, np.int64)  # == call index: the current call's key
    size = misses = 0
    for c in range(offsets.size - 1):
        for i in range(offsets[c], offsets[c + 1]):
            mark[keys[i]] = c
        for i in range(offsets[c], offsets[c + 1]):
            k = keys[i]
            if resident[k]:
                nxt[prv[k]], prv[nxt[k]] = nxt[k], prv[k]  # unlink
            else:
                misses += 1
                if size == capacity:
                    v = nxt[num_keys]
                    while v != num_keys and mark[v] == c:
                        v = nxt[v]
                    if v == num_keys:
                        continue  # every resident is the call's: staging
                    nxt[prv[v]], prv[nxt[v]] = nxt[v], prv[v]
                    resident[v] = False
                else:
                    size += 1
                resident[k] = True
            t = prv[num_keys]  # append at the most recent end
            nxt[t], prv[k], nxt[k], prv[num_keys] = k, t, num_keys, k
    return misses
