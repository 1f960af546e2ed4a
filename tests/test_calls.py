"""Trace -> calls: chunking, phases, and agreement with make_call (the engine's path)."""

import numpy as np

from freetoken.placement import DECODE, PREFILL, make_call
from freetoken.trace import RoutingTrace
from freetoken.sim.calls import num_calls, segments, trace_calls


def _trace(seed=0, T=23, L=3, E=6, K=2):
    rng = np.random.default_rng(seed)
    ex = np.stack([np.stack([rng.choice(E, K, replace=False) for _ in range(L)]) for _ in range(T)]).astype(np.int16)
    request = np.array([0] * 12 + [1] * 11, np.int32)
    phase = np.array([0] * 7 + [1] * 5 + [0] * 6 + [1] * 5, np.int8)
    return RoutingTrace(ex, E, request=request, phase=phase)


def test_segments_split_on_request_and_phase():
    assert segments(_trace()) == [(0, 7), (7, 12), (12, 18), (18, 23)]


def test_calls_follow_chunks_and_match_make_call():
    tr = _trace()
    calls = list(trace_calls(tr, prefill_chunk=4))
    # prefill 7 tokens -> chunks of 4 + 3; decode 5 tokens; prefill 6 -> 4 + 2; decode 5: (2 + 5 + 2 + 5) * L calls
    assert len(calls) == (2 + 5 + 2 + 5) * tr.num_layers == num_calls(tr, 4)
    expected = []
    for lo, hi, phase, req in [(0, 4, PREFILL, 0), (4, 7, PREFILL, 0)] + [(t, t + 1, DECODE, 0) for t in range(7, 12)] \
            + [(12, 16, PREFILL, 1), (16, 18, PREFILL, 1)] + [(t, t + 1, DECODE, 1) for t in range(18, 23)]:
        for layer in range(tr.num_layers):
            expected.append(make_call(layer, tr.experts[lo:hi, layer, :], phase, req))
    assert calls == expected


def test_make_call_counts_tokens_per_expert():
    call = make_call(2, np.array([[3, 1], [1, 4], [3, 1]]), PREFILL)
    assert call.experts == [3, 1, 4]  # first-use order
    assert call.tokens == [2, 3, 1]
    decode = make_call(0, np.array([[5, 0]]), DECODE)
    assert decode.experts == [5, 0] and decode.tokens == [1, 1]
