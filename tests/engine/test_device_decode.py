"""The engine with its placement decided on the device (Triton's interpreter here) = the host-policy engine: same
tokens, same recorded trace, same Plans and counters; host syncs per decode step a constant (not per layer); the
CUDA-graph path falls back to eager without CUDA and its static buffers give the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.engine.decode_graphs import MoEGraphs
from freetoken.engine.device_moe import call_union
from freetoken.kernels.moe_union import moe_union_ref
from freetoken.placement import Split
from freetoken.models.checkpoint import load_checkpoint
from freetoken.placement.callstream import make_call

from .conftest import build_checkpoint, policy_options

CHUNK = 4
STEPS = 6
PROMPT = [3, 17, 5, 9, 42, 7, 1, 2, 8, 10]
OFFLOAD, HYBRID = Split("offload"), Split("hybrid", bp=2.0, bh=1.0)


def run(ckpt, cache: CacheConfig, placement: str, **kw) -> tuple[Engine, list[int]]:
    engine = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=CHUNK, placement=placement,
                    keep_plans=kw.pop("keep_plans", True), **kw)
    out = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[]))
    return engine, out


def cache_of(name: str, split: Split, ckpt) -> CacheConfig:
    options = {}
    if name == "frequency":  # profiled on a probe run of the same prompt
        probe, _ = run(ckpt, CacheConfig("lru", capacity=4), "host", keep_plans=False)
        options = policy_options(name, probe.trace(), CHUNK)
    capacity = 8 if name == "static_layers" else 5  # static_layers: one of the two layers resident
    return CacheConfig(name, capacity=capacity, split=split, options=options)


@pytest.mark.parametrize("name, split, pipeline", [("lru", OFFLOAD, False), ("lru", HYBRID, True),
                                                    ("static_layers", OFFLOAD, True), ("frequency", HYBRID, False)])
def test_device_placement_equals_host_policy(name, split, pipeline, ckpt):
    cache = cache_of(name, split, ckpt)
    host, host_out = run(ckpt, cache, "host", pipeline=pipeline)
    dev, dev_out = run(ckpt, cache, "device", pipeline=pipeline)
    assert host.cache.device_moe is None and dev.cache.device_moe is not None
    assert dev_out == host_out
    th, td = host.trace(), dev.trace()
    np.testing.assert_array_equal(td.experts, th.experts)
    np.testing.assert_array_equal(td.gates, th.gates)
    assert dev.cache.plans == host.cache.plans  # read back per call: Plan by Plan
    assert dev.counters == host.counters
    assert dev.cache.decode_counters == host.cache.decode_counters
    c = dev.counters
    assert c.fetched > 0 and c.hits > 0 and (c.cpu > 0) == (split.mode == "hybrid")


@pytest.mark.slow
def test_reset_restores_the_device_state(ckpt):
    engine, first = run(ckpt, CacheConfig("lru", capacity=5), "device", keep_plans=False)
    counts = engine.counters
    engine.reset()
    again = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[]))
    assert again == first and engine.counters == counts


@pytest.fixture(scope="module")
def ckpt(checkpoints):
    """conftest's Qwen3-MoE checkpoint: 2 layers, 8 experts, top-2."""
    return checkpoints["qwen3_moe"]


def _decode_step_counts(ckpt, placement: str) -> dict[str, int]:
    engine = Engine(ckpt, CacheConfig("lru", capacity=3), kernels="reference", device="cpu", placement=placement)
    kv = engine.new_kv(16)
    engine.prefill([1, 2, 3], kv)
    before = engine.host.to_dict()
    engine.decode(5, kv)
    return {k: v - before[k] for k, v in engine.host.to_dict().items()}


def test_syncs_per_decode_step_do_not_grow_with_layers(ckpt, tmp_path):
    # hand-derived: the host path reads the router's ids and the recorder's gates per MoE layer (2 L syncs); the
    # device path copies the step's routing back once, from the recorder's device buffer (1 copy), read without a
    # wait (0 syncs), whatever L is
    three = load_checkpoint(build_checkpoint("qwen3_moe", tmp_path, num_hidden_layers=3))
    for layers, model in ((2, ckpt), (3, three)):
        host, dev = _decode_step_counts(model, "host"), _decode_step_counts(model, "device")
        assert host["syncs"] == 2 * layers
        assert dev["syncs"] == 0 and dev["copies"] == 1
        # no slot-id upload, no per-expert copy: the gather launches (2 per layer: gate_up, down) replace them
        assert host["copies"] >= 3 * layers


