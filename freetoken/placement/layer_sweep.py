"""Layer-sweep eviction: evict the resident key expected to be needed furthest in the future, knowing that
every token (or prefill chunk) visits the MoE layers in order 0, 1, ..., L-1.

Global LRU fails on that cycle: the least recently used key is often one of the very next layer's. Here the
expected wait of a key, counted in calls, is

    wait(l, e) = d(l) + L * (1 / p(l, e) - 1)

d(l) in [1, L]: calls until layer l comes round again in the sweep (the layer just visited is L away);
p(l, e): an estimate of the chance that a visit of layer l uses expert e, an exponentially decayed average
of past visits (p <- decay * p + (1 - decay) * used, one step per visit of the layer), so the wait after the
next visit is geometric. `decay` is the one fitted parameter (fit on a profile trace, then applied elsewhere).

prior: [L, E] per-visit use rates from a profile trace (`visit_rates`), the starting p of every key (it decays
like any other history), and the `capacity` keys of highest prior start resident (warm, as frequency's pinned
set does; ties: lower key); None starts empty with every key at 0.

bypass=True: a missing key whose own wait (a full sweep plus its geometric tail) is longer than the victim's
is not cached (it runs from staging), as Belady's bypass does; frequent keys are not flushed by rare ones.

Cost: all layers advance one visit per sweep, so ordering keys by decayed p needs only the stored value
normalised to visit 0 (z = log p - visits * log decay), valid across layers up to one step. One heap over z
(lazily invalidated) is walked from the least likely key until no later key can wait longer (its wait is at
most L / p), or `scan` unprotected keys were examined: the exact argmax over all residents unless more than `scan` keys
have nearly the same p (then the best of the `scan` least likely). O(log n) per hit; the walk is kept for the
call's later evictions (only the call's own keys change in between), so a call pops each heap entry at most once.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

import numpy as np

from freetoken.placement.call import Call
from freetoken.placement.policy import PlacementPolicy
from freetoken.placement.protected import ProtectedMemo

_FLOOR = 1e-300  # p of a key never used: never log(0)
_SLACK = 1 - 1e-9  # rounding margin on the heap's bound


def visit_rates(calls: Iterable[Call], num_layers: int, num_experts: int) -> np.ndarray:
    """[L, E]: share of each layer's calls that use each expert (a profile for `prior`). calls: Call objects, or a
    CallStream (the same counts from its flat columns, no Python per call)."""
    from freetoken.placement.callstream import CallStream

    if isinstance(calls, CallStream):
        K = num_layers * num_experts
        counts = np.bincount(calls.keys, minlength=K)  # [>= K] calls using each key (a call's keys are distinct)
        if counts.size > K or calls.num_experts != num_experts:
            raise ValueError(f"visit_rates: the calls need more than {num_layers} layers x {num_experts} experts")
        used = counts.reshape(num_layers, num_experts).astype(np.float64)
        visits = np.bincount(calls.layer, minlength=num_layers).astype(np.float64)  # [L]
        return used / np.maximum(visits, 1)[:, None]
    used = np.zeros((num_layers, num_experts))
    visits = np.zeros(num_layers)
    for call in calls:
        used[call.layer, call.experts] += 1
        visits[call.layer] += 1
    return used / np.maximum(visits, 1)[:, None]


class LayerSweep(PlacementPolicy):
    name = "layer_sweep"

    def __init__(self, capacity: int, num_layers: int, num_experts: int, decay: float = 0.9, bypass: bool = True,
                 prior: np.ndarray | None = None, scan: int = 64):
        super().__init__(capacity, num_layers, num_experts)
        if not 0 < decay < 1:
            raise ValueError(f"layer_sweep decay must lie in (0, 1), got {decay}")
        if scan < 1:
            raise ValueError(f"layer_sweep scan must be >= 1, got {scan}")
        self.decay = decay
        self.scan = scan
        self.bypass = bypass
        self._log_decay = math.log(decay)
        n = num_layers * num_experts
        if prior is None:
            self._p = [0.0] * n  # [L * E] decayed use rate, as of the key's stamp
        else:
            prior = np.asarray(prior, np.float64)
            if prior.shape != (num_layers, num_experts) or not ((prior >= 0) & (prior <= 1)).all():
                raise ValueError(f"layer_sweep prior must be [{num_layers}, {num_experts}] rates in [0, 1], "
                                 f"got shape {prior.shape}")
            self._p = prior.reshape(-1).tolist()
        self._stamp = [0] * n  # [L * E] visit count of the key's layer when _p was stored
        self._visits = [0] * num_layers  # [L] calls seen per layer
        self._most_visits = 0  # max of _visits
        self._layer = 0  # layer of the current call
        self._z: dict[int, float] = {}  # resident key -> its heap entry's z
        self._heap: list[tuple[float, int]] = []  # (z, key), lazily invalidated
        self._walk: _Walk | None = None  # the current call's heap walk (see victim)
        if prior is not None:
            flat = np.asarray(self._p)
            warm = np.lexsort((np.arange(n), -flat))[:capacity]  # highest prior first, then lowest key
            self._place_pinned(int(k) for k in warm)
            for k in warm:
                self._push(int(k))

    # estimate
    def _rate(self, key: int) -> float:
        """p of `key` now."""
        return self._p[key] * self.decay ** (self._visits[key // self.num_experts] - self._stamp[key])

    def wait(self, key: int) -> float:
        """Expected calls until `key` is next needed."""
        L = self.num_layers
        d = (key // self.num_experts - self._layer - 1) % L + 1
        return d + L * (1.0 / max(self._rate(key), _FLOOR) - 1.0)

    def _z_of(self, key: int) -> float:
        return math.log(max(self._p[key], _FLOOR)) - self._stamp[key] * self._log_decay

    def _push(self, key: int) -> None:
        if self._walk is not None and key not in self._walk.protected.keys:
            self._end_walk()
        z = self._z_of(key)
        self._z[key] = z
        heapq.heappush(self._heap, (z, key))
        if len(self._heap) > 4 * self.capacity + 64:  # drop stale entries (the walk's live ones are in _z too)
            self._walk = None
            self._heap = [(v, k) for k, v in self._z.items()]
            heapq.heapify(self._heap)

    # hooks
    def begin_call(self, keys: list[int]) -> None:
        self._end_walk()  # waits move with the layer
        if keys:
            layer = keys[0] // self.num_experts
            self._layer = layer
            self._visits[layer] += 1
            self._most_visits = max(self._most_visits, self._visits[layer])

    def _use(self, key: int) -> None:
        if self._walk is not None and key not in self._walk.protected.keys:
            self._end_walk()
        v = self._visits[key // self.num_experts]
        self._p[key] = self._p[key] * self.decay ** (v - self._stamp[key]) + (1.0 - self.decay)
        self._stamp[key] = v

    def on_hit(self, key: int, now: int) -> None:
        self._use(key)
        self._push(key)

    def on_miss(self, key: int, now: int) -> None:
        self._use(key)

    def on_admit(self, key: int, now: int) -> None:
        self._push(key)

    def on_evict(self, key: int) -> None:
        del self._z[key]  # evictions come from victim(), which took the key's entry out of the walk

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        """The unprotected resident with the longest wait (ties: lowest key); None when `key` waits longer still.

        The heap is walked from the least likely key; the walk of one call is kept (see _Walk) and later
        evictions of the same call read it, extending it from the heap only as far as they need."""
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

    # the walk
    def _to_beat(self, key: int) -> float:
        """The wait a victim must exceed for `key` to be cached."""
        return self.wait(key) if self.bypass else -math.inf

    def _bound(self, log_p: float) -> float:
        """An upper bound on the wait of any key of rate >= exp(log_p)."""
        return self.num_layers * math.exp(-log_p) * _SLACK if log_p > -700.0 else math.inf

    def _resident_wait(self, key: int) -> float:
        return LayerSweep.wait(self, key)  # a resident's wait is layer_sweep's, whatever a subclass says of `key`

    def _walk_on(self, walk: "_Walk") -> bool:
        """Pop the heap up to the next live unprotected entry and append it to walk.found; False at the end."""
        heap, zs, protected = self._heap, self._z, walk.protected.keys
        shift = self._most_visits * self._log_decay  # exp(z + shift) <= the key's p now, for any layer
        pop = heapq.heappop
        while heap:
            item = pop(heap)
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
            push, heap = heapq.heappush, self._heap
            for item in walk.held:
                push(heap, item)
            for _, _, k, z in walk.found:
                push(heap, (z, k))


class _Walk:
    """The heap walk of one call's evictions, ascending p. Between two evictions of a call only its own
    (protected) keys change (their uses and admissions) and the evicted key leaves, so what the walk found stays
    valid until the call ends or the protected set changes; its entries stay off the heap meanwhile.
    held: popped entries of protected keys; found: (bound, wait, key, z) of unprotected residents, in heap order."""

    __slots__ = ("protected", "held", "found")

    def __init__(self) -> None:
        self.protected = ProtectedMemo()
        self.held: list[tuple[float, int]] = []
        self.found: list[tuple[float, float, int, float]] = []
