"""Belady's MIN: evict the resident key whose next use is furthest away. Needs the future: the bound.

Given the KeyStream of every call in the order they will be planned (sim.calls builds it from a trace).
Next use is counted in calls: a call needs all its keys at once, so position inside a call does not matter.
Ties in the next call are broken by the use after it (then the one after that): with set accesses a tie is
common (a whole sweep's keys next meet in the same call) and the key needed again later is the better victim.
With bypass, a call's fetched keys are offered slots soonest-needed first (admission_order), so a free slot
never goes to a key that a later key of the same call outranks.
bypass=True: a fetched key used later than every evictable resident is not cached (the optimum when caching
is optional, as in offload where the transfer happens anyway); bypass=False always caches (classic MIN).
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import is_protected
from freetoken.placement.compiled.form import Compiled, Setup
from freetoken.placement.compiled.heap import before, refile, remove_key
from freetoken.placement.policy import PlacementPolicy
from freetoken.placement.protected import ProtectedMemo
from freetoken.placement.stream import NEVER, KeyStream, next_occurrence

TIE_DEPTH = 3  # uses compared: the next call, then the two after it


def _due_codes(future: KeyStream, depth: int) -> list[int]:
    """[N]: for access i, the calls of the key's next `depth` uses (NEVER -> past the last call) as one int that
    orders like the tuple (next call, the one after, ...): one int compare on the hot path."""
    nxt = next_occurrence(future.keys)  # [N]
    call_of = future.call_ids()
    base = future.num_calls + 1  # a never-used key sorts after every call
    wide = base ** depth >= 2**63
    code = np.zeros(nxt.size, dtype=object if wide else np.int64)
    at, last = np.arange(nxt.size, dtype=np.int64), max(nxt.size - 1, 0)
    for _ in range(depth):
        at = np.where(at == NEVER, NEVER, nxt[np.minimum(at, last)])
        use = np.where(at == NEVER, future.num_calls, call_of[np.minimum(at, last)])
        code = code * base + (use.astype(object) if wide else use)
    return code.tolist()


class Belady(PlacementPolicy):
    name = "belady"
    needs_future = True

    def __init__(self, capacity: int, num_layers: int, num_experts: int, future: KeyStream | None = None,
                 bypass: bool = True):
        super().__init__(capacity, num_layers, num_experts)
        if future is None:
            raise ValueError("belady needs the future key stream (an offline bound: simulator, or a recorded trace)")
        self._next = _due_codes(future, TIE_DEPTH)  # [N]
        self._keys = future.keys.tolist()
        self._offsets = future.offsets.tolist()
        self.bypass = bypass
        self._orders_admission = bypass  # classic MIN (always cache) admits in call order
        self._call = 0
        self._due_now: dict[int, int] = {}  # key of the current call -> its next uses (as _due_codes)
        self._heap: list[tuple[int, int]] = []  # (-due, key), lazily invalidated
        self._due: dict[int, int] = {}  # resident key -> its due
        self._held: list[tuple[int, int]] = []  # heap entries of protected keys, set aside (see victim)
        self._protected = ProtectedMemo()  # the protected set they were set aside for

    def begin_call(self, keys: list[int]) -> None:
        c = self._call
        if c >= len(self._offsets) - 1:
            raise ValueError(f"belady: call {c} is past the end of the future it was given")
        lo, hi = self._offsets[c], self._offsets[c + 1]
        if self._keys[lo:hi] != keys:
            raise ValueError(f"belady: call {c} asks for keys {keys}, the future it was given says {self._keys[lo:hi]}")
        self._due_now = dict(zip(keys, self._next[lo:hi]))
        self._call = c + 1

    def admission_order(self, keys: list[int]) -> list[int]:
        due = self._due_now
        return sorted(keys, key=lambda k: (due[k], k))

    def _remember(self, key: int) -> None:
        due = self._due_now[key]
        self._due[key] = due
        heapq.heappush(self._heap, (-due, key))

    def on_hit(self, key: int, now: int) -> None:
        self._remember(key)

    def on_admit(self, key: int, now: int) -> None:
        self._remember(key)

    def on_evict(self, key: int) -> None:
        del self._due[key]

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        """The resident, not protected, used furthest in the future (ties: lowest key).

        Protected keys met at the heap's top are set aside and stay aside while the same protected set comes
        back (the evictions of one call): each moves once per call, not once per eviction. The heap and the
        set-aside entries together always hold every live entry, and a set-aside one is of a protected key,
        never the answer while that set is the one given."""
        if not self._protected.same(protected):
            self._restore_held()
        heap, due, held_for = self._heap, self._due, self._protected.keys
        out = None
        while heap:
            neg, k = heap[0]
            if due.get(k) != -neg:  # stale: evicted, or re-used since
                heapq.heappop(heap)
            elif k in held_for:
                self._held.append(heapq.heappop(heap))
            else:
                out = k
                break
        if out is not None and self.bypass and self._due_now[key] >= due[out]:
            return None
        return out

    def _restore_held(self) -> None:
        for item in self._held:
            heapq.heappush(self._heap, item)
        self._held = []


# ── compiled: the same decision on arrays (freetoken/placement/compiled) ─────────────────────────────────────────────
# A due is (next call, the calls of the two uses after it) as the pair hi, lo (the reference's one Python int may
# not fit 64 bits). Residents sit in an indexed max-heap by due (compiled/heap.py): the victim walks down from the
# root past protected keys only, so a call's own keys cost no pops and re-pushes.

class State(NamedTuple):
    keys: np.ndarray  # int64 [N] the future's keys (_keys)
    offsets: np.ndarray  # int64 [C + 1] (_offsets)
    next_hi: np.ndarray  # int64 [N] each access's due: the call of the key's next use (_next)
    next_lo: np.ndarray  # int64 [N] and of the two uses after it, as one int
    due_now_hi: np.ndarray  # int64 [K] the current call's keys: their due (_due_now)
    due_now_lo: np.ndarray  # int64 [K]
    due_hi: np.ndarray  # int64 [K] each resident: its due (_due)
    due_lo: np.ndarray  # int64 [K]
    heap: np.ndarray  # int64 [C + 1] residents, the furthest due first (_heap, indexed: no stale entries)
    heap_pos: np.ndarray  # int64 [K] each key's index in it, -1: not on it
    heap_size: np.ndarray  # int64 [1]
    stack: np.ndarray  # int64 [C + 1] the victim's walk
    bypass: bool


def setup(capacity: int, num_layers: int, num_experts: int, future=None, bypass: bool = True) -> Setup:
    if future is None:
        raise ValueError("belady needs the future key stream (an offline bound: simulator, or a recorded trace)")
    K = num_layers * num_experts
    keys = np.ascontiguousarray(future.keys, np.int64)
    offsets = np.ascontiguousarray(future.offsets, np.int64)
    if keys.size and (keys.min() < 0 or keys.max() >= K):
        raise ValueError(f"belady: the future's keys must lie in [0, {K}) ({num_layers} layers x {num_experts} "
                         f"experts), got [{keys.min()}, {keys.max()}]")
    hi, lo = due_pairs(keys, offsets, K)
    z = np.zeros
    state = State(keys, offsets, hi, lo, z(K, np.int64), z(K, np.int64), z(K, np.int64), z(K, np.int64),
                  z(capacity + 1, np.int64), np.full(K, -1, np.int64), z(1, np.int64), z(capacity + 1, np.int64),
                  bool(bypass))
    return Setup(state, orders_admission=bool(bypass))  # classic MIN (always cache) admits in call order


def due_pairs(keys, offsets, num_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """[N] each access's due as (hi: call of the next use, lo: calls of the two after as one int); a use that never
    comes counts as call C (after every call). One backward pass (the reference: _due_codes). Its arrays are
    allocated here: the compiled pass allocates nothing (compiled without the runtime, less to compile)."""
    N = keys.size
    hi, lo = np.empty(N, np.int64), np.empty(N, np.int64)
    _due_pairs(keys, offsets, np.empty(N, np.int64), np.empty(N, np.int64), np.full(num_keys, -1, np.int64), hi, lo)
    return hi, lo


@jit(entry=True)
def _due_pairs(keys, offsets, call_of, nxt, last, hi, lo):
    """due_pairs' pass; call_of, nxt [N] scratch, last [K] all -1."""
    N, C = keys.size, offsets.size - 1
    for c in range(C):
        for i in range(offsets[c], offsets[c + 1]):
            call_of[i] = c
    for i in range(N - 1, -1, -1):
        nxt[i] = last[keys[i]]
        last[keys[i]] = i
    for i in range(N):
        at = nxt[i]
        hi[i] = call_of[at] if at >= 0 else C
        code = 0
        for _ in range(TIE_DEPTH - 1):
            if at >= 0:
                at = nxt[at]
            code = code * (C + 1) + (call_of[at] if at >= 0 else C)
        lo[i] = code