@pytest.mark.slow
def test_graph_path_skips_cleanly_without_cuda(ckpt):
    engine, out = run(ckpt, CacheConfig("lru", capacity=5), "device", keep_plans=False)
    assert engine.graphs is None and engine.decode_line == "decode: eager (CUDA graphs need CUDA)"
    eager = Engine(ckpt, CacheConfig("lru", capacity=5), kernels="reference", device="cpu", placement="device",
                   eager=True)
    assert eager.graphs is None and eager.decode_line == "decode: eager (--eager)"
    host = Engine(ckpt, CacheConfig("s3fifo", capacity=5), kernels="reference", device="cpu")
    assert host.cache.device_moe is None and "no device form" in host.cache.placement_line
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        MoEGraphs(engine._moe_device, torch.device("cpu"), engine.host, capture=True)
    # what capture would record, run eagerly through the static buffers: same tokens, one entry per layer
    graphs = MoEGraphs(eager._moe_device, torch.device("cpu"), eager.host, capture=False)
    eager.graphs = graphs
    again = list(eager.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[]))
    assert again == out
    assert sorted(graphs.entries) == [(0, 1), (1, 1)]  # decode at batch 1, each MoE layer
    assert all(g is None and h.shape == (1, ckpt.config.hidden_size) for g, h, _ in graphs.entries.values())


def test_call_union_equals_the_match_matrix_reference():
    g = torch.Generator().manual_seed(0)
    for T, K, E in [(1, 1, 1), (1, 8, 128), (7, 2, 4), (64, 8, 128), (300, 4, 16), (513, 6, 256), (40, 8, 512)]:
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)  # [T, K]
        got, want = call_union(ids, E), moe_union_ref(ids, E)  # the M x M match matrices
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (T, K, E)
        assert got[0].dtype == got[1].dtype == torch.int32
    # fixed shapes and no host read: it runs on the meta device (no data), at a 2048-token prefill chunk's M
    experts, tokens = call_union(torch.empty(2048, 8, dtype=torch.int32, device="meta"), 128)
    assert experts.shape == tokens.shape == (128,)


def test_call_union_is_make_calls_call():
    g = np.random.default_rng(0)
    for T, K, E in [(1, 4, 8), (3, 2, 4), (5, 3, 6), (6, 2, 16)]:
        ids = np.stack([g.choice(E, K, replace=False) for _ in range(T)])  # [T, K]
        call = make_call(0, ids, 0)
        experts, tokens = call_union(torch.from_numpy(ids).to(torch.int32), E)
        n = len(call.experts)
        assert experts.numel() == min(T * K, E)
        assert experts[:n].tolist() == call.experts and tokens[:n].tolist() == call.tokens
        assert (experts[n:] == -1).all() and (tokens[n:] == 0).all()


def test_batched_decode_on_the_device_equals_host(ckpt):
    # a step of 3 sequences is one call over the union of their experts (first-use order, token counts)
    results = {}
    for placement in ("host", "device"):
        engine = Engine(ckpt, CacheConfig("lru", capacity=5), kernels="reference", device="cpu",
                        placement=placement, keep_plans=True)
        kvs = [engine.new_kv(32) for _ in range(3)]
        for kv, prompt in zip(kvs, ([1, 2, 3], [4, 5], [6, 7, 8, 9])):
            engine.prefill(prompt, kv)
        logits = [engine.decode_batch([11, 12, 13], kvs), engine.decode_batch([14, 15, 16], kvs)]
        results[placement] = (torch.cat(logits), engine.cache.plans, engine.counters, engine.trace().experts)
    (lh, ph, ch, th), (ld, pd, cd, td) = results["host"], results["device"]
    torch.testing.assert_close(ld, lh, rtol=0, atol=0)
    assert pd == ph and cd == ch
    np.testing.assert_array_equal(td, th)
    assert any(len(p.hits) + len(p.fetch) + len(p.cpu) > 2 for p in pd[-4:])  # unions wider than top-2


def test_device_path_issues_the_cpu_lane_before_the_gpu_lane_waits(ckpt):
    engine = Engine(ckpt, CacheConfig("lru", capacity=5, split=HYBRID), kernels="reference", device="cpu",
                    placement="device", pipeline=True)
    ex, dm = engine.cache.executor, engine.cache.device_moe
    log: list[str] = []

    def logged(name, fn):
        return lambda *a, **kw: (log.append(name), fn(*a, **kw))[1]

    ex._cpu_lane_start = logged("cpu issued", ex._cpu_lane_start)
    ex._wait = logged("gpu waits", ex._wait)
    dm._gather = logged("gather issued", dm._gather)
    list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[]))
    assert engine.counters.cpu > 0 and log.count("cpu issued") > 0
    calls = "".join("c" if e == "cpu issued" else "g" if e == "gather issued" else "w" for e in log)
    # per call: [cpu issued] gather issued, gpu waits; the CPU lane never after its call's gather or wait
    assert calls.replace("cgw", "").replace("gw", "") == ""


