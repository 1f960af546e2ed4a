"""Continuous batching for every cache kind: 4 concurrent greedy requests through the server's scheduler on tiny
Qwen3.5-MoE (Gated DeltaNet states), DeepSeek-V3 (MLA), GLM-5 (DSA, index_topk 4 below the sequences' lengths) and
DeepSeek-V4 (compressed sparse + heavily compressed attention) each get the tokens of their solo run; each batched
decode step is one forward (one MoE call per layer over the batch); `ft sim --batch 4`'s replay of the recorded
routing makes the live Plans."""

from __future__ import annotations

import math

import pytest

from freetoken.sim.continuous import batched_calls
from freetoken.sim.replay import replay
from test_sim_batch import CHUNK, MAX_NEW, PROMPTS, live_batched
from tinymodel import write_tiny_model

KINDS = ("qwen3_5_moe", "deepseek_v3", "glm_moe_dsa", "deepseek_v4")


@pytest.fixture(scope="module", params=KINDS)
def model_dir(request, tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp(request.param) / request.param, kind=request.param)


def test_concurrent_requests_equal_their_solo_runs(model_dir):
    from freetoken.engine import CacheConfig, Engine, SamplingParams
    from freetoken.placement import Split, make_policy

    engine, batch_sizes, outputs = live_batched(model_dir, "lru", capacity=5, outputs=True)
    solo = Engine.from_pretrained(model_dir, CacheConfig("lru", capacity=5), kernels="reference", device="cpu",
                                  prefill_chunk=CHUNK)
    for prompt, n, got in zip(PROMPTS, MAX_NEW, outputs):
        assert got == list(solo.generate(prompt, SamplingParams(greedy=True), max_tokens=n, stop_token_ids=[]))
    # every decode step of the run, batched or alone, is one forward: one MoE call per layer
    assert max(batch_sizes) >= 3 and sum(batch_sizes) == sum(n - 1 for n in MAX_NEW)
    prefill_forwards = sum(math.ceil(len(p) / CHUNK) for p in PROMPTS)
    L = engine.config.num_moe_layers
    assert len(engine.cache.plans) == (prefill_forwards + len(batch_sizes)) * L
    trace = engine.trace()
    sim = replay(batched_calls(trace, 4, CHUNK), make_policy("lru", 5, trace.num_layers, trace.num_experts), Split(),
                 keep_plans=True)
    assert sim.plans == engine.cache.plans
