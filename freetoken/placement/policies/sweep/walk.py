"""The layer-sweep family's victim: the unprotected resident with the longest wait (ties: lowest key), found by
walking the residents from the least likely key (ascending z, layer_sweep.py) until no later key can wait longer
than the best so far (its wait is at most its `bound`), or `scan` unprotected keys were read; none when the key to
cache waits longer still (`to_beat`: bypass, or a hinted prefetch). A call's later evictions resume its walk: between
two of them only the call's own (protected) keys change, and the evicted key leaves.

Both executors: VictimWalk, the reference's (a mixin of LayerSweep over its lazily invalidated heap), and below the
banner the compiled walk over the indexed heap of residents (layer_sweep.Residents).
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np

from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.core import is_protected
from freetoken.placement.compiled.heap import front_down, front_up
from freetoken.placement.compiled.hooks import overridable
from freetoken.placement.protected import ProtectedMemo

SLACK = 1 - 1e-9  # rounding margin on the bound


class VictimWalk:
    """LayerSweep's victim() and its walk, over its _heap / _z; _to_beat, _bound and LayerSweep's _resident_wait are
    what a subclass overrides (the compiled overridables of the same names below)."""

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        walk = self._walk
        if walk is None or not walk.protected.same(protected):
            self._end_walk()
            walk = self._walk = _Walk()
            walk.protected.same(protected)
        to_beat = self._to_beat(key)
        found = walk.found
        best, best_wait, at = None, -math.inf, -1
        for i in range(self.scan):  # protected keys do not count: at most the call's (and hinted) keys
            if i == len(found) and not self._walk_on(walk):
                break
            bound, w, k, _ = found[i]
            # heap order is ascending p, so no key after this one waits longer than its bound
            if bound < (best_wait if best_wait > to_beat else to_beat):
                break
            if w > best_wait or (w == best_wait and k < best):
                best, best_wait, at = k, w, i
        if best is None or to_beat > best_wait:
            return None
        del found[at]  # its heap entry goes with it: the key leaves
        return best

    def _to_beat(self, key: int) -> float:
        """The wait a victim must exceed for `key` to be cached."""
        return self.wait(key) if self.bypass else -math.inf

    def _bound(self, log_p: float) -> float:
        """An upper bound on the wait of any key of rate >= exp(log_p)."""
        return self.num_layers * math.exp(-log_p) * SLACK if log_p > -700.0 else math.inf

    def _walk_on(self, walk: _Walk) -> bool:
        """Pop the heap up to the next live unprotected entry and append it to walk.found; False at the end."""
        heap, zs, protected = self._heap, self._z, walk.protected.keys
        shift = self._most_visits * self._log_decay  # exp(z + shift) <= the key's p now, for any layer
        while heap:
            item = heapq.heappop(heap)
            z, k = item
            if zs.get(k) != z:  # stale: evicted, or used since
                continue
            if k in protected:
                walk.held.append(item)
                continue
            walk.found.append((self._bound(z + shift), self._resident_wait(k), k, z))
            return True
        return False

    def _end_walk(self) -> None:
        """Put the walk's entries back on the heap (the call is over, or an unprotected key changed)."""
        walk, self._walk = self._walk, None
        if walk is not None:
            for item in walk.held:
                heapq.heappush(self._heap, item)
            for _, _, k, z in walk.found:
                heapq.heappush(self._heap, (z, k))


class _Walk:
    """The heap walk of one call's evictions, ascending p; its entries stay off the heap meanwhile.
    held: popped entries of protected keys; found: (bound, wait, key, z) of unprotected residents, in heap order."""

    __slots__ = ("protected", "held", "found")

    def __init__(self) -> None:
        self.protected = ProtectedMemo()
        self.held: list[tuple[float, int]] = []
        self.found: list[tuple[float, float, int, float]] = []


# ── compiled: the same walk over the indexed heap (freetoken/placement/compiled) ────────────────────────────────────
# The heap does not change during a call (layer_sweep.settle applies the call's changes when the next begins), so
# the walk reads it in (z, key) order without popping it: a frontier heap holds the keys whose parent was read. The
# scan keeps its stop rule without to_beat so a call's later evictions resume it (see scan).

class Walk(NamedTuple):
    front: np.ndarray  # int64 [C + 2] the frontier, a heap of keys by (z, key)
    n_front: np.ndarray  # int64 [1] its size; -1: no walk under way
    found: np.ndarray  # int64 [C + 1] unprotected residents read, in heap order (_Walk.found)
    bounds: np.ndarray  # float64 [C + 1] their bounds
    waits: np.ndarray  # float64 [C + 1] their waits
    best: np.ndarray  # int64 [C + 1] best[i]: the index of the longest wait in found[:i + 1]
    least: np.ndarray  # float64 [C + 1] least[i]: the least bound in found[:i + 1]
    n_found: np.ndarray  # int64 [1]
    n_scanned: np.ndarray  # int64 [1]