class HostSilentGraph:
    """A CPU stand-in for a captured graph: replay runs the block's device work into the static output, and undoes
    what only the host side of the block does (counters, the recorder's bookkeeping), as a real replay never runs it."""

    def __init__(self, engine, layer, h_in, out):
        self.engine, self.layer, self.h_in, self.out = engine, layer, h_in, out

    def replay(self):
        e = self.engine
        counts, marked = e.host.to_dict(), e.recorder._on_device
        self.out.copy_(e._moe_device(self.layer, self.h_in))
        for name, value in counts.items():
            setattr(e.host, name, value)
        e.recorder._on_device = marked


def test_replayed_blocks_keep_tokens_trace_and_count_one_launch(ckpt):
    cache = CacheConfig("lru", capacity=5)
    host, host_out = run(ckpt, cache, "host", keep_plans=False)
    engine = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=CHUNK, placement="device")
    graphs = MoEGraphs(engine._moe_device, torch.device("cpu"), engine.host, capture=False)
    graphs.capture = True  # capture = the stand-in above (no CUDA here)
    graphs._capture = lambda layer, h_in: (lambda out: (HostSilentGraph(engine, layer, h_in, out), out))(
        torch.empty_like(h_in))
    engine.graphs = graphs
    kv = engine.new_kv(32)
    out = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=STEPS, stop_token_ids=[], kv=kv))
    assert out == host_out and graphs.replays == 2 * (STEPS - 2)  # first decode step captures, the rest replay
    np.testing.assert_array_equal(engine.trace().experts, host.trace().experts)
    np.testing.assert_array_equal(engine.trace().gates, host.trace().gates)
    assert engine.counters == host.counters
    before = engine.host.to_dict()
    engine.decode(out[-1], kv)
    step = {k: v - before[k] for k, v in engine.host.to_dict().items()}
    # hand-derived, per layer: attention 6 launches (add_norm_linear: the input norm and the fused q/k/v projection,
    # qk_norm_rope: q/k norms, ropes and KV writes, decode attention 2, the o projection, the post norm) + 1 graph;
    # the final norm and lm_head 2; one copy and no sync: the recorder's copy, read once the next token is
    assert step == {"launches": 2 * 7 + 2, "syncs": 0, "copies": 1}


@pytest.mark.parametrize("kind", ["int4", "fp4"])
def test_packed_experts_gather_into_the_slots_host_copies_fill(kind):
    # a packed pool: every tensor of gate / up / down gathered by the device path = SlotPool.load's copies
    from freetoken.engine.device_moe import DeviceMoE
    from freetoken.engine.executor import LiveExecutor
    from freetoken.engine.kernelset import kernel_set
    from freetoken.engine.slots import SlotPool
    from freetoken.placement import DECODE, build_policy
    from tests.engine.test_cpu_lane_quant import E, _store

    store, _ = _store(kind)
    cache = CacheConfig("lru", capacity=2)
    host_ex, dev_ex = (LiveExecutor(store, SlotPool(2, E, store, "cpu"), kernel_set("reference"), torch.device("cpu"))
                       for _ in range(2))
    host_policy = build_policy(cache, 1, E)
    device = DeviceMoE(build_policy(cache, 1, E), OFFLOAD, dev_ex)
    g = torch.Generator().manual_seed(3)
    for ids in ([[0, 1]], [[2, 3]], [[0, 2]], [[1, 3]]):
        ids = np.array(ids)
        x, w = torch.randn(1, store.hidden, generator=g), torch.rand(1, 2, generator=g)
        want = host_ex.run(host_policy.plan(make_call(0, ids, DECODE), OFFLOAD), x, w, ids, DECODE)
        got = device(0, x, w, torch.from_numpy(ids).to(torch.int32), DECODE)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        for name in ("gate", "up", "down"):
            for a, b in zip(getattr(dev_ex.pool, name).tensors().values(), getattr(host_ex.pool, name).tensors().values()):
                assert torch.equal(a[:2], b[:2])  # the cache slots hold the same packed bytes
    assert dev_ex.counters == host_ex.counters and dev_ex.counters.evictions > 0
