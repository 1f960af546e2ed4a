"""The trace's router-hint field (optional, round trip, validation), its per-layer accuracy, and the two replays of
it: the recorded predictions (RecordedHint) and a synthetic hint at the measured accuracy (MeasuredHint)."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.placement import make_policy
from freetoken.placement.router_hint import MeasuredHint, RecordedHint
from freetoken.sim.calls import trace_calls
from freetoken.trace import RoutingTrace, TraceError, load, save
from freetoken.trace.stats import forward_spans, hint_accuracy


def small_trace() -> RoutingTrace:
    """3 decode tokens, 2 layers, top-2 of 4 experts; the hint of layer 1 right on 2, 1 and 0 of each token's 2."""
    experts = np.array([[[0, 1], [2, 3]], [[1, 2], [0, 1]], [[3, 0], [1, 2]]], np.int16)
    hint = np.array([[[-1, -1], [3, 2]], [[-1, -1], [1, 3]], [[-1, -1], [0, 3]]], np.int16)
    return RoutingTrace(experts=experts, num_experts=4, phase=np.ones(3, np.int8), hint=hint)


def test_hint_round_trips_and_a_trace_without_it_loads(tmp_path):
    trace = small_trace()
    back = load(save(trace, tmp_path / "h.safetensors"))
    np.testing.assert_array_equal(back.hint, trace.hint)
    plain = load(save(RoutingTrace(experts=trace.experts, num_experts=4), tmp_path / "p.safetensors"))
    assert plain.hint is None and np.isnan(hint_accuracy(plain)).all()
    np.testing.assert_array_equal(trace.select(np.array([False, True, True])).hint, trace.hint[1:])


def test_bad_hint_names_the_field():
    t = small_trace()
    with pytest.raises(TraceError, match="field 'hint' holds ids outside"):
        RoutingTrace(experts=t.experts, num_experts=4, hint=np.where(t.hint == 3, 4, t.hint).astype(np.int16))
    with pytest.raises(TraceError, match="field 'hint' must be int16"):
        RoutingTrace(experts=t.experts, num_experts=4, hint=t.hint.astype(np.int32))


def test_hint_accuracy_by_hand():
    acc = hint_accuracy(small_trace())
    assert np.isnan(acc[0])
    assert acc[1] == pytest.approx((2 + 1 + 0) / 6)  # {2,3}&{3,2}: 2, {0,1}&{1,3}: 1, {1,2}&{0,3}: 0


def test_recorded_hint_replays_the_predictions():
    """Call by call: the call of layer 0 of token t is told token t's recorded layer-1 keys; layer 1 nothing."""
    trace = small_trace()
    hint = RecordedHint(trace, prefill_chunk=4)
    told = [hint.upcoming(call) for call in trace_calls(trace, 4)]
    assert told == [[4 + 3, 4 + 2], [], [4 + 1, 4 + 3], [], [4 + 0, 4 + 3], []]
    with pytest.raises(ValueError, match="holds no recorded hint"):
        RecordedHint(RoutingTrace(experts=trace.experts, num_experts=4), 4)


def test_recorded_hint_merges_a_prefill_chunk_like_a_call():
    """A prefill chunk of 3 tokens: the hint of the chunk's layer-0 call is the union of its tokens' predictions,
    in first-appearance order (as the engine's live hint merges them)."""
    t = small_trace()
    trace = RoutingTrace(experts=t.experts, num_experts=4, hint=t.hint)  # phase 0: one prefill chunk
    told = [RecordedHint(trace, 3).upcoming(call) for call in list(trace_calls(trace, 3))[:1]]
    assert told == [[4 + 3, 4 + 2, 4 + 1, 4 + 0]]


def random_trace(tokens: int = 3000, layers: int = 4, experts: int = 16, k: int = 2, seed: int = 1) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    ex = np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :k].astype(np.int16)
    return RoutingTrace(experts=ex, num_experts=experts, phase=np.ones(tokens, np.int8))


def test_measured_hint_runs_at_the_given_accuracy():
    """The synthetic hint keeps each true key of layer l with probability a_l: its empirical per-layer accuracy
    (predicted keys among the next call's true keys, over all calls) is a_l within 3 binomial sigmas."""
    trace = random_trace()
    acc = np.array([np.nan, 0.7, 0.4, 1.0])
    hint = MeasuredHint(trace, 64, accuracy=acc, seed=3)
    calls = list(trace_calls(trace, 64))
    E, right, total = trace.num_experts, np.zeros(4), np.zeros(4)
    for c, call in enumerate(calls):
        told = hint.upcoming(call)
        if call.layer + 1 < trace.num_layers:
            nxt = {(call.layer + 1) * E + e for e in calls[c + 1].experts}
            right[call.layer + 1] += len(set(told) & nxt)
            total[call.layer + 1] += len(nxt)
        else:
            assert told == []
    for layer in (1, 2):
        sigma = np.sqrt(acc[layer] * (1 - acc[layer]) / total[layer])
        assert abs(right[layer] / total[layer] - acc[layer]) < 3 * sigma + 0.01  # + a collision's share
    assert right[3] == total[3]


