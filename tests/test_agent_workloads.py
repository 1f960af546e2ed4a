"""Agent workloads (sim.agent) and the prediction band (sim.band): turn structure, KV reuse and the metrics by hand."""

import numpy as np
import pytest

from freetoken.sim.agent import AGENT_WORKLOADS, agent_trace, workload_turns
from freetoken.sim.cost import call_meta
from freetoken.sim.hardware import load_hardware
from freetoken.sim.model_card import load_model_card
from freetoken.sim.predict import predict


@pytest.fixture(scope="module")
def card():
    return load_model_card("qwen3-30b-a3b")


def test_workload_shapes_are_the_documented_sessions():
    coding = workload_turns("coding-session")
    assert 58_000 <= sum(p + d for p, d in coding) <= 62_000 and len(coding) == 10
    assert len(workload_turns("tool-use")) == 13
    assert workload_turns("decode-heavy")[0][1] > workload_turns("decode-heavy")[0][0]
    with pytest.raises(ValueError, match="valid: decode-heavy"):
        workload_turns("nope")


def test_turns_reuse_the_kv_cache_by_hand(card):
    turns = [(100, 5), (30, 4), (20, 3)]
    trace = agent_trace(card, turns, warmup_decode=2)
    assert trace.num_tokens == sum(p + d for p, d in turns) + 2
    meta = call_meta(trace, prefill_chunk=64)
    first = slice(None, None, card.moe_layers)  # one entry per chunk / token
    tokens, ctx, turn = meta.tokens[first], meta.context[first], meta.turn[first]
    # turn 0: chunks of 64 + 36 at context 0, 64; 5 decode steps at 100..104; turn 1's prompt at 105 (kept KV)
    assert tokens[:3].tolist() == [64, 36, 1] and ctx[:3].tolist() == [0, 64, 100]
    t1 = np.flatnonzero(turn == 1)[0]
    assert (tokens[t1], ctx[t1]) == (30, 105)
    t2 = np.flatnonzero(turn == 2)[0]
    assert (tokens[t2], ctx[t2]) == (20, 105 + 34)


def test_agent_metrics_differ_and_match_their_definitions(card):
    hw = load_hardware("rtx5090-ryzen")
    turns = [(600, 24), (200, 16), (50, 40)]
    pred = predict(card, hw, "freetoken-offload", agent_trace(card, turns))
    # mean TTFT over three turns; the first turn's prompt is the largest, so the worst TTFT is above the mean
    assert pred.ttft_worst_s > pred.ttft_s > 0
    assert pred.turn_latency_worst_s > pred.turn_latency_p50_s
    # per-request mean decode tok/s: the mean of each turn's rate, not the pooled rate (they differ with turns)
    assert pred.decode_tok_s_turn_mean != pytest.approx(pred.decode_tok_s, rel=1e-9)
    assert pred.decode_tokens == 24 + 16 + 40 and pred.prompt_tokens == 850


def test_band_holds_the_point_and_locality_moves_a_cache_engine(card):
    from freetoken.sim.band import locality_band

    hw = load_hardware("rtx5090-ryzen")  # holds part of the experts: locality decides the hits
    make = lambda **r: agent_trace(card, [(128, 96)], **r)  # noqa: E731
    point = predict(card, hw, "freetoken-offload", make())
    band = locality_band(card, hw, "freetoken-offload", make, point)
    lo, hi = band["decode_tok_s"]
    assert lo <= point.decode_tok_s <= hi
    # no locality (uniform routing) is the floor of an expert cache: its decode is the band's low end
    assert band["by_routing"]["uniform"]["decode_tok_s"] == pytest.approx(lo)
    assert hi > 1.05 * lo
