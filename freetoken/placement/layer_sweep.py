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
have nearly the same p (then the best of the `scan` least likely). O(log n) per hit, O(scan log n) per eviction.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

import numpy as np

from freetoken.placement.call import Call
from freetoken.placement.policy import PlacementPolicy

_FLOOR = 1e-300  # p of a key never used: never log(0)
_SLACK = 1 - 1e-9  # rounding margin on the heap's bound


def visit_rates(calls: Iterable[Call], num_layers: int, num_experts: int) -> np.ndarray:
    """[L, E]: share of each layer's calls that use each expert (a profile for `prior`)."""
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
        z = self._z_of(key)
        self._z[key] = z
        heapq.heappush(self._heap, (z, key))
        if len(self._heap) > 4 * self.capacity + 64:  # drop stale entries
            self._heap = [(v, k) for k, v in self._z.items()]
            heapq.heapify(self._heap)

    # hooks
    def begin_call(self, keys: list[int]) -> None:
        if keys:
            layer = keys[0] // self.num_experts
            self._layer = layer
            self._visits[layer] += 1
            self._most_visits = max(self._most_visits, self._visits[layer])

    def _use(self, key: int) -> None:
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
        del self._z[key]

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        """The unprotected resident with the longest wait (ties: lowest key); None when `key` waits longer still."""
        heap, zs, L, E = self._heap, self._z, self.num_layers, self.num_experts
        p, stamp, visits, decay, layer = self._p, self._stamp, self._visits, self.decay, self._layer
        shift = self._most_visits * self._log_decay  # exp(z + shift) <= the key's p now, for any layer
        to_beat = self.wait(key) if self.bypass else -math.inf
        seen, best, best_wait = [], None, -math.inf
        pop, exp = heapq.heappop, math.exp
        budget = self.scan
        while heap and budget:
            z, k = heap[0]
            if zs.get(k) != z:  # stale: evicted, or used since
                pop(heap)
                continue
            log_p = z + shift
            # heap order is ascending p, so no key after this one waits longer than L / p_low
            if log_p > -700.0 and L * exp(-log_p) * _SLACK < (best_wait if best_wait > to_beat else to_beat):
                break
            seen.append(pop(heap))
            if k not in protected:  # protected keys do not count: at most the call's (and hinted) keys
                budget -= 1
                l = k // E
                rate = p[k] * decay ** (visits[l] - stamp[k])
                w = (l - layer - 1) % L + 1 + L * (1.0 / (rate if rate > _FLOOR else _FLOOR) - 1.0)  # = wait(k)
                if w > best_wait or (w == best_wait and k < best):
                    best, best_wait = k, w
        push = heapq.heappush
        for item in seen:
            if item[1] != best:
                push(heap, item)
        if best is None or to_beat > best_wait:
            if best is not None:
                push(heap, (zs[best], best))
            return None
        return best
