"""A trace as the sequence of MoE-layer calls an engine would make: prefill in chunks, decode token by token."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from freetoken.placement.call import DECODE, PREFILL, Call
from freetoken.placement.config import DEFAULT_PREFILL_CHUNK
from freetoken.placement.stream import KeyStream, key_stream
from freetoken.trace import RoutingTrace


def segments(trace: RoutingTrace) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive tokens with the same request, turn and phase."""
    T = trace.num_tokens
    if T == 0:
        return []
    change = (np.diff(trace.request) != 0) | (np.diff(trace.turn) != 0) | (np.diff(trace.phase) != 0)
    cuts = np.concatenate([[0], np.flatnonzero(change) + 1, [T]])
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))


def chunk_calls(experts: np.ndarray, num_experts: int, request: int) -> list[Call]:
    """experts [n, L, K] of one prefill chunk -> one Call per layer, experts in first-use order (as make_call)."""
    n, L, K = experts.shape
    keys = experts.astype(np.int64).transpose(1, 0, 2).reshape(-1)  # [L * n * K], layer-major
    keys = keys + np.repeat(np.arange(L, dtype=np.int64) * num_experts, n * K)
    uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")  # layer-major, then first use
    uniq, counts = uniq[order], counts[order]
    layer_of = uniq // num_experts
    bounds = np.searchsorted(layer_of, np.arange(L + 1))
    ids = (uniq - layer_of * num_experts).tolist()
    counts = counts.tolist()
    return [Call(layer, ids[bounds[layer]:bounds[layer + 1]], counts[bounds[layer]:bounds[layer + 1]], PREFILL,
                 request) for layer in range(L)]


def trace_calls(trace: RoutingTrace, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> Iterator[Call]:
    if prefill_chunk <= 0:
        raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")
    L = trace.num_layers
    for start, end in segments(trace):
        request = int(trace.request[start])
        if trace.phase[start] == PREFILL:
            for lo in range(start, end, prefill_chunk):
                yield from chunk_calls(trace.experts[lo:min(end, lo + prefill_chunk)], trace.num_experts, request)
        else:
            rows = trace.experts[start:end].tolist()  # [n][L][K]
            ones = [1] * trace.top_k
            for row in rows:
                for layer in range(L):
                    yield Call(layer, row[layer], ones, DECODE, request)


def trace_key_stream(trace: RoutingTrace, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> KeyStream:
    """The trace's calls as keys: the future `belady` needs, in the order a replay or a live run plans them."""
    return key_stream(trace_calls(trace, prefill_chunk), trace.num_experts)


def num_calls(trace: RoutingTrace, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> int:
    """How many calls trace_calls yields, without building them (for progress bars)."""
    n = 0
    for start, end in segments(trace):
        n += -(-(end - start) // prefill_chunk) if trace.phase[start] == PREFILL else end - start
    return n * trace.num_layers
