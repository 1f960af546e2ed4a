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

Counting: #{m < s : prev[m] <= p} - (p + 1), offline 2D dominance, vectorised as a merge-sort tree:
level l holds prev[] sorted inside blocks of 2**l positions; the prefix [0, s) is the union of one block
per set bit of s, and each block answers with one searchsorted. N accesses cost O(N log^2 N) in numpy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from freetoken.io import atomic_path
from freetoken.placement.stream import KeyStream, previous_occurrence

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


def _previous(keys: np.ndarray) -> np.ndarray:
    """previous_occurrence, with numpy's O(N) radix sort when keys fit in 16 bits (they do for expert keys)."""
    if keys.size and 0 <= keys.min() and keys.max() < 1 << 16:
        order = np.argsort(keys.astype(np.uint16), kind="stable")  # grouped by key, in time order
        prev = np.full(keys.size, -1, np.int64)
        same = keys[order[1:]] == keys[order[:-1]]
        prev[order[1:][same]] = order[:-1][same]
        return prev
    return previous_occurrence(keys)


def stack_depths(stream: KeyStream) -> np.ndarray:
    """[N]: LRU stack depth of every access at the start of its call; COLD for first accesses."""
    # N = accesses, W = accesses with a previous one (queries)
    keys = np.asarray(stream.keys, np.int64)
    n = keys.size
    prev = _previous(keys)  # [N]
    start = np.repeat(stream.offsets[:-1], np.diff(stream.offsets)).astype(np.int64)  # [N] its call's start
    if np.any(prev >= start):
        i = int(np.flatnonzero(prev >= start)[0])
        raise ValueError(f"key {int(keys[i])} appears twice in one call (access {i}); a call's keys are distinct")
    depth = np.full(n, COLD, np.int64)
    warm = np.flatnonzero(prev >= 0)  # [W]
    if warm.size == 0:
        return depth
    p1, s = prev[warm] + 1, start[warm]  # [W] query: count m < s with prev[m] < p1; s is sorted (needles too)
    total = np.zeros(warm.size, np.int64)  # [W]
    bits = int(n + 1).bit_length()  # an entry: its position's block in the high bits, prev + 1 in the low bits
    tree = (np.arange(n, dtype=np.int64) << bits) | (prev + 1)  # [N] level 0: blocks of one position
    for level in range(int(n).bit_length()):
        if level:  # blocks of 2**level: drop one more bit of the position, re-sort (two sorted runs per block)
            tree &= ~np.int64(1 << (bits + level - 1))
            tree.sort(kind="stable")
        inside = ((s >> level) & 1) == 1  # [W] s has this bit: block (s >> level) - 1 lies inside [0, s)
        blk = (np.compress(inside, s) >> level) - 1
        found = tree.searchsorted((blk << (bits + level)) | np.compress(inside, p1), side="right")
        found -= blk << level  # entries of the earlier blocks
        np.place(total, inside, np.compress(inside, total) + found)
    depth[warm] = total - p1  # the p + 1 positions up to p all have prev <= p
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
