"""Per-call metadata and the result record's TTFT / turn latencies, against a two-request trace worked by hand."""

import numpy as np
import pytest

from freetoken.trace import RoutingTrace
from freetoken.sim.calls import trace_calls
from freetoken.sim.cost import CallTimes, call_meta
from freetoken.sim.prediction import summarize
from freetoken.sim.replay import COLUMNS, ReplayLog


def two_request_trace() -> RoutingTrace:
    # request 0: turn 0 = prefill 5 + decode 2, turn 1 = prefill 1 + decode 1; request 1: prefill 3 + decode 1
    phase = [0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1]
    request = [0] * 9 + [1] * 4
    turn = [0] * 7 + [1, 1] + [0] * 4
    T = len(phase)
    experts = np.tile(np.array([[0, 1], [2, 3]], np.int16)[None], (T, 1, 1))  # [T, L=2, K=2]
    return RoutingTrace(experts, 4, request=np.array(request, np.int32), turn=np.array(turn, np.int32),
                        phase=np.array(phase, np.int8))


def test_call_meta_follows_trace_calls_with_context_by_hand():
    trace = two_request_trace()
    meta = call_meta(trace, prefill_chunk=2)
    calls = list(trace_calls(trace, prefill_chunk=2))
    assert len(meta.tokens) == len(calls)
    # per layer-0 call: (tokens, context, turn); chunk 2 splits the 5-token prefill into 2 + 2 + 1
    want = [(2, 0, 0), (2, 2, 0), (1, 4, 0), (1, 5, 0), (1, 6, 0),  # request 0, turn 0
            (1, 7, 1), (1, 8, 1),  # turn 1 keeps its context
            (2, 0, 0), (1, 2, 0), (1, 3, 0)]  # request 1 starts from 0
    got = list(zip(meta.tokens[::2].tolist(), meta.context[::2].tolist(), meta.turn[::2].tolist()))
    assert got == want
    assert [c.layer for c in calls[:2]] == [0, 1] and meta.tokens[1] == meta.tokens[0]


def test_ttft_and_turn_latencies_by_hand():
    trace = two_request_trace()
    meta = call_meta(trace, prefill_chunk=2)
    calls = list(trace_calls(trace, prefill_chunk=2))
    N = len(calls)
    log = ReplayLog(**{c: np.zeros(N, np.int64) for c in COLUMNS})
    log.layer[:] = [c.layer for c in calls]
    log.phase[:] = [c.phase for c in calls]
    log.request[:] = [c.request for c in calls]
    log.hits[:] = 2
    # every call takes 1 s, except decode calls of request 0 turn 0 take 3 s
    seconds = np.ones(N)
    slow = (log.phase == 1) & (log.request == 0) & (meta.turn == 0)
    seconds[slow] = 3.0
    times = CallTimes(seconds, seconds, np.zeros(N), np.zeros(N))
    p = summarize(log, meta, times, expert_bytes=10, model="m", hardware="h", engine="e", policy="p", split="s",
                  capacity_experts=8, total_experts=8)
    # turns: r0t0 = 3 prefill chunks x 2 layers (6 s) + 2 decode x 2 layers x 3 s (12 s) = 18 s;
    # r0t1 = 1 chunk (2 s) + 1 decode (2 s) = 4 s; r1t0 = 2 chunks (4 s) + 1 decode (2 s) = 6 s
    assert p.turn_latency_worst_s == pytest.approx(18.0)
    assert p.turn_latency_p50_s == pytest.approx(6.0)
    assert p.ttft_s == pytest.approx((6 + 2 + 4) / 3) and p.ttft_worst_s == pytest.approx(6.0)
    assert (p.prompt_tokens, p.decode_tokens) == (9, 4)
    assert p.prefill_tok_s == pytest.approx(9 / 12) and p.decode_tok_s == pytest.approx(4 / 16)
    assert p.miss_rate == 0.0
