"""Router lookahead: the next layers' router run early on the current hidden state names the experts the same
token (or prefill chunk) will need next; those are prefetched while this layer computes, and kept from eviction
until their call has passed. Eviction otherwise is layer_sweep's (expected wait in the sweep).

The signal is live only: the engine passes `hint`, an object whose `upcoming(call)` returns the predicted keys
of the next calls of the same sweep, nearest first. The simulator has no hidden states, so by default the hint
is `NoisyOracle` over the future key stream: the true experts of the next `depth` layers of this sweep, each
replaced by a uniformly drawn other expert of its layer with probability 1 - accuracy (seeded). The last layer
of a sweep predicts nothing (the next token is not sampled yet); a one-layer trace never prefetches. `carry`
(placement.carry) adds, for the same next layers, the keys speculative decoding's rejected drafts of the verify
step before routed to.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from freetoken.placement.call import Call
from freetoken.placement.carry import CarriedHint, LiveCarry, check_carry
from freetoken.placement.compiled.cache import jit
from freetoken.placement.policies.sweep import layer_sweep, walk
from freetoken.placement.policies.sweep.layer_sweep import LayerSweep
from freetoken.placement.stream import KeyStream


def noisy_keys(keys: np.ndarray, num_experts: int, accuracy: float, rng: np.random.Generator) -> np.ndarray:
    """[N] -> [N]: each key, or with probability 1 - accuracy a uniformly drawn other expert of its layer."""
    wrong = rng.random(keys.size) >= accuracy  # [N]
    other = rng.integers(0, max(num_experts - 1, 1), size=keys.size)  # [N] an expert id that skips the true one
    expert = keys % num_experts
    other = other + (other >= expert)
    return np.where(wrong, keys - expert + other, keys)


def noisy_future(future: KeyStream, num_experts: int, accuracy: float, depth: int, seed: int) -> np.ndarray:
    """[N] the key the oracle predicts for each access of the future (validating its options)."""
    if not 0 <= accuracy <= 1:
        raise ValueError(f"lookahead accuracy must lie in [0, 1], got {accuracy}")
    if depth < 1:
        raise ValueError(f"lookahead depth must be >= 1, got {depth}")
    if num_experts < 2 and accuracy < 1:
        raise ValueError("lookahead accuracy < 1 needs at least 2 experts per layer to draw a wrong one from")
    return noisy_keys(future.keys, num_experts, accuracy, np.random.default_rng(seed))


class FutureOracle:
    """Router hints from a recorded future: call c is told the keys predicted for the next calls c + j of its sweep
    (j = 1..depth while the sweep goes on, nearest first, each once), rows[j - 1] (one row: the same for every j)
    predicting each access of the future. Calls must come in the future's order."""

    def __init__(self, future: KeyStream, num_experts: int, rows: list[np.ndarray], depth: int, name: str):
        keys = future.keys
        self.depth, self.name = depth, name
        self._rows = [r.tolist() for r in rows]  # each [N]
        self._offsets = future.offsets.tolist()
        self._layer = (keys[future.offsets[:-1]] // num_experts).tolist() if future.num_calls else []  # [C]
        self._call = 0

    def upcoming(self, call: Call) -> list[int]:
        c, off, layer = self._call, self._offsets, self._layer
        if c >= len(layer):
            raise ValueError(f"{self.name}: call {c} is past the end of the future it was given")
        if layer[c] != call.layer or len(call.experts) != off[c + 1] - off[c]:
            raise ValueError(f"{self.name}: call {c} is layer {call.layer} with {len(call.experts)} experts, the "
                             f"future it was given says layer {layer[c]} with {off[c + 1] - off[c]}")
        self._call = c + 1
        out: list[int] = []
        for j in range(1, self.depth + 1):
            if c + j >= len(layer) or layer[c + j] != call.layer + j:  # the sweep ends: next token unknown
                break
            for key in self._rows[min(j, len(self._rows)) - 1][off[c + j]:off[c + j + 1]]:
                if key not in out:
                    out.append(key)
        return out


class NoisyOracle(FutureOracle):
    """Each true key, or with probability 1 - accuracy a uniformly drawn other expert of its layer: one draw per
    access of the future, the same whatever the distance it is predicted from."""

    def __init__(self, future: KeyStream, num_experts: int, accuracy: float = 0.8, depth: int = 1, seed: int = 0):
        super().__init__(future, num_experts, [noisy_future(future, num_experts, accuracy, depth, seed)], depth,
                         "lookahead")
        self.accuracy = accuracy


class Lookahead(LayerSweep):
    name = "lookahead"
    needs_future = True  # in the simulator: the oracle's source; live, pass hint= instead

    def __init__(self, capacity: int, num_layers: int, num_experts: int, future: KeyStream | None = None,
                 accuracy: float = 0.8, depth: int = 1, seed: int = 0, hint=None, decay: float = 0.9,
                 bypass: bool = True, prior=None, scan: int = 64, carry=None):
        super().__init__(capacity, num_layers, num_experts, decay=decay, bypass=bypass, prior=prior, scan=scan)
        if hint is None:
            if future is None:
                raise ValueError("lookahead needs a router hint (live engine) or the future key stream "
                                 "(simulator) to build a noisy oracle from")
            hint = NoisyOracle(future, num_experts, accuracy, depth, seed)
        if carry is not None:
            hint = CarriedHint(hint, carry, num_layers, num_experts, depth, self.name)
        self.hint = hint
        self._pending: set[int] = set()  # predicted keys whose call has not come yet

    def prefetch_for(self, call: Call) -> list[int]:
        wanted = self.hint.upcoming(call)
        self._pending = set(wanted)
        return wanted

    def wait(self, key: int) -> float:
        if key in self._pending:  # the router says: needed in the sweep's next calls
            return float((key // self.num_experts - self._layer - 1) % self.num_layers + 1)
        return super().wait(key)

    def victim(self, key: int, now: int, protected: set[int]) -> int | None:
        return super().victim(key, now, protected | self._pending if self._pending else protected)


# ── compiled: the same decision on arrays (freetoken/placement/compiled) ─────────────────────────────────────────────
# On the family's State (family.py: its hooks call these after layer_sweep's): the oracle's draws indexed by call (the
# reference's own NoisyOracle draws, then the carry's keys of the same calls: CarriedHint), so the hints are its hints
# exactly; the pending keys are p.pending == p.pending_stamp[0], protected in the walk too (Lookahead.victim).

class Oracle(NamedTuple):
    """Call c + j's keys as predicted j calls ahead: predicted[j - 1 (one row: every j), offsets[c + j]:...]."""

    offsets: np.ndarray  # int64 [C + 1]
    call_layer: np.ndarray  # int64 [C]
    predicted: np.ndarray  # int64 [J, N]
    carry_keys: np.ndarray  # int64 [M] the keys carried into each call (carry; none: empty)
    carry_offsets: np.ndarray  # int64 [C + 1]
    depth: int


def oracle(name: str, future, num_layers: int, num_experts: int, draw, depth: int, carry, hint) -> Oracle:
    """The oracle of a compiled lookahead / hinted_sweep: draw(future) -> predicted [J, N] (the reference's)."""
    if hint is not None:
        raise ValueError(f"{name}: a live hint object runs in the interpreted class (make_policy picks it)")
    if future is None:
        raise ValueError(f"{name} needs a router hint (live engine) or the future key stream (simulator) to build a "
                         f"noisy oracle from")
    K = num_layers * num_experts
    keys = np.ascontiguousarray(future.keys, np.int64)
    if keys.size and (keys.min() < 0 or keys.max() >= K):
        raise ValueError(f"{name}: the future's keys must lie in [0, {K}) ({num_layers} layers x {num_experts} "
                         f"experts), got [{keys.min()}, {keys.max()}]")
    offsets = np.ascontiguousarray(future.offsets, np.int64)
    call_layer = keys[offsets[:-1]] // num_experts if offsets.size > 1 else np.zeros(0, np.int64)
    predicted = np.ascontiguousarray(draw(future), np.int64)
    carry_keys, carry_offsets = np.zeros(0, np.int64), np.zeros(call_layer.size + 1, np.int64)
    if carry is not None:
        carry = check_carry(carry, name)
        if isinstance(carry, LiveCarry):
            raise ValueError(f"{name}: a live carry runs in the interpreted class (make_policy picks it)")
        if carry.num_calls != call_layer.size:
            raise ValueError(f"{name}: the carry holds {carry.num_calls} calls, the future {call_layer.size}")
        carry_keys = np.ascontiguousarray(carry.keys, np.int64)
        carry_offsets = np.ascontiguousarray(carry.offsets, np.int64)
    return Oracle(offsets, call_layer, predicted, carry_keys, carry_offsets, depth)


@jit
def check_call(o, c, keys, num_experts):
    if c >= o.call_layer.size or o.call_layer[c] != keys[0] // num_experts or \
            o.offsets[c + 1] - o.offsets[c] != keys.size:
        raise ValueError("a call differs from the future the oracle was given (calls must come in its order)")


@jit
def upcoming(o, c, layer, num_layers, mark, stamp, out):
    """NoisyOracle.upcoming then CarriedHint's keys, each once, nearest first, as a fresh mark (mark == stamp[0]);
    returns how many are in out."""
    stamp[0] += 1
    n = 0
    reach = min(o.depth, num_layers - 1 - layer, o.call_layer.size - 1 - c)  # distances inside the sweep
    for j in range(1, reach + 1):
        if o.call_layer[c + j] != layer + j:  # the oracle's sweep ends: the next token is unknown
            break
        row = 0 if o.predicted.shape[0] == 1 else j - 1
        for i in range(o.offsets[c + j], o.offsets[c + j + 1]):
            n = _mark(o.predicted[row, i], mark, stamp[0], out, n)
    for j in range(1, reach + 1):
        for i in range(o.carry_offsets[c + j], o.carry_offsets[c + j + 1]):
            n = _mark(o.carry_keys[i], mark, stamp[0], out, n)
    return n


@jit
def _mark(k, mark, stamp, out, n):
    if mark[k] != stamp:
        mark[k] = stamp
        out[n] = k
        n += 1
    return n


@jit
def prefetch_for(p, st, c, keys, out):
    """Lookahead.prefetch_for: the oracle's keys, now the pending ones."""
    walk.end_walk(p.walk)  # the pending keys (protected) change
    if keys.size == 0:
        return 0
    r = p.rates
    return upcoming(p.oracle, c, keys[0] // r.num_experts, r.num_layers, p.pending, p.pending_stamp, out)


@jit
def wait(p, key):
    """Lookahead.wait: a pending key waits only for its layer."""
    if p.pending[key] == p.pending_stamp[0]:
        return float(layer_sweep.distance(p.rates, key))
    return layer_sweep.sweep_wait(p.rates, key)

