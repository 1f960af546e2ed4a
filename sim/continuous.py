"""A trace's requests replayed as the server's continuous batching runs them (freetoken/serve/scheduler.py): up to
`batch` sequences at once; each iteration one prefill chunk of every sequence still prefilling, then one decode
step of all the others together: one call per layer over the union of their experts, with per-expert token counts.
A finished sequence's place goes to the next request at the next iteration. Each (request, turn) is one sequence:
its prefill rows, then its decode rows, in trace order (a trace recorded solo or batched gives the same)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from freetoken.placement.call import DECODE, PREFILL, Call
from freetoken.placement.callstream import make_call
from freetoken.trace import RoutingTrace
from freetoken.sim.calls import chunk_calls


@dataclass(slots=True)
class _Sequence:
    request: int
    prefill: np.ndarray  # [P, L, K]
    decode: np.ndarray  # [D, L, K]
    prefilled: int = 0
    decoded: int = 0

    @property
    def started(self) -> bool:
        return self.prefilled == len(self.prefill)

    @property
    def finished(self) -> bool:
        return self.started and self.decoded == len(self.decode)


def sequences(trace: RoutingTrace) -> list[_Sequence]:
    """One per (request, turn), in order of first appearance."""
    keys = trace.request.astype(np.int64) << 32 | trace.turn.astype(np.int64)
    _, first = np.unique(keys, return_index=True)
    out = []
    for start in sorted(first.tolist()):
        rows = np.flatnonzero(keys == keys[start])
        phase = trace.phase[rows]
        out.append(_Sequence(int(trace.request[start]), trace.experts[rows[phase == PREFILL]],
                             trace.experts[rows[phase == DECODE]]))
    return out


def batched_calls(trace: RoutingTrace, batch: int, prefill_chunk: int) -> Iterator[Call]:
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if prefill_chunk <= 0:
        raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")
    pending, active = deque(sequences(trace)), []
    E, L, ones = trace.num_experts, trace.num_layers, [1] * trace.top_k
    while pending or active:
        active = [s for s in active if not s.finished]
        while pending and len(active) < batch:
            active.append(pending.popleft())
        for s in active:
            if not s.started:  # one chunk, between decode steps
                end = min(len(s.prefill), s.prefilled + prefill_chunk)
                yield from chunk_calls(s.prefill[s.prefilled:end], E, s.request)
                s.prefilled = end
        ready = [s for s in active if s.started and not s.finished]
        if len(ready) == 1:
            row = ready[0].decode[ready[0].decoded].tolist()  # [L][K]
            yield from (Call(layer, row[layer], ones, DECODE, ready[0].request) for layer in range(L))
        elif ready:
            rows = np.stack([s.decode[s.decoded] for s in ready])  # [B, L, K]
            yield from (make_call(layer, rows[:, layer], DECODE, ready[0].request) for layer in range(L))
        for s in ready:
            s.decoded += 1
