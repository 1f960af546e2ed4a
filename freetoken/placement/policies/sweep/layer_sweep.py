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

import functools
import heapq
import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from freetoken.placement.call import Call
from freetoken.placement.compiled.cache import jit
from freetoken.placement.compiled.heap import refile, remove_key
from freetoken.placement.policies.sweep import walk
from freetoken.placement.policies.sweep.walk import SLACK, VictimWalk, new_walk
from freetoken.placement.policy import PlacementPolicy

FLOOR = 1e-300  # p of a key never used: never log(0)


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


class LayerSweep(VictimWalk, PlacementPolicy):
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
        self._walk = None  # the current call's heap walk (walk.py)
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
        return d + L * (1.0 / max(self._rate(key), FLOOR) - 1.0)

    def _z_of(self, key: int) -> float:
        return math.log(max(self._p[key], FLOOR)) - self._stamp[key] * self._log_decay

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

    # the walk (walk.py's VictimWalk: victim, _to_beat, _bound, _walk_on, _end_walk)
    def _resident_wait(self, key: int) -> float:
        return LayerSweep.wait(self, key)  # a resident's wait is layer_sweep's, whatever a subclass says of `key`


# ── compiled: the same decision on arrays (freetoken/placement/compiled) ─────────────────────────────────────────────
# The residents sit in an indexed min-heap by (z, key), z as the reference's heap entries (one live entry per
# resident; the reference's stale entries never count). It does not change during a call: the call's uses,
# admissions and evictions touch only its protected keys and its victims, so they are listed (touch) and applied
# when the next call begins (settle; a key's z is the same then: its rate and stamp change once per call, at its
# use). Floating point follows the reference's operations in order (decay ** d for d < POWERS is read from a table
# of those same pow results).

POWERS = 4096


class Rates(NamedTuple):
    p: np.ndarray  # float64 [K] decayed use rate, as of the key's stamp (_p)
    stamp: np.ndarray  # int64 [K] (_stamp)
    visits: np.ndarray  # int64 [L] (_visits)
    layer: np.ndarray  # int64 [1] (_layer)
    most_visits: np.ndarray  # int64 [1] (_most_visits)
    powers: np.ndarray  # float64 [POWERS] decay ** d
    decay: float
    log_decay: float  # (_log_decay)
    num_layers: int
    num_experts: int


class Residents(NamedTuple):
    z: np.ndarray  # float64 [K] each resident's z (_z)
    heap: np.ndarray  # int64 [C + 1] residents by (z, key) (_heap)
    pos: np.ndarray  # int64 [K] each key's index in it, -1: not on it
    size: np.ndarray  # int64 [1]
    touched: np.ndarray  # int64 [K] keys the call used, admitted or evicted (settled when the next call begins)
    listed: np.ndarray  # int64 [K] 1: in touched
    n_touched: np.ndarray  # int64 [1]


def sweep_parts(reference: LayerSweep) -> tuple:
    """(rates, residents, walk, warm keys in slot order) of a fresh reference (its checks, rates and warm set)."""
    K, L, C = reference.num_layers * reference.num_experts, reference.num_layers, reference.capacity
    z = np.zeros
    rates = Rates(np.asarray(reference._p, np.float64), z(K, np.int64), z(L, np.int64), z(1, np.int64),
                  z(1, np.int64), power_table(reference.decay).copy(), reference.decay, reference._log_decay,
                  L, reference.num_experts)
    residents = Residents(z(K), z(C + 1, np.int64), np.full(K, -1, np.int64), z(1, np.int64), z(K, np.int64),
                          z(K, np.int64), z(1, np.int64))
    warm = sorted(reference.slot_of, key=reference.slot_of.__getitem__)
    for k in warm:
        _push(rates, residents, k)
    return rates, residents, new_walk(C), tuple(warm)


@functools.lru_cache(maxsize=64)
def power_table(decay: float) -> np.ndarray:
    """[POWERS] decay ** d by the reference's own pow (C's pow, as the compiled fallback's), once per decay, read
    only; each policy takes a copy (a plain writable array, as every State array: one compiled type, pickled or
    not)."""
    table = np.array([decay ** d for d in range(POWERS)], np.float64)
    table.flags.writeable = False  # (shared by every caller)
    return table


# the estimate
@jit
def rate(r, key):
    """_rate: p of `key` now."""
    d = r.visits[key // r.num_experts] - r.stamp[key]
    return r.p[key] * (r.powers[d] if d < r.powers.size else r.decay ** float(d))


@jit
def distance(r, key):
    """Calls until the key's layer comes round again in the sweep."""
    return (key // r.num_experts - r.layer[0] - 1) % r.num_layers + 1


@jit
def sweep_wait(r, key):
    """LayerSweep.wait."""
    return distance(r, key) + r.num_layers * (1.0 / max(rate(r, key), FLOOR) - 1.0)


@jit
def _use(r, key):
    v = r.visits[key // r.num_experts]
    d = v - r.stamp[key]
    r.p[key] = r.p[key] * (r.powers[d] if d < r.powers.size else r.decay ** float(d)) + (1.0 - r.decay)
    r.stamp[key] = v


# the heap of residents
@jit(entry=True)
def _push(r, h, key):
    """(Re)file `key` under its z now (_z_of)."""
    h.z[key] = math.log(max(r.p[key], FLOOR)) - r.stamp[key] * r.log_decay
    refile(h.heap, h.pos, h.size, 0, h.z, h.z, False, key)


@jit
def _touch(h, key):
    if h.listed[key] == 0:
        h.listed[key] = 1
        h.touched[h.n_touched[0]] = key
        h.n_touched[0] += 1


@jit
def _settle(r, h, slot_of):
    """The last call's changes: its evicted keys leave the heap, its used and admitted keys are refiled under their
    z now (evictions first: the heap never holds more than the capacity)."""
    for i in range(h.n_touched[0]):
        if slot_of[h.touched[i]] < 0:
            remove_key(h.heap, h.pos, h.size, 0, h.z, h.z, False, h.touched[i])
    for i in range(h.n_touched[0]):
        key = h.touched[i]
        h.listed[key] = 0
        if slot_of[key] >= 0:
            _push(r, h, key)
    h.n_touched[0] = 0


# hooks (lookahead and hinted_sweep call these, as their classes inherit them; family.py registers them)
@jit
def begin_call(p, st, c, keys, tokens, phase):
    _settle(p.rates, p.residents, st.slot_of)
    walk.end_walk(p.walk)  # waits move with the layer
    if keys.size:
        r = p.rates
        layer = keys[0] // r.num_experts
        r.layer[0] = layer
        r.visits[layer] += 1
        r.most_visits[0] = max(r.most_visits[0], r.visits[layer])


@jit
def on_hit(p, key, now):
    _use(p.rates, key)
    _touch(p.residents, key)


@jit
def on_miss(p, key, now):
    _use(p.rates, key)


@jit
def on_admit(p, key, now):
    _touch(p.residents, key)


@jit
def on_evict(p, key):
    _touch(p.residents, key)  # victim() took it out of the walk already


# the walk's bound (walk.py; family.py routes the walk's questions)
@jit
def bound(p, log_p):
    return p.rates.num_layers * math.exp(-log_p) * SLACK
