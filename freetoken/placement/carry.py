"""Cross-step carry for hint-taking policies (lookahead, hinted_sweep): keys named for the calls of the NEXT step.

A router hint stops at the sweep's end: the next step's tokens are not sampled yet. In speculative decoding the
verify pass has routed the rejected drafts at every layer, a guess of the next step's experts (sim/carry.py). The
option `carry` is a KeyStream with one entry per call of the run: the keys carried into that call. CarriedHint asks
the policy's hint as before and, where its reach of `depth` calls passes the sweep's end, appends the carried keys
of those next calls, nearest first, each once. The simulator builds the carry from its speculative replay
(carry="drafts"); the compiled sweeps read the same stream (compiled/sweep.py).
"""

from __future__ import annotations

from freetoken.placement.call import Call
from freetoken.placement.stream import KeyStream

DRAFTS = "drafts"  # the option value carry="drafts": the rejected drafts of the step before (simulator)


def check_carry(carry, name: str) -> KeyStream:
    if not isinstance(carry, KeyStream):
        raise ValueError(f"{name}: carry must be the carried keys per call (a KeyStream; the simulator builds "
                         f"carry={DRAFTS!r} from its speculative replay), got {type(carry).__name__}")
    return carry


class CarriedHint:
    """`hint`'s keys (None: none), then for distances j in (L - 1 - call.layer, depth] the keys carried into call
    c + j (the next step's first layers). Calls must come in the carry's order."""

    def __init__(self, hint, carry: KeyStream, num_layers: int, num_experts: int, depth: int, name: str):
        carry = check_carry(carry, name)
        self.hint, self.depth, self.name = hint, depth, name
        self.num_layers, self.num_experts = num_layers, num_experts
        self._keys, self._offsets = carry.keys.tolist(), carry.offsets.tolist()
        self._call = 0

    def upcoming(self, call: Call) -> list[int]:
        c, off, L = self._call, self._offsets, self.num_layers
        if c + 1 >= len(off):
            raise ValueError(f"{self.name}: call {c} is past the end of the carry it was given")
        self._call = c + 1
        out = list(self.hint.upcoming(call)) if self.hint is not None else []
        seen = set(out)
        for j in range(L - call.layer, self.depth + 1):
            if c + j + 1 >= len(off):
                break
            for key in self._keys[off[c + j]:off[c + j + 1]]:
                if key // self.num_experts != (call.layer + j) % L:
                    raise ValueError(f"{self.name}: the carry of call {c + j} names key {key}, not of layer "
                                     f"{(call.layer + j) % L} (calls must come in the carry's order)")
                if key not in seen:
                    seen.add(key)
                    out.append(key)
        return out
