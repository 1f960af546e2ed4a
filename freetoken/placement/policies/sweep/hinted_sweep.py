"""Cost-aware router lookahead: the early router's picks for the next layers refine layer_sweep's expected waits,
and a predicted expert is prefetched only when it is expected back sooner than the resident it would displace.

layer_sweep's wait is wait = d + (1 - r) L / p with r = p: the chance that the key's next layer visit uses it.
A hint for layer l (made `j` calls ahead, right with probability a_j) is evidence about that one visit, and
Bayes' rule replaces r for every key of l:

    predicted:     r = p a / (p a + (1 - p) q)              q = n (1 - a) / (E - 1): chance that one of the
    not predicted: r = p (1 - a) / (p (1 - a) + (1 - p)(1 - q))  n predictions of l lands on a key not used

(the oracle's noise: each true pick replaced by a uniformly drawn other expert). With a = 1 a predicted key waits
exactly d and an unpredicted one of a hinted layer d + L / p, a full sweep more than layer_sweep thinks: the
good victims. p in the prior odds is floored at PRIOR_FLOOR n / E (a never-used key still has some chance; the
geometric tail L / p keeps layer_sweep's floor).

Prefetch: a predicted key with r >= min_confidence is copied into a free slot, or in place of the victim only
when the victim's wait is longer than its own (the bypass test of a demand miss), so a wrong prefetch costs at
most one copy and displaces only a key that is expected back later anyway. min_confidence > 1 never prefetches:
the hint then only steers eviction, which is where it can save copies (a prefetch only moves one earlier).

The hint is `upcoming(call) -> keys` (live: the router of the next layers run on the hidden state that routed
this call; simulator: `DistanceOracle`), asked at the start of each call's plan, so it steers this call's own
evictions and then its prefetches; keys of layers outside (call.layer, call.layer + depth] are ignored.

`carry` (placement.carry) adds, for the same hinted layers, the keys the rejected drafts of the verify step before
routed to (speculative decoding). They join their layer's predictions: its a stays the distance's (a used key is
named at least as often as by the router alone) and the extra names raise its n, so its q.

`accuracy` is assumed. measure=True replaces it, for a layer one call ahead, by the accuracy the hint has shown
in this run so far: of the keys the next-layer calls used, the share the hint of the call before named (a running
tally per layer, which the engine keeps as well: the truth arrives one call after each prediction). A layer not
yet scored keeps the option's a.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from typing import NamedTuple

import numpy as np

from freetoken.placement.call import Call
from freetoken.placement.carry import CarriedHint
from freetoken.placement.compiled.cache import jit
from freetoken.placement.policies.sweep import layer_sweep, lookahead
from freetoken.placement.policies.sweep.layer_sweep import FLOOR, LayerSweep
from freetoken.placement.policies.sweep.lookahead import FutureOracle, noisy_keys
from freetoken.placement.policies.sweep.walk import SLACK
from freetoken.placement.stream import KeyStream

PRIOR_FLOOR = 0.25  # share of the uniform rate n / E a key's prior odds never fall under


def accuracies(accuracy: float | Sequence[float], depth: int) -> tuple[float, ...]:
    """Per-distance accuracy: a sequence as given (one per distance 1..depth), a number a as a ** j."""
    if depth < 1:
        raise ValueError(f"hinted_sweep depth must be >= 1, got {depth}")
    given = [accuracy] if np.isscalar(accuracy) else list(accuracy)
    if not all(isinstance(a, numbers.Real) and not isinstance(a, bool) for a in given):
        acc = ()  # words, not numbers: the error below
    elif np.isscalar(accuracy):
        acc = tuple(float(accuracy) ** j for j in range(1, depth + 1))
    else:
        acc = tuple(float(a) for a in given)
    if len(acc) != depth or not all(0 <= a <= 1 for a in acc):
        raise ValueError(f"hinted_sweep accuracy must be one number or {depth} numbers in [0, 1], got {accuracy!r}")
    return acc


def distance_predictions(future: KeyStream, num_experts: int, acc: Sequence[float], seed: int) -> list[np.ndarray]:
    """Per distance j = 1..len(acc): [N] the key predicted j calls ahead for each access of the future."""
    if num_experts < 2 and min(acc) < 1:
        raise ValueError("hinted_sweep accuracy < 1 needs at least 2 experts per layer to draw a wrong one from")
    rng = np.random.default_rng(seed)
    return [noisy_keys(future.keys, num_experts, a, rng) for a in acc]


class DistanceOracle(FutureOracle):
    """The true experts of the next calls of the same sweep, each one at distance j replaced by a uniformly drawn
    other expert of its layer with probability 1 - acc[j - 1]. Every (call, distance) pair draws its own noise (a
    later, nearer prediction of the same call is redrawn)."""

    def __init__(self, future: KeyStream, num_experts: int, acc: Sequence[float], seed: int = 0):
        super().__init__(future, num_experts, distance_predictions(future, num_experts, acc, seed), len(acc),
                         "hinted_sweep")


class HintedSweep(LayerSweep):
    name = "hinted_sweep"
    needs_future = True  # in the simulator: the oracle's source; live, pass hint= instead

    def __init__(self, capacity: int, num_layers: int, num_experts: int, future: KeyStream | None = None,
                 accuracy: float | Sequence[float] = 0.8, depth: int = 1, min_confidence: float = 0.9,
                 seed: int = 0, hint=None, decay: float = 0.9, bypass: bool = True, prior=None, scan: int = 64,
                 measure: bool = False, carry=None):
        super().__init__(capacity, num_layers, num_experts, decay=decay, bypass=bypass, prior=prior, scan=scan)
        self.measure = measure
        self._named_right = [0] * num_layers  # per layer: used keys the hint named one call before (measure)
        self._used = [0] * num_layers  # per layer: keys its scored calls used
        self._named_next: tuple[int, set[int]] | None = None  # (layer, keys) the standing hint named one call on
        self.acc = accuracies(accuracy, depth)
        self.depth = depth
        self.min_confidence = min_confidence
        if hint is None:
            if future is None:
                raise ValueError("hinted_sweep needs a router hint (live engine) or the future key stream "
                                 "(simulator) to build a noisy oracle from")
            hint = DistanceOracle(future, num_experts, self.acc, seed)
        if carry is not None:
            hint = CarriedHint(hint, carry, num_layers, num_experts, depth, self.name)
        self.hint = hint
        self._hinted: dict[int, tuple[float, float, int]] = {}  # hinted layer -> (accuracy a, chance q, n)
        self._predicted: set[int] = set()  # keys named by the standing hint
        self._predicted_order: list[int] = []  # the same, nearest first
        self._reach = 0  # distance of the furthest hinted layer (0: none)

    # the hint
    def plan(self, call: Call, split):
        self._take_hint(call)  # before the call's own misses pick victims: the hint is as old as the routing
        return super().plan(call, split)

    def _take_hint(self, call: Call) -> None:
        E, lo = self.num_experts, call.layer + 1
        if self.measure:
            self._score(call)
        keys = [k for k in self.hint.upcoming(call) if lo <= k // E <= call.layer + self.depth]
        per_layer: dict[int, int] = {}
        for k in keys:
            per_layer[k // E] = per_layer.get(k // E, 0) + 1
        self._hinted = {}
        self._reach = 0
        for layer, n in per_layer.items():
            j = layer - call.layer
            a = self.acc[j - 1]
            if self.measure and layer == lo and self._used[layer]:
                a = self._named_right[layer] / self._used[layer]
            self._hinted[layer] = (a, min(1.0, n * (1 - a) / (E - 1)), n)
            self._reach = max(self._reach, j)
        self._predicted = set(keys)
        self._predicted_order = keys
        if self.measure:
            self._named_next = (lo, {k for k in keys if k // E == lo})

    def _score(self, call: Call) -> None:
        """Tally the standing hint's naming of this call's keys, when it was made one call before for this layer."""
        named, self._named_next = self._named_next, None
        if named is not None and named[0] == call.layer:
            used = {call.layer * self.num_experts + e for e in call.experts}
            self._named_right[call.layer] += len(used & named[1])
            self._used[call.layer] += len(used)

    def measured_accuracy(self) -> list[float]:
        """[L] the hint's accuracy one call ahead so far, per layer (nan: not scored yet; measure=True only)."""
        return [r / u if u else math.nan for r, u in zip(self._named_right, self._used)]

    def prefetch_for(self, call: Call) -> list[int]:
        return [k for k in self._predicted_order if self.confidence(k) >= self.min_confidence]

    def _posterior(self, key: int) -> tuple[float, float]:
        """(r, p): r the chance that the next visit of the key's layer uses it given the standing hint, p the
        per-visit rate its geometric tail runs at (floored in a hinted layer)."""
        layer = key // self.num_experts
        p = self._rate(key)
        hinted = self._hinted.get(layer)
        if hinted is None:
            return p, max(p, FLOOR)
        a, q, n = hinted
        p = min(max(p, PRIOR_FLOOR * n / self.num_experts), 1.0)
        if key in self._predicted:
            num, den = p * a, p * a + (1 - p) * q
        else:
            num, den = p * (1 - a), p * (1 - a) + (1 - p) * (1 - q)
        return (num / den if den > 0 else 0.0), p

    def confidence(self, key: int) -> float:
        return self._posterior(key)[0]

    def wait(self, key: int) -> float:
        """Expected calls until `key` is next needed: d + (1 - r) L / p."""
        if key // self.num_experts not in self._hinted:
            return super().wait(key)
        L = self.num_layers
        d = (key // self.num_experts - self._layer - 1) % L + 1
        r, p = self._posterior(key)
        return d + (1.0 - r) * L / p

    # the victim: layer_sweep's heap walk, with the hint in the waits. A key of a layer hinted j <= reach calls
    # ahead waits j + (1 - r) L / p' <= reach + L / p (p' >= p), any other d + L (1 / p - 1) <= L / p, so no key
    # after one of rate p waits longer than reach + L / p (a bound L + L / p made the walk pop ~6x more keys). A
    # prefetch (a predicted key of a hinted layer) is always weighed against the victim, a demand miss only under
    # bypass.
    def _to_beat(self, key: int) -> float:
        prefetch = key in self._predicted and key // self.num_experts in self._hinted
        return self.wait(key) if (self.bypass or prefetch) else -math.inf

    def _bound(self, log_p: float) -> float:
        return (self._reach + self.num_layers * math.exp(-log_p)) / SLACK if log_p > -700.0 else math.inf

    def _resident_wait(self, key: int) -> float:
        return self.wait(key)


# ── compiled: the same decision on arrays (freetoken/placement/compiled) ─────────────────────────────────────────────
# On the family's State (family.py: its hooks call these after layer_sweep's): the oracle's draws by call
# (DistanceOracle's own, as lookahead.Oracle), and the standing hint as arrays: a key or layer is named while its mark
# equals hint.stamp[0]; take_hint runs when the call begins (plan: before its own misses pick victims).

class Hint(NamedTuple):
    predicted: np.ndarray  # int64 [K] == stamp[0]: named by the standing hint (_predicted)
    stamp: np.ndarray  # int64 [1]
    hinted: np.ndarray  # int64 [L] == stamp[0]: a hinted layer (_hinted's keys), with its
    a: np.ndarray  # float64 [L] accuracy a,
    q: np.ndarray  # float64 [L] chance q
    n: np.ndarray  # int64 [L] and predictions n (_hinted's values)
    order: np.ndarray  # int64 [K] the named keys, nearest first (_predicted_order)
    n_predicted: np.ndarray  # int64 [1]
    reach: np.ndarray  # int64 [1] (_reach)
    acc: np.ndarray  # float64 [depth] (acc)
    min_confidence: float


def new_hint(num_layers: int, num_experts: int, acc, min_confidence: float) -> Hint:
    K, L, z = num_layers * num_experts, num_layers, np.zeros
    return Hint(np.full(K, -1, np.int64), z(1, np.int64), np.full(L, -1, np.int64), z(L), z(L), z(L, np.int64),
                z(K, np.int64), z(1, np.int64), z(1, np.int64), np.asarray(acc, np.float64), min_confidence)


def draw(future, num_experts: int, acc, seed: int) -> np.ndarray:
    """[depth, N] DistanceOracle's draws."""
    if future.keys.size == 0:
        return np.zeros((len(acc), 0), np.int64)
    return np.stack(distance_predictions(future, num_experts, acc, seed))


@jit
def take_hint(p, c, layer):
    """_take_hint: the oracle's keys for the next `depth` layers; per hinted layer its accuracy a and chance q."""
    h, E = p.hint, p.rates.num_experts
    n = lookahead.upcoming(p.oracle, c, layer, p.rates.num_layers, h.predicted, h.stamp, h.order)
    h.n_predicted[0] = n
    stamp = h.stamp[0]
    reach = 0  # the furthest hinted layer's distance (the walk's bound)
    for i in range(n):
        hl = h.order[i] // E
        if h.hinted[hl] != stamp:
            h.hinted[hl] = stamp
            h.n[hl] = 0
        h.n[hl] += 1
        reach = max(reach, hl - layer)
    h.reach[0] = reach
    for j in range(1, reach + 1):  # once per hinted layer (the keys come layer by layer)
        hl = layer + j
        if h.hinted[hl] == stamp:
            a = h.acc[j - 1]
            h.a[hl] = a
            h.q[hl] = min(1.0, h.n[hl] * (1 - a) / (E - 1))


@jit
def posterior(p, key):
    """_posterior: (r, p)."""
    h, r, E = p.hint, p.rates, p.rates.num_experts
    layer = key // E
    rate = layer_sweep.rate(r, key)
    if h.hinted[layer] != h.stamp[0]:
        return rate, max(rate, FLOOR)
    a, q, n = h.a[layer], h.q[layer], h.n[layer]
    rate = min(max(rate, PRIOR_FLOOR * n / E), 1.0)
    if h.predicted[key] == h.stamp[0]:
        num, den = rate * a, rate * a + (1 - rate) * q
    else:
        num, den = rate * (1 - a), rate * (1 - a) + (1 - rate) * (1 - q)
    return (num / den if den > 0 else 0.0), rate


@jit
def wait(p, key):
    """HintedSweep.wait: d + (1 - r) L / p in a hinted layer."""
    if p.hint.hinted[key // p.rates.num_experts] != p.hint.stamp[0]:
        return layer_sweep.sweep_wait(p.rates, key)
    r, rate = posterior(p, key)
    return layer_sweep.distance(p.rates, key) + (1.0 - r) * p.rates.num_layers / rate


@jit
def prefetch_for(p, st, c, keys, out):
    """The named keys, nearest first, whose posterior reaches min_confidence (never over 1: num <= den)."""
    h, n = p.hint, 0
    if h.min_confidence > 1.0:
        return 0
    for i in range(h.n_predicted[0]):
        if posterior(p, h.order[i])[0] >= h.min_confidence:
            out[n] = h.order[i]
            n += 1
    return n


@jit
def prefetching(p, key):
    """_to_beat: a predicted key of a hinted layer is weighed against the victim even without bypass."""
    return p.hint.predicted[key] == p.hint.stamp[0] and p.hint.hinted[key // p.rates.num_experts] == p.hint.stamp[0]


@jit
def bound(p, log_p):
    return (p.hint.reach[0] + p.rates.num_layers * math.exp(-log_p)) / SLACK