def test_measured_hint_defaults_to_the_trace_accuracy_and_is_seeded():
    trace = small_trace()
    assert MeasuredHint(trace, 4).accuracy[1] == pytest.approx(hint_accuracy(trace)[1])
    calls = list(trace_calls(random_trace(200), 64))
    a, b, c = (MeasuredHint(random_trace(200), 64, accuracy=[1, .5, .5, .5], seed=s) for s in (0, 0, 1))
    told = [[h.upcoming(call) for call in calls] for h in (a, b, c)]
    assert told[0] == told[1] and told[0] != told[2]


def test_lookahead_runs_from_a_replayed_hint():
    """A hint object goes to the interpreted class (the compiled one takes only its own oracle)."""
    trace = small_trace()
    policy = make_policy("lookahead", 3, 2, 4, hint=RecordedHint(trace, 4))
    assert type(policy).__name__ == "Lookahead"


def test_forward_spans_by_hand():
    """Prefill in chunks per request; decode one token per forward, or a verify call (0 then its 1 / 2 drafts)."""
    ex = np.zeros((9, 1, 1), np.int16)
    trace = RoutingTrace(experts=ex, num_experts=2, request=np.array([0, 0, 0, 0, 0, 0, 0, 1, 1], np.int32),
                         phase=np.array([0, 0, 0, 1, 1, 1, 1, 1, 1], np.int8),
                         draft=np.array([0, 0, 0, 0, 1, 2, 0, 0, 1], np.int8))
    assert forward_spans(trace, 2) == [(0, 2), (2, 3), (3, 6), (6, 7), (7, 9)]
    plain = RoutingTrace(experts=ex, num_experts=2, request=trace.request, phase=trace.phase)
    assert forward_spans(plain, 2) == [(0, 2), (2, 3)] + [(t, t + 1) for t in range(3, 9)]


def hinted_trace(tokens: int, keep=(0.7, 0.4, 0.95), seed: int = 4) -> RoutingTrace:
    """random_trace's routing (4 layers, top-2 of 16) with a recorded hint of layers 1-3: each true pick kept with
    probability keep[l - 1], else an expert the token does not use."""
    t = random_trace(tokens)
    rng = np.random.default_rng(seed)
    hint = np.full_like(t.experts, -1)
    for layer in (1, 2, 3):
        for i in range(tokens):
            unused = np.setdiff1d(np.arange(16), t.experts[i, layer])
            hint[i, layer] = [e if rng.random() < keep[layer - 1] else rng.choice(unused) for e in t.experts[i, layer]]
    return RoutingTrace(experts=t.experts, num_experts=16, phase=t.phase, hint=hint)


def test_hinted_sweep_measures_a_recorded_hint_as_the_trace_does():
    """measure=True: after a replay of decode tokens (a call = one token's top-k), the running tally per layer is
    the trace's own measured accuracy (trace.stats.hint_accuracy); the option's 0.9 is not what it weighs by."""
    from freetoken.placement import Split
    from freetoken.placement.policies.sweep.hinted_sweep import HintedSweep

    trace = hinted_trace(300)
    measured = hint_accuracy(trace)
    policy = HintedSweep(10, 4, 16, hint=RecordedHint(trace, 64), accuracy=0.9, depth=1, min_confidence=0.5,
                         decay=0.8, measure=True)
    plans = [policy.plan(c, Split("offload")) for c in trace_calls(trace, 64)]
    assert policy.measured_accuracy() == pytest.approx(measured.tolist(), nan_ok=True)
    assert not np.allclose(measured[1:], 0.9)
    plain = make_policy("hinted_sweep", 10, 4, 16, hint=RecordedHint(trace, 64), accuracy=0.9, depth=1,
                        min_confidence=0.5, decay=0.8)
    assert [plain.plan(c, Split("offload")) for c in trace_calls(trace, 64)] != plans


def test_sim_replays_a_recorded_or_measured_hint_from_the_trace():
    from freetoken.placement import Split
    from freetoken.sim.replay import replay
    from freetoken.sim.run import SimConfig, simulate

    trace = hinted_trace(200)
    opts = dict(depth=1, min_confidence=0.5, decay=0.8, measure=True)
    for kind, hint in (("recorded", RecordedHint(trace, 64)), ("measured", MeasuredHint(trace, 64, seed=0))):
        sim = simulate(trace, SimConfig("hinted_sweep", Split("offload"), capacity=10, prefill_chunk=64,
                                        options={**opts, "hint": kind}), keep_plans=True)
        ref = replay(trace_calls(trace, 64), make_policy("hinted_sweep", 10, 4, 16, hint=hint, **opts),
                     Split("offload"), keep_plans=True)
        assert sim.plans == ref.plans and sim.total.prefetched == ref.total.prefetched
    plain = random_trace(50)  # no recorded hint: neither replay may stand in a perfect one for it
    for kind in ("recorded", "measured"):
        with pytest.raises(ValueError, match=f"hint={kind} needs a trace with a recorded hint"):
            simulate(plain, SimConfig("hinted_sweep", Split("offload"), capacity=10, prefill_chunk=64,
                                      options={**opts, "hint": kind}))
    for bad, err in (({"hint": "router"}, "live only"), ({"hint": "later"}, "one of recorded, measured"),
                     ({"hint": "recorded", "batch": 2}, "takes neither")):
        extra = {"batch": bad.pop("batch")} if "batch" in bad else {}
        with pytest.raises(ValueError, match=err):
            simulate(trace, SimConfig("hinted_sweep", Split("offload"), capacity=10, prefill_chunk=64,
                                      options={**opts, **bad}, **extra))
