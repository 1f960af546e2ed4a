"""The family's one compiled State: layer_sweep, lookahead and hinted_sweep decide over the same arrays with the same
hooks, each policy's own part picked by `mode`, so the driver is compiled once for the three. Each policy's compiled
functions sit in its own file beside its reference class; this file only routes to them, as the reference classes'
inheritance does (a lookahead or hinted_sweep hook runs layer_sweep's, then its own).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from freetoken.placement.compiled.form import Compiled, Setup
from freetoken.placement.compiled.hooks import register
from freetoken.placement.policies.sweep import hinted_sweep, layer_sweep, lookahead, walk
from freetoken.placement.policies.sweep.hinted_sweep import Hint, HintedSweep, accuracies, new_hint
from freetoken.placement.policies.sweep.layer_sweep import LayerSweep, Rates, Residents, sweep_parts
from freetoken.placement.policies.sweep.lookahead import Lookahead, Oracle, noisy_future
from freetoken.placement.policies.sweep.walk import Walk

SWEEP, LOOKAHEAD, HINTED = 0, 1, 2


class State(NamedTuple):
    rates: Rates  # layer_sweep's estimate
    residents: Residents  # its heap of residents
    walk: Walk  # the victim's walk
    bypass: bool
    scan: int
    mode: int  # SWEEP, LOOKAHEAD or HINTED
    oracle: Oracle  # lookahead / hinted_sweep: the hints by call (layer_sweep: none)
    pending: np.ndarray  # int64 [K] lookahead's pending keys: == pending_stamp[0] (Lookahead._pending)
    pending_stamp: np.ndarray  # int64 [1]
    hint: Hint  # hinted_sweep's standing hint


def _setup(mode: int, reference: LayerSweep, oracle: Oracle, hint: Hint) -> Setup:
    rates, residents, walk_, warm = sweep_parts(reference)
    K = reference.num_layers * reference.num_experts
    state = State(rates, residents, walk_, reference.bypass, reference.scan, mode, oracle, np.full(K, -1, np.int64),
                  np.zeros(1, np.int64), hint)
    return Setup(state, warm, prefetches=mode != SWEEP)


_NO_ORACLE = Oracle(np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros((1, 0), np.int64), np.zeros(0, np.int64),
                    np.zeros(1, np.int64), 0)  # (read only)


def setup_layer_sweep(capacity: int, num_layers: int, num_experts: int, **options) -> Setup:
    ref = LayerSweep(capacity, num_layers, num_experts, **options)
    return _setup(SWEEP, ref, _NO_ORACLE, new_hint(num_layers, num_experts, (), 0.0))


def setup_lookahead(capacity: int, num_layers: int, num_experts: int, future=None, accuracy: float = 0.8,
                    depth: int = 1, seed: int = 0, hint=None, decay: float = 0.9, bypass: bool = True, prior=None,
                    scan: int = 64, carry=None) -> Setup:
    ref = LayerSweep(capacity, num_layers, num_experts, decay=decay, bypass=bypass, prior=prior, scan=scan)
    o = lookahead.oracle("lookahead", future, num_layers, num_experts,
                         lambda f: noisy_future(f, num_experts, accuracy, depth, seed)[None, :], depth, carry, hint)
    return _setup(LOOKAHEAD, ref, o, new_hint(num_layers, num_experts, (), 0.0))


def setup_hinted_sweep(capacity: int, num_layers: int, num_experts: int, future=None, accuracy=0.8, depth: int = 1,
                       min_confidence: float = 0.9, seed: int = 0, hint=None, decay: float = 0.9, bypass: bool = True,
                       prior=None, scan: int = 64, carry=None) -> Setup:
    ref = LayerSweep(capacity, num_layers, num_experts, decay=decay, bypass=bypass, prior=prior, scan=scan)
    acc = accuracies(accuracy, depth)
    o = lookahead.oracle("hinted_sweep", future, num_layers, num_experts,
                         lambda f: hinted_sweep.draw(f, num_experts, acc, seed), depth, carry, hint)
    return _setup(HINTED, ref, o, new_hint(num_layers, num_experts, acc, min_confidence))


# hooks and the walk's questions, by mode (layer_sweep's, then the policy's own part, as its class inherits)
def begin_call(p, st, c, keys, tokens, phase):
    layer_sweep.begin_call(p, st, c, keys, tokens, phase)
    if keys.size and p.mode != SWEEP:
        lookahead.check_call(p.oracle, c, keys, p.rates.num_experts)
        if p.mode == HINTED:
            hinted_sweep.take_hint(p, c, keys[0] // p.rates.num_experts)


def prefetch_for(p, st, c, keys, out):
    if p.mode == LOOKAHEAD:
        return lookahead.prefetch_for(p, st, c, keys, out)
    return hinted_sweep.prefetch_for(p, st, c, keys, out) if p.mode == HINTED else 0


def to_beat(p, key):
    """_to_beat: the key's own wait (each policy's), when bypassing or (hinted_sweep) prefetching."""
    if p.mode == HINTED:
        return hinted_sweep.wait(p, key) if p.bypass or hinted_sweep.prefetching(p, key) else -np.inf
    if not p.bypass:
        return -np.inf
    return lookahead.wait(p, key) if p.mode == LOOKAHEAD else layer_sweep.sweep_wait(p.rates, key)


def bound(p, log_p):
    return hinted_sweep.bound(p, log_p) if p.mode == HINTED else layer_sweep.bound(p, log_p)


def resident_wait(p, key):
    return hinted_sweep.wait(p, key) if p.mode == HINTED else layer_sweep.sweep_wait(p.rates, key)


def walk_skips(p, key):
    return p.mode == LOOKAHEAD and p.pending[key] == p.pending_stamp[0]  # (Lookahead.victim: pending protected)


register(State, {walk.to_beat: to_beat, walk.bound: bound, walk.resident_wait: resident_wait,
                 walk.walk_skips: walk_skips})
HOOKS = dict(begin_call=begin_call, on_hit=layer_sweep.on_hit, on_miss=layer_sweep.on_miss,
             on_admit=layer_sweep.on_admit, on_evict=layer_sweep.on_evict, victim=walk.victim,
             prefetch_for=prefetch_for)
LABEL = "the layer-sweep family"
LayerSweep.compiled = Compiled("sweep", State, setup_layer_sweep, HOOKS, label=LABEL)
Lookahead.compiled = Compiled("sweep", State, setup_lookahead, HOOKS, label=LABEL)
HintedSweep.compiled = Compiled("sweep", State, setup_hinted_sweep, HOOKS, label=LABEL)
