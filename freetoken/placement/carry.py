"""Carry for hint-taking policies (lookahead, hinted_sweep): the rejected drafts' experts of the verify step before.

In speculative decoding the verify pass routes the rejected drafts at every layer, a guess of the next verify step's
experts (sim/carry.py). An engine knows which drafts were rejected only once the last layer's output is sampled, so
the carry of step s can steer step s + 1 only: at step s + 1's call of layer l it names, for the distances
j = 1..depth that stay inside the sweep (l + j < L, the reach of the router hint), the keys carried into call c + j
(step s's rejected drafts at layer l + j), after the policy's own hint keys, each once. The last layer's call gets
none (nothing crosses the sweep's end).

The carry is either a KeyStream with one entry per call of the run (the simulator builds it from its speculative
replay, carry="drafts"; the compiled sweeps read the same stream, policies/sweep/lookahead.py) or a live holder
(LiveCarry) that the engine fills before each verify forward.
"""

from __future__ import annotations

from freetoken.placement.call import Call
from freetoken.placement.stream import KeyStream

DRAFTS = "drafts"  # the option value carry="drafts": the rejected drafts of the verify step before


class LiveCarry:
    """The engine's carry: per layer the keys the rejected drafts of the previous verify forward routed to, set
    before each forward (empty for prefill and a sequence's first verify step)."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.per_layer: list[list[int]] = [[] for _ in range(num_layers)]

    def set(self, per_layer: list[list[int]] | None) -> None:
        """[L] keys per layer for the coming forward (None: nothing carried)."""
        if per_layer is None:
            per_layer = [[] for _ in range(self.num_layers)]
        if len(per_layer) != self.num_layers:
            raise ValueError(f"carry: {len(per_layer)} layers given, the model has {self.num_layers}")
        self.per_layer = [list(keys) for keys in per_layer]


def check_carry(carry, name: str):
    if not isinstance(carry, (KeyStream, LiveCarry)):
        raise ValueError(f"{name}: carry must be the carried keys per call (a KeyStream; the simulator builds "
                         f"carry={DRAFTS!r} from its speculative replay, the engine a LiveCarry), got "
                         f"{type(carry).__name__}")
    return carry


class CarriedHint:
    """`hint`'s keys (None: none), then for distances j in 1..depth with call.layer + j < L the keys carried into
    call c + j (a KeyStream: calls must come in its order; a LiveCarry: the forward's layer call.layer + j)."""

    def __init__(self, hint, carry, num_layers: int, num_experts: int, depth: int, name: str):
        carry = check_carry(carry, name)
        self.hint, self.depth, self.name = hint, depth, name
        self.num_layers, self.num_experts = num_layers, num_experts
        self.live = carry if isinstance(carry, LiveCarry) else None
        if self.live is None:
            self._keys, self._offsets = carry.keys.tolist(), carry.offsets.tolist()
        self._call = 0
        self.told = 0  # carried keys told that the policy's own hint had not named

    def _carried(self, c: int, j: int, layer: int) -> list[int]:
        """The keys carried into call c + j (of layer `layer`)."""
        if self.live is not None:
            return self.live.per_layer[layer]
        off = self._offsets
        if c + j + 1 >= len(off):
            return []
        return self._keys[off[c + j]:off[c + j + 1]]

    def upcoming(self, call: Call) -> list[int]:
        c = self._call
        if self.live is None and c + 1 >= len(self._offsets):
            raise ValueError(f"{self.name}: call {c} is past the end of the carry it was given")
        self._call = c + 1
        out = list(self.hint.upcoming(call)) if self.hint is not None else []
        seen = set(out)
        for j in range(1, min(self.depth, self.num_layers - 1 - call.layer) + 1):
            layer = call.layer + j
            for key in self._carried(c, j, layer):
                if key // self.num_experts != layer:
                    raise ValueError(f"{self.name}: the carry of call {c + j} names key {key}, not of layer "
                                     f"{layer} (calls must come in the carry's order)")
                if key not in seen:
                    seen.add(key)
                    out.append(key)
                    self.told += 1
        return out
