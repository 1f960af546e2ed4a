"""S3-FIFO (Yang et al., SOSP 2023): a small probation FIFO, a main FIFO and a ghost FIFO; scan resistant.

New keys enter the small queue S (target `small` of the slots), or the main queue M when the ghost queue G
remembers them (evicted from S recently). Hits raise a per-key frequency, capped at 3. Evicting:
- from S while S holds at least its target share (or M has no evictable key): the oldest key of S moves to M if it was hit
  more than once, else it leaves and its key enters G (G keeps as many keys as M's share of the slots);
- otherwise from M: the oldest key of M with frequency > 0 goes back to M's head with frequency - 1
  (a second chance); one with frequency 0 leaves.
Keys of the current call are never evicted: met at a queue's tail, they go back to its head unchanged.
Each eviction moves every key at most a bounded number of times: O(1) amortised per access.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import is_protected
from freetoken.placement.compiled.form import Compiled, Setup
from freetoken.placement.compiled.linked import append, unlink
from freetoken.placement.policy import PlacementPolicy
from freetoken.placement.protected import ProtectedMemo

MAX_FREQ = 3


class S3FIFO(PlacementPolicy):
    name = "s3fifo"

    def __init__(self, capacity: int, num_layers: int, num_experts: int, small: float = 0.1):
        super().__init__(capacity, num_layers, num_experts)
        if not 0 < small < 1:
            raise ValueError(f"s3fifo small must lie in (0, 1), got {small}")
        self.small = small
        self._small_target = max(1, int(small * capacity))
        self._ghost_size = max(1, capacity - self._small_target)
        self._s: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._m: OrderedDict[int, None] = OrderedDict()
        self._g: OrderedDict[int, None] = OrderedDict()
        self._freq: dict[int, int] = {}
        self._protected = ProtectedMemo()  # the protected set the two counts below are of
        self._held_s = 0  # protected keys in S
        self._held_m = 0  # protected keys in M

    def on_hit(self, key: int, now: int) -> None:
        f = self._freq[key]
        if f < MAX_FREQ:
            self._freq[key] = f + 1

    def on_admit(self, key: int, now: int) -> None:
        self._freq[key] = 0
        held = key in self._protected.keys
        if key in self._g:
            del self._g[key]
            self._m[key] = None
            self._held_m += held
        else:
            self._s[key] = None
            self._held_s += held

    def on_evict(self, key: int) -> None:
        del self._freq[key]
        if key in self._protected.keys:
            if key in self._s:
                self._held_s -= 1
            else:
                self._held_m -= 1
        if key in self._s:
            del self._s[key]
            self._g[key] = None
            if len(self._g) > self._ghost_size:
                self._g.popitem(last=False)
        else:
            del self._m[key]

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        s, m, freq = self._s, self._m, self._freq
        if not self._protected.same(protected):  # counted once per protected set (per call), then kept in step
            self._held_s = sum(1 for k in protected if k in s)  # protected keys stay in their queue below
            self._held_m = sum(1 for k in protected if k in m)
        held_s, held_m = self._held_s, self._held_m
        if held_s + held_m >= len(s) + len(m):
            return None  # every resident is needed by this call
        while True:
            if len(s) > held_s and (len(s) >= self._small_target or len(m) == held_m):
                k = next(iter(s))
                if k in protected:
                    s.move_to_end(k)
                elif freq[k] > 1:
                    del s[k]
                    m[k] = None
                else:
                    return k
            else:
                k = next(iter(m))
                if k in protected:
                    m.move_to_end(k)
                elif freq[k] > 0:
                    freq[k] -= 1
                    m.move_to_end(k)
                else:
                    return k


# ── compiled: the same decision on arrays (freetoken/placement/compiled) ─────────────────────────────────────────────
# The three FIFOs are doubly linked lists over one pair of next / previous arrays (a key is in at most one queue;
# their sentinels are K + SMALL - 1 ..); `queue` says which. The victim loop is the reference's, step for step.

NONE, SMALL, MAIN, GHOST = 0, 1, 2, 3  # State.queue


class State(NamedTuple):
    nxt: np.ndarray  # int64 [K + 3] the next younger key of its queue (_s, _m, _g); sentinels K, K + 1, K + 2
    prv: np.ndarray  # int64 [K + 3]
    queue: np.ndarray  # int64 [K] the queue each key is in (NONE: none)
    length: np.ndarray  # int64 [4] keys per queue (index SMALL, MAIN, GHOST)
    freq: np.ndarray  # int64 [K] (_freq)
    call: np.ndarray  # int64 [E] the current call's keys (the protected set the victim counts per queue)
    call_size: np.ndarray  # int64 [1]
    small_target: int  # (_small_target)
    ghost_size: int  # (_ghost_size)


def setup(capacity: int, num_layers: int, num_experts: int, small: float = 0.1) -> Setup:
    ref = S3FIFO(capacity, num_layers, num_experts, small=small)  # the reference's checks and targets
    K = num_layers * num_experts
    z = np.zeros
    return Setup(State(np.arange(K + 3, dtype=np.int64), np.arange(K + 3, dtype=np.int64), z(K, np.int64),
                       z(4, np.int64), z(K, np.int64), z(num_experts, np.int64), z(1, np.int64), ref._small_target,
                       ref._ghost_size))  # (an empty queue's sentinel points at itself)


@jit
def _sentinel(p, queue):
    return p.queue.size + queue - 1


@jit
def _leave(p, key):
    unlink(p.nxt, p.prv, key)
    p.length[p.queue[key]] -= 1
    p.queue[key] = NONE


@jit
def _enter(p, queue, key):
    append(p.nxt, p.prv, _sentinel(p, queue), key)
    p.queue[key] = queue
    p.length[queue] += 1


def begin_call(p, st, c, keys, tokens, phase):
    for i in range(keys.size):
        p.call[i] = keys[i]
    p.call_size[0] = keys.size


def on_hit(p, key, now):
    if p.freq[key] < MAX_FREQ:
        p.freq[key] += 1


def on_admit(p, key, now):
    p.freq[key] = 0
    if p.queue[key] == GHOST:
        _leave(p, key)
        _enter(p, MAIN, key)
    else:
        _enter(p, SMALL, key)


def on_evict(p, key):
    if p.queue[key] == SMALL:
        _leave(p, key)
        _enter(p, GHOST, key)
        if p.length[GHOST] > p.ghost_size:
            _leave(p, p.nxt[_sentinel(p, GHOST)])
    else:
        _leave(p, key)


def victim(p, st, key, now):
    held_s = held_m = 0  # protected keys stay in their queue below
    for i in range(p.call_size[0]):
        k = p.call[i]
        if is_protected(st, k):
            if p.queue[k] == SMALL:
                held_s += 1
            elif p.queue[k] == MAIN:
                held_m += 1
    if held_s + held_m >= p.length[SMALL] + p.length[MAIN]:
        return -1  # every resident is needed by this call
    while True:
        n_s, n_m = p.length[SMALL], p.length[MAIN]
        if n_s > held_s and (n_s >= p.small_target or n_m == held_m):
            k = p.nxt[_sentinel(p, SMALL)]
            if is_protected(st, k):
                _leave(p, k)
                _enter(p, SMALL, k)
            elif p.freq[k] > 1:
                _leave(p, k)
                _enter(p, MAIN, k)
            else:
                return k
        else:
            k = p.nxt[_sentinel(p, MAIN)]
            if is_protected(st, k):
                _leave(p, k)
                _enter(p, MAIN, k)
            elif p.freq[k] > 0:
                p.freq[k] -= 1
                _leave(p, k)
                _enter(p, MAIN, k)
            else:
                return k


S3FIFO.compiled = Compiled("s3fifo", State, setup, dict(begin_call=begin_call, on_hit=on_hit, on_admit=on_admit,
                                                         on_evict=on_evict, victim=victim))
