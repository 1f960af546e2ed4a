"""A trace's requests replayed as the server's continuous batching runs them (freetoken/serve/scheduler.py): up to
`batch` sequences at once; each iteration one prefill chunk of every sequence still prefilling, then one decode
step of all the others together: one call per layer over the union of their experts, with per-expert token counts.
A finished sequence's place goes to the next request at the next iteration. With a Speculation, each sequence's
decode step is a verify step of its token and drafts (sim/speculative.py), all ready sequences in one call. Each (request, turn) is one sequence:
its prefill rows, then its decode rows, in trace order (a trace recorded solo or batched gives the same).
The schedule is a list of row groups (sim.calls.Steps); the one call builder makes their calls."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from freetoken.placement.call import DECODE, PREFILL, Call
from freetoken.placement.callstream import CallStream
from freetoken.trace import RoutingTrace
from freetoken.sim.batch import Speculation
from freetoken.sim.calls import Steps, steps_stream
from freetoken.sim.speculative import draft_codes, verify_step


@dataclass(slots=True)
class _Sequence:
    prefill: np.ndarray  # [P] trace rows
    decode: np.ndarray  # [D] trace rows
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
        out.append(_Sequence(rows[phase == PREFILL], rows[phase == DECODE]))
    return out


def batched_steps(trace: RoutingTrace, batch: int, prefill_chunk: int, spec: Speculation | None = None,
                  seed: int = 0) -> Steps:
    """spec: each decode step verifies every ready sequence's token and a draft of spec.depth tokens (one call over
    the union of all their rows; sim/speculative.py's draws, seeded once per replay, sequence by sequence)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if prefill_chunk <= 0:
        raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")
    pending, active = deque(sequences(trace)), []
    groups: list[np.ndarray] = []
    phase: list[int] = []
    accepted: list[int] = []
    produced: list[int] = []
    draft: list[np.ndarray] = []
    rng = np.random.default_rng(seed)
    while pending or active:
        active = [s for s in active if not s.finished]
        while pending and len(active) < batch:
            active.append(pending.popleft())
        for s in active:
            if not s.started:  # one chunk, between decode steps
                end = min(len(s.prefill), s.prefilled + prefill_chunk)
                groups.append(s.prefill[s.prefilled:end])
                phase.append(PREFILL)
                accepted.append(0)
                produced.append(0)
                draft.append(np.zeros(end - s.prefilled, np.int8))
                s.prefilled = end
        ready = [s for s in active if s.started and not s.finished]
        if not ready:
            continue
        rows, made, codes = [], [], []
        for s in ready:
            if spec is None:
                r, k = np.array([s.decoded], np.int64), 0
            else:
                r, k = verify_step(s.decoded, 0, len(s.decode), spec, rng)
            rows.append(s.decode[r])
            made.append(k + 1)
            codes.append(draft_codes(k, len(r) - 1))
            s.decoded += k + 1
        groups.append(np.concatenate(rows))
        draft.append(np.concatenate(codes))
        phase.append(DECODE)
        accepted.append(sum(made) - len(made))
        produced.append(sum(made))
    return Steps.of(groups, phase, accepted, produced, draft)


def batched_stream(trace: RoutingTrace, batch: int, prefill_chunk: int, spec: Speculation | None = None,
                   seed: int = 0) -> CallStream:
    return steps_stream(trace, batched_steps(trace, batch, prefill_chunk, spec, seed))


def batched_calls(trace: RoutingTrace, batch: int, prefill_chunk: int) -> Iterator[Call]:
    return batched_stream(trace, batch, prefill_chunk).calls()
