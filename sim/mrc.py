"""LRU miss-ratio curve for every capacity in one pass (offload split: every miss is fetched and cached).

Why it is exact for set accesses. At the start of call c the LRU order of the keys is the order of their
latest access before c (a call's keys become most recent together, in call order). So key x of call c,
previously accessed at position p, is resident in a cache of K slots iff fewer than K distinct keys were
accessed after p and before the call starts at s:

    depth = #distinct keys in stream[p + 1 : s] = #{m : p < m < s, prev[m] <= p}

(each distinct key of the window is counted at its first access in the window, the one whose previous
access lies at or before p). Inclusion holds once K >= the largest call: the resident set after a call is
the call's keys plus the K - |call| most recent other keys, i.e. always the top K of the stack. Below that
a call can overflow the cache (fetches run from staging) and the curve is only the stack model's figure.

Counting, in one compiled pass: a Fenwick tree over positions holds a mark at each key's latest access so far.
At the start of call s the marks are the distinct keys seen, one each; those of them in (p, s) are the depth, so
depth = (distinct seen) - (marks at positions <= p), one prefix query per access. After the call's queries, each
key's mark moves from p to its new position. N accesses cost O(N log N).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numba as nb
import numpy as np

from freetoken.io import atomic_path
from freetoken.placement.stream import KeyStream

COLD = -1  # depth of a first access: a miss at every capacity


@dataclass(frozen=True, slots=True)
class MissRatioCurve:
    """misses[i]: LRU misses of the stream with capacities[i] slots (capacities = 0 .. distinct keys)."""

    capacities: np.ndarray  # [D + 1] int64: 0 .. D
    misses: np.ndarray  # [D + 1] int64, non-increasing
    accesses: int
    min_exact_capacity: int  # the largest call: below it (except 0) a call may overflow the cache

    @property
    def cold_misses(self) -> int:
        return int(self.misses[-1])

    @property
    def miss_ratios(self) -> np.ndarray:
        return self.misses / max(self.accesses, 1)

    def is_exact(self, capacity: int) -> bool:
        return capacity == 0 or capacity >= self.min_exact_capacity

    def misses_at(self, capacity: int) -> int:
        """Misses of an LRU cache with `capacity` slots; beyond the distinct keys only cold misses remain."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        if not self.is_exact(capacity):
            raise ValueError(f"capacity {capacity} is below the largest call ({self.min_exact_capacity} keys): "
                             "the one-pass curve is exact only from there (or at 0); replay instead")
        return int(self.misses[min(capacity, len(self.misses) - 1)])

    def write_csv(self, path: str | os.PathLike) -> Path:
        """capacity, misses, miss_ratio, exact: one row per capacity, written atomically."""
        with atomic_path(path) as tmp, open(tmp, "w") as f:
            f.write("capacity,misses,miss_ratio,exact\n")
            for c, m, r in zip(self.capacities.tolist(), self.misses.tolist(), self.miss_ratios.tolist()):
                f.write(f"{c},{m},{r:.6g},{int(self.is_exact(c))}\n")
        return Path(path)


@nb.njit(cache=True, nogil=True)
def _depths(keys, offsets, num_keys):  # pragma: no cover - compiled
    """[N] stack depths (COLD for first accesses), or [-(i + 2)] when access i repeats a key of its own call."""
    n = keys.size
    depth = np.empty(n, np.int64)  # [N]
    prev = np.empty(n, np.int64)  # [N] the previous access of the same key, -1: none
    last = np.full(num_keys, -1, np.int64)  # [K] latest access of each key so far
    tree = np.zeros(n + 1, np.int64)  # Fenwick tree: position i at index i + 1, one mark per distinct key seen
    distinct = 0
    for c in range(offsets.size - 1):
        s, e = offsets[c], offsets[c + 1]
        for i in range(s, e):  # queries first: the call's keys all see the order at its start
            p = last[keys[i]]
            if p >= s:
                return np.full(1, -(i + 2), np.int64)
            prev[i] = p
            last[keys[i]] = i
            if p < 0:
                depth[i] = COLD
                continue
            below = 0  # marks at positions <= p
            j = p + 1
            while j > 0:
                below += tree[j]
                j -= j & -j
            depth[i] = distinct - below
        for i in range(s, e):  # then each key's mark moves to its new access
            j = i + 1
            while j <= n:
                tree[j] += 1
                j += j & -j
            if prev[i] < 0:
                distinct += 1
                continue
            j = prev[i] + 1
            while j <= n:
                tree[j] -= 1
                j += j & -j
    return depth


def stack_depths(stream: KeyStream) -> np.ndarray:
    """[N]: LRU stack depth of every access at the start of its call; COLD for first accesses."""
    keys = np.ascontiguousarray(stream.keys, np.int64)
    offsets = np.ascontiguousarray(stream.offsets, np.int64)
    if offsets.size == 0 or offsets[0] != 0 or offsets[-1] != keys.size or np.any(np.diff(offsets) < 0):
        raise ValueError(f"a key stream's offsets must rise from 0 to its {keys.size} keys")
    if keys.size and keys.min() < 0:
        raise ValueError(f"keys must be >= 0, got {int(keys.min())}")
    depth = _depths(keys, offsets, int(keys.max()) + 1 if keys.size else 0)
    if depth.size == 1 and depth[0] < COLD and keys.size:
        i = int(-depth[0] - 2)
        raise ValueError(f"key {int(keys[i])} appears twice in one call (access {i}); a call's keys are distinct")
    return depth


def lru_mrc(stream: KeyStream) -> MissRatioCurve:
    """The offload-split LRU miss count at every capacity, from one pass over the key stream."""
    depth = stack_depths(stream)
    n = depth.size
    distinct = int(np.count_nonzero(depth == COLD))
    hits_by_depth = np.bincount(depth[depth != COLD], minlength=distinct)[:distinct]  # [D]
    misses = n - np.concatenate([[0], np.cumsum(hits_by_depth)])  # [D + 1]: hits need depth < capacity
    sizes = np.diff(stream.offsets)
    return MissRatioCurve(np.arange(distinct + 1, dtype=np.int64), misses.astype(np.int64), n,
                          int(sizes.max()) if sizes.size else 0)
