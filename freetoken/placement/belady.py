"""Belady's MIN: evict the resident key whose next use is furthest away. Needs the future: the bound.

Given the KeyStream of every call in the order they will be planned (sim.calls builds it from a trace).
Next use is counted in calls: a call needs all its keys at once, so position inside a call does not matter.
bypass=True: a fetched key used later than every evictable resident is not cached (the optimum when caching
is optional, as in offload where the transfer happens anyway); bypass=False always caches (classic MIN).
"""

from __future__ import annotations

import heapq

import numpy as np

from freetoken.placement.policy import PlacementPolicy
from freetoken.placement.stream import NEVER, KeyStream, next_occurrence


class Belady(PlacementPolicy):
    name = "belady"
    needs_future = True

    def __init__(self, capacity: int, num_layers: int, num_experts: int, future: KeyStream | None = None,
                 bypass: bool = True):
        super().__init__(capacity, num_layers, num_experts)
        if future is None:
            raise ValueError("belady needs the future key stream (an offline bound: simulator, or a recorded trace)")
        nxt = next_occurrence(future.keys)
        call_of = future.call_ids()
        next_call = np.where(nxt == NEVER, NEVER, call_of[np.minimum(nxt, len(call_of) - 1)])
        self._keys = future.keys.tolist()
        self._next_call = next_call.tolist()
        self._offsets = future.offsets.tolist()
        self.bypass = bypass
        self._call = 0
        self._due_now: dict[int, int] = {}  # key of the current call -> its next call
        self._heap: list[tuple[int, int]] = []  # (-next call, key), lazily invalidated
        self._due: dict[int, int] = {}  # resident key -> its next call

    def begin_call(self, keys: list[int]) -> None:
        c = self._call
        if c >= len(self._offsets) - 1:
            raise ValueError(f"belady: call {c} is past the end of the future it was given")
        lo, hi = self._offsets[c], self._offsets[c + 1]
        if self._keys[lo:hi] != keys:
            raise ValueError(f"belady: call {c} asks for keys {keys}, the future it was given says {self._keys[lo:hi]}")
        self._due_now = dict(zip(keys, self._next_call[lo:hi]))
        self._call = c + 1

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
        heap, due = self._heap, self._due
        held, out = [], None
        while heap:
            neg, k = heap[0]
            if due.get(k) != -neg:  # stale: evicted, or re-used since
                heapq.heappop(heap)
            elif k in protected:
                held.append(heapq.heappop(heap))
            else:
                out = k
                break
        for item in held:
            heapq.heappush(heap, item)
        if out is not None and self.bypass and self._due_now[key] >= due[out]:
            return None
        return out