def begin_call(p, st, c, keys, tokens, phase):
    if c >= p.offsets.size - 1:
        raise ValueError("belady: a call is past the end of the future it was given")
    start = p.offsets[c]
    if p.offsets[c + 1] - start != keys.size:
        raise ValueError("belady: a call's keys differ from the future it was given (calls must come in its order)")
    for i in range(keys.size):
        k = keys[i]
        if p.keys[start + i] != k:
            raise ValueError("belady: a call's keys differ from the future it was given (calls must come in its order)")
        p.due_now_hi[k] = p.next_hi[start + i]
        p.due_now_lo[k] = p.next_lo[start + i]


@jit
def _remember(p, key):
    p.due_hi[key] = p.due_now_hi[key]
    p.due_lo[key] = p.due_now_lo[key]
    refile(p.heap, p.heap_pos, p.heap_size, 0, p.due_hi, p.due_lo, True, key)


def on_hit(p, key, now):
    _remember(p, key)


def on_admit(p, key, now):
    _remember(p, key)


def on_evict(p, key):
    remove_key(p.heap, p.heap_pos, p.heap_size, 0, p.due_hi, p.due_lo, True, key)


def victim(p, st, key, now):
    """The best of the unprotected nodes whose ancestors are all protected is the heap's best unprotected key."""
    heap, stack, n = p.heap, p.stack, p.heap_size[0]
    best = -1
    top = 0
    if n > 0:
        stack[0] = 0
        top = 1
    while top > 0:
        top -= 1
        i = stack[top]
        k = heap[i]
        if is_protected(st, k):
            for child in (2 * i + 1, 2 * i + 2):
                if child < n:
                    stack[top] = child
                    top += 1
        elif best < 0 or before(p.due_hi, p.due_lo, True, k, best):  # a later due, ties to the lower key
            best = k
    if best >= 0 and p.bypass:  # not cached if used no sooner than the victim
        if (p.due_now_hi[key], p.due_now_lo[key]) >= (p.due_hi[best], p.due_lo[best]):
            return -1
    return best


def admission_order(p, keys, n, order):
    """Soonest due first, ties to the lower key (insertion sort: a call's fetches are few)."""
    for a in range(n):
        order[a] = a
    for a in range(1, n):
        j = order[a]
        b = a - 1
        while b >= 0:
            o = order[b]
            ko, kj = keys[o], keys[j]
            if (p.due_now_hi[ko], p.due_now_lo[ko], ko) <= (p.due_now_hi[kj], p.due_now_lo[kj], kj):
                break
            order[b + 1] = o
            b -= 1
        order[b + 1] = j


Belady.compiled = Compiled("belady", State, setup, dict(
    begin_call=begin_call, on_hit=on_hit, on_admit=on_admit, on_evict=on_evict, victim=victim,
    admission_order=admission_order))
