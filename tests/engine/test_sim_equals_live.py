"""Sim = live: the simulator replaying the routing the engine recorded makes exactly the engine's Plans.

Also: the recorded routing is HF's (top-k of its router logits), and the recorded trace is a valid spine trace.
"""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.placement import POLICIES, PlacementPolicy, Split, make_policy
from freetoken.trace import load, save
from freetoken.sim.calls import trace_calls
from freetoken.sim.replay import replay
from freetoken.sim.run import SimConfig, simulate

from .conftest import DECODE_STEPS, FAMILIES, PROMPT, hf_topk, policy_options

SPLITS = {"offload": Split("offload"), "cpu": Split("cpu"), "hybrid": Split("hybrid", bp=2.0, bh=1.0)}
CHUNK = 3
SECOND_PROMPT = [9, 8, 7, 6, 5, 4, 3]


def live_run(ckpt, cache: CacheConfig) -> Engine:
    """Two requests on one engine (the cache carries over between them), greedy, HF-free."""
    engine = Engine(ckpt, cache, kernels="host", device="cpu", prefill_chunk=CHUNK, keep_plans=True)
    for request, prompt in enumerate((PROMPT, SECOND_PROMPT)):
        list(engine.generate(prompt, SamplingParams(greedy=True), max_tokens=DECODE_STEPS + 1, stop_token_ids=[],
                             request=request))
    return engine


@pytest.mark.parametrize("family", FAMILIES)
def test_recorded_routing_is_hf_router_topk(family, hf_models, checkpoints, tmp_path):
    ref = hf_models[family]
    engine = Engine(checkpoints[family], CacheConfig("lru", capacity=3), kernels="host", device="cpu",
                    prefill_chunk=CHUNK)
    out = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=DECODE_STEPS + 1, stop_token_ids=[]))
    trace = load(save(engine.trace(), tmp_path / "live.safetensors"))  # round trip through the file format
    processed = PROMPT + out[:-1]  # the last sampled token is never fed back
    assert trace.token.tolist() == processed
    assert trace.phase.tolist() == [0] * len(PROMPT) + [1] * DECODE_STEPS
    np.testing.assert_array_equal(trace.experts, hf_topk(ref, len(processed)))
    assert trace.num_layers == checkpoints[family].config.num_moe_layers and trace.num_experts == 8


def _sim_policy(name, capacity, trace, options):
    return make_policy(name, capacity, trace.num_layers, trace.num_experts, **options)


def assert_sim_replays_live(ckpt, capacities, splits=tuple(SPLITS)) -> None:
    """Every policy x capacity x split (names in SPLITS) on one checkpoint: the sim's replay of the recorded routing
    makes the live Plans (for families with their own HF-match files)."""
    probe = live_run(ckpt, CacheConfig("lru", capacity=0)).trace()
    for policy in sorted(POLICIES):
        opts = policy_options(policy, probe, CHUNK)
        for capacity in capacities:
            for name in splits:
                split = SPLITS[name]
                engine = live_run(ckpt, CacheConfig(policy, capacity=capacity, split=split, options=opts))
                trace = engine.trace()
                sim = replay(trace_calls(trace, CHUNK), _sim_policy(policy, capacity, trace, opts), split,
                             keep_plans=True)
                assert sim.plans and sim.plans == engine.cache.plans, f"{policy} capacity={capacity} {name}"


@pytest.mark.parametrize("family", [f if f == "qwen3_moe" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_sim_replay_makes_the_live_plans(family, checkpoints):
    ckpt = checkpoints[family]
    probe = live_run(ckpt, CacheConfig("lru", capacity=0))
    probe_trace = probe.trace()
    checked, prefetched = 0, 0
    for policy in sorted(POLICIES):
        opts = policy_options(policy, probe_trace, CHUNK)
        for capacity in (0, 3, 7, 16):
            for name, split in SPLITS.items():
                cache = CacheConfig(policy, capacity=capacity, split=split, options=opts)
                engine = live_run(ckpt, cache)
                trace = engine.trace()
                np.testing.assert_array_equal(trace.experts, probe_trace.experts)  # same inputs, same routing
                sim = replay(trace_calls(trace, CHUNK), _sim_policy(policy, capacity, trace, opts), split,
                             keep_plans=True)
                live_plans = engine.cache.plans
                assert len(sim.plans) == len(live_plans)
                for i, (want, got) in enumerate(zip(sim.plans, live_plans)):
                    assert want == got, f"{policy} capacity={capacity} {name}: call {i} differs"
                total, c = sim.total, engine.counters
                assert (total.hits, total.misses, total.fetched, total.cpu, total.evictions) == (
                    c.hits, c.misses, c.fetched, c.cpu, c.evictions)
                assert total.cpu_tokens == c.cpu_tokens and total.prefetched == c.prefetched
                checked += 1
                prefetched += c.prefetched
    assert checked == len(POLICIES) * 4 * 3
    base = getattr(PlacementPolicy, "prefetch_for", None)
    if any(getattr(cls, "prefetch_for", None) is not base for cls in POLICIES.values()):
        assert prefetched > 0  # a prefetching policy exercised the executor's ahead-of-need copies


def test_simulate_entry_point_agrees(checkpoints):
    """sim.run.simulate (what `ft sim` runs) on the recorded trace gives the live counts."""
    engine = live_run(checkpoints["qwen3_moe"], CacheConfig("lru", capacity=6, split=SPLITS["hybrid"]))
    result = simulate(engine.trace(), SimConfig("lru", SPLITS["hybrid"], capacity=6, prefill_chunk=CHUNK))
    c = engine.counters
    assert result.total.hits == c.hits and result.total.fetched == c.fetched and result.total.cpu == c.cpu
    assert result.total.evictions == c.evictions and c.evictions > 0 and c.hits > 0
