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

import numpy as np

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
