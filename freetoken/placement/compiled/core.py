"""The arrays every compiled policy shares: the cache itself (Core, owned by the driver) and the driver's scratch.

K = num_layers * num_experts keys (key = layer * E + expert), C = capacity slots, E = experts of one layer.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from freetoken.placement.compiled.cache import jit

CLOCK, USED, STAMP, CALLS = 0, 1, 2, 3  # Core.counters


class Core(NamedTuple):
    """Residency and clocks, as PlacementPolicy keeps them (slot_of, last_use, clock). Hooks read it, never write it."""

    slot_of: np.ndarray  # int32 [K] slot of each key, -1 = not resident
    key_of_slot: np.ndarray  # int32 [C] key each slot holds, -1 = empty
    last_use: np.ndarray  # int64 [K] clock of each key's latest access, -1 = never
    mark: np.ndarray  # int64 [K] == counters[STAMP]: the key is the current call's (protected from eviction)
    counters: np.ndarray  # int64 [4] CLOCK (accesses applied), USED (slots handed out: a slot is never given back,
    #                                   only passed from a victim to its newcomer, so the next free one is USED while
    #                                   USED < C, as the reference's free list pops 0, 1, ...), STAMP (calls started),
    #                                   CALLS (calls planned)


def filled(n: int, dtype, value: int = -1) -> np.ndarray:
    """np.full(n, value, dtype) in half its time (a policy allocates a dozen such arrays; a replay of a small trace
    takes tens of microseconds)."""
    a = np.empty(n, dtype)
    a.fill(value)
    return a


def new_core(capacity: int, num_layers: int, num_experts: int, pinned=()) -> Core:
    """A cold cache; `pinned` keys get the lowest slots first, in the order given (a static policy's warm start)."""
    K = num_layers * num_experts
    core = Core(filled(K, np.int32), filled(capacity, np.int32), filled(K, np.int64), filled(K, np.int64),
                np.zeros(4, np.int64))
    for s, key in enumerate(pinned):
        core.slot_of[key], core.key_of_slot[s] = s, key
    core.counters[USED] = len(pinned)
    return core


@jit
def is_protected(st, key):
    """Whether `key` is one of the current call's (never evicted for another of them)."""
    return st.mark[key] == st.counters[STAMP]


class Scratch(NamedTuple):
    """The driver's buffers: nothing in them outlives one compiled call (hooks may not allocate: they get theirs in
    their own state)."""

    kind: np.ndarray  # int64 [E] per key of the call: 0 hit, 1 fetched, 2 cpu
    slot: np.ndarray  # int64 [E] its slot (-1: cpu, or a fetch run from staging)
    miss: np.ndarray  # int64 [E] the call's misses (indices), then its fetched ones
    rank: np.ndarray  # int64 [E] the split's ranking of the misses
    order: np.ndarray  # int64 [E] an order of them (the split's, admission_order's)
    fetched: np.ndarray  # int64 [E] the fetched keys, for admission_order
    evicted: np.ndarray  # int64 [E + C + 1] keys evicted by the call's fetches and prefetches
    prefetched: np.ndarray  # int64 [K + 1] keys prefetched
    wanted: np.ndarray  # int64 [K + 1] prefetch_for's keys
    offsets: np.ndarray  # int64 [2] plan(): its one call as a stream
    phase: np.ndarray  # int8 [1]
    log: np.ndarray  # int64 [8, 1]


def new_scratch(capacity: int, num_layers: int, num_experts: int) -> Scratch:
    E, K, e = num_experts, num_layers * num_experts, np.empty
    return Scratch(e(E, np.int64), e(E, np.int64), e(E, np.int64), e(E, np.int64), e(E, np.int64), e(E, np.int64),
                   e(E + capacity + 1, np.int64), e(K + 1, np.int64), e(K + 1, np.int64), np.zeros(2, np.int64),
                   np.zeros(1, np.int8), np.zeros((8, 1), np.int64))