def new_walk(capacity: int) -> Walk:
    z, n = np.zeros, capacity + 1
    return Walk(z(n + 1, np.int64), np.full(1, -1, np.int64), z(n, np.int64), z(n), z(n), z(n, np.int64), z(n),
                z(1, np.int64), z(1, np.int64))


# what each policy of the family says (layer_sweep.py registers its own; lookahead and hinted_sweep override)
@overridable
def to_beat(p, key):
    """_to_beat."""
    raise TypeError("a sweep State registers to_beat")


@overridable
def bound(p, log_p):
    """_bound."""
    raise TypeError("a sweep State registers bound")


@overridable
def resident_wait(p, key):
    """_resident_wait."""
    raise TypeError("a sweep State registers resident_wait")


@overridable
def walk_skips(p, key):
    """A key the walk passes besides the protected (lookahead: the pending ones)."""
    return False


@jit
def end_walk(walk):
    """Forget the walk: the next one reads the heap from its root."""
    walk.n_front[0] = -1
    walk.n_found[0] = walk.n_scanned[0] = 0


@jit
def walk_on(p, st, shift):
    """Read the heap on, in (z, key) order, up to the next unprotected resident and append it to the walk's found
    list; False at the end. The frontier holds the keys whose parent was read."""
    walk, z, heap, pos = p.walk, p.residents.z, p.residents.heap, p.residents.pos
    front, n = walk.front, p.residents.size[0]
    if walk.n_front[0] < 0:  # a fresh walk: from the root
        walk.n_front[0] = 0
        if n > 0:
            front[0] = heap[0]
            walk.n_front[0] = 1
    while walk.n_front[0] > 0:
        k = front[0]
        child = 2 * pos[k] + 1  # k's children in the heap take its place in the frontier
        m = walk.n_front[0]
        if child < n:
            front[0] = heap[child]
            front_down(front, m, z)
            if child + 1 < n:
                front[m] = heap[child + 1]
                front_up(front, m, z)
                m += 1
        else:
            m -= 1
            front[0] = front[m]
            front_down(front, m, z)
        walk.n_front[0] = m
        # skipped: protected, evicted earlier in this call (still on the heap), or the policy's own skips
        if is_protected(st, k) or st.slot_of[k] < 0 or walk_skips(p, k):
            continue
        log_p = z[k] + shift
        i = walk.n_found[0]
        walk.found[i], walk.bounds[i] = k, bound(p, log_p) if log_p > -700.0 else np.inf
        walk.waits[i] = resident_wait(p, k)
        walk.n_found[0] = i + 1
        return True
    return False


@jit
def scan(p, st, beat):
    """The reference's scan of the walk: the index in found of the unprotected resident with the longest wait
    (ties: lowest key) among those read before a bound stops it or `scan` were read; -1 when there is none or the
    reference bypasses for a key waiting `beat` (-inf: never).

    The reference stops at the first bound under max(longest wait so far, to_beat). The scan here keeps its stop
    rule without to_beat (found[:n_scanned] scanned; best[i], least[i]: the argmax and the least bound of
    found[:i + 1]), so a call's later evictions resume it: found only grows between evictions, and an eviction
    keeps the scan before its index. to_beat then only cuts it short: at the first bound under to_beat the
    reference stops with nothing found waiting longer than that bound (the scan passed it), so it bypasses; if no
    bound falls under to_beat, both stop where the scan does, with the same argmax."""
    walk = p.walk
    found, bounds, waits, best, least = walk.found, walk.bounds, walk.waits, walk.best, walk.least
    i = walk.n_scanned[0]
    if i > 0 and least[i - 1] < beat:
        return -1
    at = best[i - 1] if i > 0 else -1
    best_wait = waits[at] if at >= 0 else -np.inf
    low = least[i - 1] if i > 0 else np.inf
    shift = p.rates.most_visits[0] * p.rates.log_decay  # exp(z + shift) <= the key's p now, for any layer
    while i < p.scan:  # protected keys do not count
        if i == walk.n_found[0] and not walk_on(p, st, shift):
            break
        if bounds[i] < best_wait:
            break  # heap order is ascending p: no later key waits longer
        if bounds[i] < beat:
            walk.n_scanned[0] = i
            return -1
        w = waits[i]
        if w > best_wait or (at >= 0 and w == best_wait and found[i] < found[at]):
            at, best_wait = i, w
        best[i] = at
        low = min(low, bounds[i])
        least[i] = low
        i += 1
    walk.n_scanned[0] = i
    return -1 if at < 0 or beat > best_wait else at


@jit
def victim(p, st, key, now):
    """VictimWalk.victim."""
    walk = p.walk
    at = scan(p, st, to_beat(p, key))
    if at < 0:
        return -1
    out = walk.found[at]
    n = walk.n_found[0] - 1  # the victim leaves the walk (and the heap when the next call begins)
    for i in range(at, n):
        walk.found[i], walk.bounds[i], walk.waits[i] = walk.found[i + 1], walk.bounds[i + 1], walk.waits[i + 1]
    walk.n_found[0] = n
    walk.n_scanned[0] = at  # the scan before the victim stands
    return out
