"""A trace as the sequence of MoE-layer calls an engine would make: prefill in chunks, decode token by token.

The calls are built once, in compiled code, as a CallStream (freetoken.placement.callstream); the names here are
the trace-level entry points (Call objects one by one for interpreted policies, the key stream for offline ones).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from freetoken.placement.call import PREFILL, Call
from freetoken.placement.callstream import CallStream, call_stream, segments_of
from freetoken.placement.stream import KeyStream
from freetoken.trace import RoutingTrace

DEFAULT_PREFILL_CHUNK = 2048


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
