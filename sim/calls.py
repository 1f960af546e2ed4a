"""A trace as the sequence of MoE-layer calls an engine would make: prefill in chunks, decode token by token.

The calls are built once, in compiled code, as a CallStream (freetoken.placement.callstream); the names here are
the trace-level entry points (Call objects one by one for interpreted policies, the key stream for offline ones).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from freetoken.placement.call import DECODE, PREFILL, Call
from freetoken.placement.callstream import CallStream, call_stream, segments_of
from freetoken.placement.config import DEFAULT_PREFILL_CHUNK
from freetoken.placement.stream import KeyStream
from freetoken.trace import RoutingTrace


def segments(trace: RoutingTrace) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive tokens with the same request, turn and phase."""
    lo, hi = segments_of(trace.request, trace.turn, trace.phase)
    return list(zip(lo.tolist(), hi.tolist()))


def trace_stream(trace: RoutingTrace, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> CallStream:
    """Every call of the trace as flat columns (one compiled pass)."""
    return call_stream(trace.experts, trace.num_experts, trace.request, trace.turn, trace.phase, prefill_chunk)


def trace_calls(trace: RoutingTrace, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> Iterator[Call]:
    return trace_stream(trace, prefill_chunk).calls()


def trace_key_stream(trace: RoutingTrace, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> KeyStream:
    """The trace's calls as keys: the future `belady` needs, in the order a replay or a live run plans them."""
    return trace_stream(trace, prefill_chunk).key_stream()


def num_calls(trace: RoutingTrace, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> int:
    """How many calls trace_calls yields, without building them (for progress bars)."""
    lo, hi = segments_of(trace.request, trace.turn, trace.phase)
    n = hi - lo
    prefill = trace.phase[lo] == PREFILL if lo.size else np.zeros(0, bool)
    return int(np.where(prefill, -(-n // prefill_chunk), n).sum()) * trace.num_layers


@dataclass(frozen=True, slots=True)
class Steps:
    """The groups of trace rows a replay runs as calls, in order (prefill chunks, batched decode steps, verify steps):
    rows[offsets[g]:offsets[g+1]] is group g, phase[g] its phase; accepted[g] the drafts a verify step accepted
    (0 elsewhere; a batched verify step: summed over its sequences), produced[g] the decode tokens it made; draft[r]
    what row r is in its group, as a trace's draft field: 0 a true token, 1 an accepted draft, 2 a rejected one."""

    rows: np.ndarray  # [R] trace rows (a verify step: its true token first, then its drafts in draft order)
    offsets: np.ndarray  # [G + 1]
    phase: np.ndarray  # [G] int8
    accepted: np.ndarray  # [G]
    produced: np.ndarray  # [G] decode tokens a decode group made: accepted + 1, summed over a batched step's sequences
    draft: np.ndarray  # [R] int8: 0 true token, 1 accepted draft, 2 rejected draft

    @classmethod
    def of(cls, groups: list[np.ndarray], phase: list[int], accepted: list[int] | None = None,
           produced: list[int] | None = None, draft: list[np.ndarray] | None = None) -> "Steps":
        """draft: per group its rows' codes (None: every row a true token)."""
        sizes = [len(g) for g in groups]
        rows = np.concatenate(groups).astype(np.int64) if groups else np.zeros(0, np.int64)
        acc = np.asarray(accepted if accepted is not None else [0] * len(groups), np.int64)
        codes = np.concatenate(draft).astype(np.int8) if draft else np.zeros(len(rows), np.int8)
        return cls(rows, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), np.asarray(phase, np.int8), acc,
                   np.asarray(produced, np.int64) if produced is not None else acc + 1, codes)

    @property
    def verify_steps(self) -> int:
        return int((self.phase == DECODE).sum())

    @property
    def decode_tokens(self) -> int:
        """Tokens the verify steps produced: each step its accepted drafts and the corrected / bonus token."""
        return int(self.produced[self.phase == DECODE].sum())


def steps_stream(trace: RoutingTrace, steps: Steps) -> CallStream:
    """One call per layer per group (the union of its rows' experts, with token counts), in group order."""
    G = len(steps.phase)
    group = np.repeat(np.arange(G), np.diff(steps.offsets))  # [R] the group of each row
    request = np.repeat(trace.request[steps.rows[steps.offsets[:-1]]].astype(np.int64), np.diff(steps.offsets))
    # a call's request is its first row's (a batched step's rows span several)
    widest = int(np.diff(steps.offsets).max()) if G else 1
    # each group its own segment (turn = group id), all built as one chunk; phases set per call after
    stream = call_stream(trace.experts[steps.rows], trace.num_experts, request, group,
                         np.full(len(steps.rows), PREFILL, np.int8), max(widest, 1))
    return replace(stream, phase=np.repeat(steps.phase, trace.num_layers).astype(np.int8))
