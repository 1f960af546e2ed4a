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

import numpy as np

from freetoken.placement.call import Call
from freetoken.placement.carry import CarriedHint
from freetoken.placement.layer_sweep import LayerSweep
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


class NoisyOracle:
    """Router hints from a recorded future, with a stated accuracy. Calls must come in the future's order."""

    def __init__(self, future: KeyStream, num_experts: int, accuracy: float = 0.8, depth: int = 1, seed: int = 0):
        predicted = noisy_future(future, num_experts, accuracy, depth, seed)
        self.accuracy, self.depth = accuracy, depth
        keys = future.keys
        E = num_experts
        self._keys = keys.tolist()
        self._predicted = predicted.tolist()  # [N]
        self._offsets = future.offsets.tolist()
        self._layer = (keys[future.offsets[:-1]] // E).tolist() if future.num_calls else []  # [C]
        self._call = 0

    def upcoming(self, call: Call) -> list[int]:
        c, off, layer = self._call, self._offsets, self._layer
        if c >= len(layer):
            raise ValueError(f"lookahead: call {c} is past the end of the future it was given")
        if layer[c] != call.layer or len(call.experts) != off[c + 1] - off[c]:
            raise ValueError(f"lookahead: call {c} is layer {call.layer} with {len(call.experts)} experts, the "
                             f"future it was given says layer {layer[c]} with {off[c + 1] - off[c]}")
        self._call = c + 1
        out: list[int] = []
        for j in range(1, self.depth + 1):
            if c + j >= len(layer) or layer[c + j] != call.layer + j:  # the sweep ends: next token unknown
                break
            for key in self._predicted[off[c + j]:off[c + j + 1]]:
                if key not in out:
                    out.append(key)
        return out


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
