"""The prefill double buffer's copies (ReplayResult.streamed) come from the one replay that makes the log: the same
decisions as a plain replay, and per streamed call the experts of its layer that a brute-force second replay through
policy.plan finds not resident just before the call (what the engine's _stream_next reads)."""

import numpy as np
import pytest

from freetoken.placement import Split, make_policy
from freetoken.placement.config import policy_options
from freetoken.sim.replay import replay_stream
from freetoken.sim.run import call_stream
from freetoken.trace import RoutingTrace

from tests.test_policy_reference import random_trace

L, E, CHUNK = 3, 6, 8
OFFLOAD = Split("offload", admit_prefill=False)
HYBRID = Split("hybrid", bp=2.0, bh=1.0)
POLICIES = ("lru", "static_layers", "lookahead")  # lookahead prefetches in prefill: residency moves inside a run


def brute_force_streams(calls, policy, split, prefill_split) -> list[int]:
    """Each prefill call of layer >= 1: its layer's experts holding no slot before it is planned; -1 elsewhere."""
    out = []
    for call in calls:
        prefill = call.phase == 0
        out.append(sum(policy.slot(call.layer, e) < 0 for e in range(E)) if prefill and call.layer >= 1 else -1)
        policy.plan(call, prefill_split if prefill else split)
    return out


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("splits", [(OFFLOAD, None), (HYBRID, OFFLOAD)], ids=["offload", "hybrid-prefill-offload"])
def test_streams_recorded_in_the_replay_equal_a_second_replay(name, reference, splits):
    split, prefill_split = splits
    trace, stream = _trace_and_calls()

    def policy():
        return _policy(name, trace, stream, reference)

    plain = replay_stream(stream, policy(), split, prefill_split=prefill_split)
    got = replay_stream(stream, policy(), split, prefill_split=prefill_split, double_buffer=True)
    assert plain.streamed is None
    for column in ("hits", "fetched", "cpu", "evictions", "prefetched", "fetch_tokens", "cpu_tokens"):
        np.testing.assert_array_equal(getattr(got.log, column), getattr(plain.log, column))
    expected = brute_force_streams(stream.calls(), policy(), split, prefill_split or split)
    assert got.streamed.tolist() == expected
    assert any(s > 0 for s in expected)


def test_lookahead_prefetches_inside_a_prefill_run():
    # why each streamed call reads residency just before it (not once per prefill run): a prefetch lands mid-run
    trace, stream = _trace_and_calls()
    got = replay_stream(stream, _policy("lookahead", trace, stream), OFFLOAD, double_buffer=True)
    prefill = (stream.phase == 0) & (stream.layer < L - 1)
    assert got.log.prefetched[prefill].sum() > 0


def test_admitted_prefill_fetches_stream_nothing():
    trace, stream = _trace_and_calls()
    for split in (Split("offload"), HYBRID):  # admitted (the default), or not offload
        got = replay_stream(stream, _policy("lru", trace, stream), split, double_buffer=True)
        assert got.streamed.tolist() == [-1] * stream.num_calls


def test_predict_replays_once_with_the_double_buffer(monkeypatch):
    # the double buffer's copies once came from a second, interpreted replay; predict now builds one policy
    import freetoken.sim.run as run
    from freetoken.sim.engines import get_engine, with_settings
    from freetoken.sim.hardware import load_hardware
    from freetoken.sim.model_card import load_model_card
    from freetoken.sim.predict import predict

    built = []
    real = run.build_policy
    monkeypatch.setattr(run, "build_policy", lambda *a, **k: built.append(1) or real(*a, **k))
    card = load_model_card("mixtral-8x7b")
    rng = np.random.default_rng(0)
    T = 48
    experts = np.stack([rng.permutation(card.num_experts)[:card.top_k] for _ in range(T * card.moe_layers)])
    trace = RoutingTrace(experts.reshape(T, card.moe_layers, card.top_k).astype(np.int16), card.num_experts,
                         phase=(np.arange(T) >= 40).astype(np.int8))
    engine = with_settings(get_engine("freetoken-offload"), double_buffer=True)
    pred = predict(card, load_hardware("rtx5090-ryzen"), engine, trace, capacity=card.num_keys // 2)
    assert len(built) == 1
    assert pred.inputs["host_work_prefill"]["copies"] > 0


def _trace_and_calls():
    from freetoken.sim.run import SimConfig

    trace = random_trace(5, T=40, L=L, E=E, K=2)  # two requests, prefill chunks of CHUNK tokens then decode
    return trace, call_stream(trace, SimConfig("lru", OFFLOAD, capacity=7, prefill_chunk=CHUNK))[0]


def _policy(name, trace, stream, reference=False):
    """A fresh policy of 7 slots with its profile / future read from the replayed calls, as sim.run builds it."""
    from freetoken.sim.run import SimConfig

    options = policy_options(SimConfig(name, OFFLOAD, capacity=7), profile=trace, future=stream.key_stream())
    return make_policy(name, 7, L, E, reference=reference, **options)
