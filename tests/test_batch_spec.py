"""Batched decode and speculative decoding (sim.batch) on the one-layer toy of tests/test_cost_lanes.py, by hand.

Toy: one MoE layer of 4 experts (top-2), S = 3 MB per expert, HBM 3 GB/s: a resident expert read costs 1 ms, the
layer's dense weights 1 ms, one context token of KV 1 ns. Every expert resident (capacity 4), no host overheads.
"""

import numpy as np
import pytest

from freetoken.trace import DECODE, PREFILL, RoutingTrace
from freetoken.sim.batch import Speculation, batched_decode, lockstep_items, speculative_decode
from freetoken.sim.engines import Engine
from freetoken.sim.predict import prepare
from tests.test_cost_lanes import KV_NS, MS, toy_card, toy_hw

RESIDENT = Engine("static_layers", "offload", policy_options={"n_cpu_layers": 0}, host_work="graph")


def toy_trace(rows, request, phase) -> RoutingTrace:
    experts = np.asarray(rows, np.int16).reshape(len(rows), 1, 2)  # [T, L=1, K=2]
    return RoutingTrace(experts, 4, request=np.asarray(request, np.int32), phase=np.asarray(phase, np.int8))


@pytest.fixture
def setup():
    return prepare(toy_card(), toy_hw(), RESIDENT, capacity=4, min_context=1)


def test_lockstep_steps_hold_each_sequences_next_token():
    trace = toy_trace([[0, 1], [2, 3], [1, 2], [0, 3], [3, 2]], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1])
    steps = [item.rows.tolist() for item in lockstep_items(trace, 8)]
    assert steps == [[0, 2], [1, 3], [4]]  # request 0 has two tokens, request 1 three


def test_batched_decode_reads_the_union_once_by_hand(setup):
    # two sequences, one decode token each (after no prompt): experts {0,1} and {1,2}: the union is 3 experts
    trace = toy_trace([[0, 1], [1, 2]], [0, 1], [DECODE, DECODE])
    got = batched_decode(setup, trace, host="independent")
    # one step: dense 1 ms + KV of both sequences (context 0 + 1 token each: 2 ns) + 3 expert reads (3 ms)
    step = 1 * MS + 2 * KV_NS + 3 * MS
    assert got.steps == 1 and got.tokens == 2 and got.sequences == 2
    assert got.seconds == pytest.approx(step, rel=1e-9)
    assert got.seconds_per_token == pytest.approx(step / 2, rel=1e-9)  # vs 3 ms alone: batching halves the dense
    assert got.per_sequence_tok_s == pytest.approx(1 / step, rel=1e-9)


def test_speculative_verify_and_acceptance_by_hand(setup):
    # prompt of 2 tokens (one chunk), then 4 decode tokens; d = 1: verify calls of tokens (2,3) and (4,5)
    rows = [[0, 1], [2, 3], [0, 1], [1, 2], [3, 0], [3, 0]]
    trace = toy_trace(rows, [0] * 6, [PREFILL, PREFILL, DECODE, DECODE, DECODE, DECODE])
    spec = Speculation(depth=1, acceptance=0.5)
    assert spec.tokens_per_step == pytest.approx(1.5)  # 1 + a
    assert Speculation(3, 0.8).tokens_per_step == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    got = speculative_decode(setup, trace, spec, plain_layer_s=2 * MS, host="independent")
    # verify 1: experts {0,1,2} at context 2, 2 tokens: dense 1 ms + KV (2 + 2) ns + 3 ms
    # verify 2: experts {3,0} at context 4: dense 1 ms + KV (4 + 2) ns + 2 ms; each step's draft: 1 x 2 ms
    verify = (1 * MS + 4 * KV_NS + 3 * MS) + (1 * MS + 6 * KV_NS + 2 * MS)
    assert got.steps == 2 and got.tokens == pytest.approx(3.0)
    assert got.seconds == pytest.approx(verify + 2 * 2 * MS, rel=1e-9)
    assert got.tok_s == pytest.approx(3.0 / (verify + 4 * MS), rel=1e-9)


def test_speculation_inputs_are_checked():
    with pytest.raises(ValueError, match="depth"):
        Speculation(0, 0.5)
    with pytest.raises(ValueError, match="acceptance"):
        Speculation(1, 1.5)
