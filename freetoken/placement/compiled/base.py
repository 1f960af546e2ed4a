"""The core array state every compiled policy shares, and the default (no-op) hooks a policy module re-exports.

Core state `st`, one tuple of flat arrays (K = num_layers * num_experts keys, C = capacity slots):
    slot_of      int32 [K]  slot of each key, -1 = not resident
    key_of_slot  int32 [C]  key held by each slot, -1 = empty
    free         int32 [C]  stack of never-used slots (free[:nfree]; the top is the lowest slot id)
    last_use     int64 [K]  clock of each key's latest access, -1 = never
    mark         int64 [K]  protection stamp: mark[key] == ints[STAMP] means the key is protected in this call
    ints         int64 [4]  CLOCK (accesses applied), NFREE, STAMP (calls started), CALLS (calls planned)
"""

from __future__ import annotations

import numba as nb
import numpy as np

CLOCK, NFREE, STAMP, CALLS = 0, 1, 2, 3


def new_core(capacity: int, num_layers: int, num_experts: int, pinned=()) -> tuple:
    """A cold cache; `pinned` keys get the lowest slots first, in the order given (a static policy's warm start)."""
    K = num_layers * num_experts
    slot_of, key_of_slot = np.empty(K, np.int32), np.empty(capacity, np.int32)
    last_use, mark = np.empty(K, np.int64), np.empty(K, np.int64)
    slot_of.fill(-1)  # empty + fill: half np.full's time, a share of make_policy's
    key_of_slot.fill(-1)
    last_use.fill(-1)
    mark.fill(-1)
    free = np.arange(capacity - 1, -1, -1, dtype=np.int32)
    ints = np.array([0, capacity, 0, 0], np.int64)
    for key in pinned:
        ints[NFREE] -= 1
        s = free[ints[NFREE]]
        slot_of[key], key_of_slot[s] = s, key
    return slot_of, key_of_slot, free, last_use, mark, ints


@nb.njit(cache=True, inline="always")
def is_protected(st, key):
    return st[4][key] == st[5][STAMP]


# default hooks (a policy module imports the ones it does not override)
@nb.njit(cache=True, inline="always")
def begin_call(p, st, c, keys):
    pass


@nb.njit(cache=True, inline="always")
def observe_call(p, st, c, keys, tokens, phase):
    """Call c's keys [n] with their routed tokens [n] and its phase, after begin_call (the routing counts a
    policy learns from)."""
    pass


@nb.njit(cache=True, inline="always")
def on_hit(p, key, now):
    pass


@nb.njit(cache=True, inline="always")
def on_miss(p, key, now):
    pass


@nb.njit(cache=True, inline="always")
def on_admit(p, key, now):
    pass


@nb.njit(cache=True, inline="always")
def on_evict(p, key):
    pass


@nb.njit(cache=True, inline="always")
def on_prefetch(p, key, now):
    pass


@nb.njit(cache=True, inline="always")
def victim(p, st, key, now):
    """A resident, unprotected key to evict for `key`; -1 = do not cache `key`."""
    return -1


@nb.njit(cache=True, inline="always")
def admission_order(p, keys, n, order):
    """Fill order[:n] with the order (indices into keys[:n], the call's fetched keys) in which they are offered a
    slot; used only when the policy's Setup says orders_admission."""
    for i in range(n):
        order[i] = i


@nb.njit(cache=True, inline="always")
def prefetch_for(p, st, c, keys, out):
    """Write the keys to copy ahead of need after call c's accesses into out (most wanted first, at most out.size)
    and return how many; used only when Setup.prefetches."""
    return 0
