"""GPU only (marker `gpu`: skipped without CUDA): the engine on CUDA with Triton kernels, its placement decided on the
device and each decode MoE block replayed as a CUDA graph, generates what the host-placement engine generates
eagerly on the same GPU: the same tokens, recorded routing and counters, and (run eagerly, since keep_plans reads
each decision back) the same Plans (tests/engine/test_device_decode.py checks the same on a CPU with the graphs'
stand-in)."""

from __future__ import annotations

import numpy as np
import pytest

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.placement import Split

pytestmark = pytest.mark.gpu

PROMPT = [3, 17, 5, 9, 42, 7, 1, 2, 8, 10]
STEPS = 8


@pytest.fixture(scope="module")
def ckpt(checkpoints):
    return checkpoints["qwen3_moe"]


def run(ckpt, cache: CacheConfig, placement: str, eager: bool, keep_plans: bool) -> tuple[Engine, list[int]]:
    engine = Engine(ckpt, cache, kernels="triton", device="cuda", prefill_chunk=4, placement=placement, eager=eager,
                    keep_plans=keep_plans)
    return engine, list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[]))


@pytest.mark.parametrize("name, capacity, split", [("lru", 5, Split("offload")),
                                                   ("static_layers", 8, Split("offload"))])
def test_device_placement_with_graphs_equals_host_placement(ckpt, name, capacity, split):
    cache = CacheConfig(name, capacity=capacity, split=split)
    host, host_out = run(ckpt, cache, "host", eager=True, keep_plans=True)
    dev, dev_out = run(ckpt, cache, "device", eager=False, keep_plans=False)  # keep_plans reads back: eager only
    assert dev.cache.device_moe is not None and dev.graphs is not None and dev.graphs.replays > 0
    assert dev_out == host_out
    np.testing.assert_array_equal(dev.trace().experts, host.trace().experts)
    assert dev.counters == host.counters and dev.counters.fetched > 0
    eager, eager_out = run(ckpt, cache, "device", eager=True, keep_plans=True)  # the device's decisions one by one
    assert eager_out == host_out and eager.cache.plans == host.cache.plans
