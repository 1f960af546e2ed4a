"""Sim = live for host work: the cost model's launch / sync / copy counts (sim.overhead) of the replayed routing
equal what the live engine counted while it ran (freetoken.engine.host_counters), and the launches each kernel-set
call declares equal the Triton kernels it really launches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.kernel_launches import KERNEL_LAUNCHES
from freetoken.placement import Split
from freetoken.sim.overhead import LayerShape, freetoken_work
from freetoken.sim.run import SimConfig, simulate

from .conftest import FAMILIES, PROMPT

CHUNK = 4
SPLITS = {"offload": Split("offload", admit_prefill=False), "hybrid": Split("hybrid", bp=2.0, bh=1.0)}


def shape_of(engine: Engine) -> LayerShape:
    cfg = engine.config
    x = torch.zeros(1, cfg.hidden_size, dtype=engine.decoder.embed.dtype)
    linear = () if cfg.linear_attention is None else tuple(
        cfg.moe_index(l) for l in cfg.linear_attention.layers if cfg.moe_index(l) >= 0)
    return LayerShape(qk_norm=cfg.qk_norm != "none", shared_expert=cfg.shared_expert_intermediate > 0,
                      shared_gate=cfg.shared_expert_gate, packed=engine.cache.pool.packed,
                      tensors_per_expert=engine.cache.pool.tensors_per_expert, linear_layers=linear,
                      out_gate=cfg.attention_output_gate,
                      fused_prologue=engine.decoder.fused_prologue(engine.decoder.layers[-1], engine.new_kv(1)),
                      fused_router=engine.fused_router(engine.decoder.layers[cfg.moe_layers[0]]),
                      fused_qkv=engine.decoder.fused_qkv(len(engine.decoder.layers) - 1, engine.new_kv(1), x, x))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("pipeline", [False, True])
def test_cost_model_counts_equal_the_engines_counters(family, split, pipeline, checkpoints):
    ckpt = checkpoints[family]
    if ckpt.config.mla is not None:
        pytest.skip("MLA attention launches other kernels (not counted by sim.overhead)")
    cache = CacheConfig("lru", capacity=5, split=SPLITS[split])
    engine = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=CHUNK, pipeline=pipeline)
    list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=7, stop_token_ids=[]))
    trace = engine.trace()
    log = simulate(trace, SimConfig("lru", SPLITS[split], capacity=5, prefill_chunk=CHUNK)).log
    assert int(log.fetched.sum()) > 0 and int(log.hits.sum()) > 0  # both lanes of the pipeline exercised
    if split == "hybrid":
        assert int(log.cpu.sum()) > 0
    work = freetoken_work(log, ckpt.config.num_layers, shape_of(engine), pipeline=pipeline, cuda_graphs=False,
                          record=True)
    assert work.totals() == engine.host.to_dict()


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
@pytest.mark.parametrize("pipeline", [False, True])
@pytest.mark.parametrize("double_buffer", [False, True])
def test_prefill_double_buffer_copies_count_as_the_engine_does(family, pipeline, double_buffer, checkpoints):
    """The cost model's engine setting double_buffer against the live engine run that way: off is what the engine
    does with its planner's one layer of staging (even where its executor would stream, as on CUDA); on needs two
    layers of staging, and then layer l + 1's every non-resident expert streams while layer l runs, used or not.
    The counts come from sim.predict.engine_replay, as `ft predict` charges them: sim = live in both settings."""
    from freetoken.engine.executor import LiveExecutor
    from freetoken.sim.engines import get_engine, with_settings
    from freetoken.sim.predict import engine_replay

    ckpt = checkpoints[family]
    E, split = ckpt.config.num_experts, SPLITS["offload"]
    model = with_settings(get_engine("freetoken-offload"), double_buffer=double_buffer)
    assert get_engine("freetoken-offload").double_buffer is False  # the default: what the default planner allows
    cache = CacheConfig("lru", capacity=5, split=split, staging=model.staging_layers() * E)
    engine = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=CHUNK, pipeline=pipeline)
    c = engine.cache
    # as on CUDA (stream_prefill's default there); on the CPU its copies are immediate, the counts the same
    c.executor = LiveExecutor(c.store, c.pool, c.executor.kernels, "cpu", pipeline=pipeline, host=engine.host,
                              stream_prefill=True)
    assert c.executor.stream_prefill is double_buffer  # one layer of staging cannot double buffer
    list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=7, stop_token_ids=[]))
    trace = engine.trace()
    config = SimConfig("lru", split, capacity=5, prefill_chunk=CHUNK)
    replayed = engine_replay(model, trace, config)
    log, streamed = replayed.log, replayed.streamed
    work = freetoken_work(log, ckpt.config.num_layers, shape_of(engine), pipeline=pipeline, cuda_graphs=False,
                          record=True, streamed=streamed)
    assert work.totals() == engine.host.to_dict()
    if not double_buffer:
        assert streamed is None
        return
    on = streamed >= 0
    assert on.any() and int(streamed[on].sum()) > int(log.fetched[on].sum())  # unused experts streamed too
    plain = freetoken_work(log, ckpt.config.num_layers, shape_of(engine), pipeline=pipeline, cuda_graphs=False,
                           record=True)
    assert plain.totals()["copies"] < engine.host.copies  # what the counts miss without the streams


def test_streamed_calls_copy_the_layers_non_resident_experts_by_hand():
    # one prefill chunk over 2 MoE layers of 8 bf16 experts (2 tensors each); layer 1 has 2 experts resident, uses 3
    # of them (hits 1, fetched 2) and gets the other 6 streamed: copies = ids + gates (2) + one slot-id upload + 2 x 6
    from tests.test_cost_lanes import log_of

    log = log_of(dict(layer=0, hits=1, fetched=3), dict(layer=1, hits=1, fetched=2))
    work = freetoken_work(log, 2, LayerShape(), pipeline=True, cuda_graphs=False, record=True,
                          streamed=np.array([-1, 6]))
    # layer 0 fetches its own 3: ids + gates, the hits' and two fetched halves' slot uploads (3), 2 x 3 tensors
    assert work.copies.tolist() == [2 + 3 + 6, 2 + 1 + 12]


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_hybrid_deltanet_layers_count_as_the_engine_does(split, tmp_path):
    # Qwen3.5's layout: three Gated DeltaNet layers, then full attention with an output gate; every layer MoE
    from freetoken.models.checkpoint import load_checkpoint

    from .test_qwen3_next_hf_match import CONFIGS
    from .tiny_hf import random_hf

    model_type, kw = CONFIGS["qwen3_5_moe"]
    random_hf(model_type, **kw).save_pretrained(tmp_path)
    ckpt = load_checkpoint(tmp_path)
    cache = CacheConfig("lru", capacity=5, split=SPLITS[split])
    engine = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=CHUNK, pipeline=True)
    list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=7, stop_token_ids=[]))
    log = simulate(engine.trace(), SimConfig("lru", SPLITS[split], capacity=5, prefill_chunk=CHUNK)).log
    shape = shape_of(engine)
    assert shape.linear_layers == (0, 1, 2) and shape.out_gate
    work = freetoken_work(log, ckpt.config.num_layers, shape, pipeline=True, cuda_graphs=False, record=True)
    assert work.totals() == engine.host.to_dict()
    # by hand, one decode call: DeltaNet layer 2 norms + 2 linears (the fused qkv / z / b / a input projection, out)
    # + conv + rule + gated norm = 7 + router 1 (projection + top-k) = 8; the attention layer 2 norms + 3 linears
    # (fused qkv, the gate, o) + 2 q/k norms + 2 ropes (no fused prologue with an output gate) + 2 decode attention
    # = 11 + 1 = 12
    decode = log.phase == 1
    assert set(work.pre_launches[decode & (log.layer < 3)]) == {8 + 6}  # + glue: 5 gate ops, the residual add
    assert set(work.pre_launches[decode & (log.layer == 3)]) == {12 + 3 + 2}  # + glue: residual, KV x2, gate x2


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "gpt_oss"])
@pytest.mark.parametrize("split", sorted(SPLITS))
def test_cost_model_counts_equal_the_device_placement_engines(family, split, checkpoints):
    """The same with the placement decided on the device (interpreted): the decision program and the gathers per
    call, the decision read back only where a CPU lane may need it, the routing read once per forward."""
    ckpt = checkpoints[family]
    cache = CacheConfig("lru", capacity=5, split=SPLITS[split])
    engine = Engine(ckpt, cache, kernels="reference", device="cpu", prefill_chunk=CHUNK, pipeline=True,
                    placement="device")
    list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=7, stop_token_ids=[]))
    log = simulate(engine.trace(), SimConfig("lru", SPLITS[split], capacity=5, prefill_chunk=CHUNK)).log
    assert int(log.fetched.sum()) > 0 and (int(log.cpu.sum()) > 0) == (split == "hybrid")
    c = engine.counters  # sim = live for the device decision too (the replay runs the host policy)
    assert (c.calls, c.hits, c.fetched, c.cpu, c.evictions) == (len(log), int(log.hits.sum()), int(log.fetched.sum()),
                                                                 int(log.cpu.sum()), int(log.evictions.sum()))
    work = freetoken_work(log, ckpt.config.num_layers, shape_of(engine), pipeline=True, cuda_graphs=False,
                          record=True, device_placement=True, cpu_split=split == "hybrid")
    assert work.totals() == engine.host.to_dict()
    host = freetoken_work(log, ckpt.config.num_layers, shape_of(engine), pipeline=True, cuda_graphs=False,
                          record=True)
    assert int(work.syncs.sum()) < int(host.syncs.sum())


def test_cuda_graph_decode_is_one_launch_per_step_and_no_router_sync():
    # hand-derived: 2 MoE layers, 3 decode steps with one CPU expert in the second layer of each step
    from tests.test_cost_lanes import log_of

    calls = [dict(layer=l, phase=1, hits=2 - l, cpu=l) for _ in range(3) for l in (0, 1)]
    eager = freetoken_work(log_of(*calls), 2, LayerShape(), pipeline=True, cuda_graphs=False)
    graph = freetoken_work(log_of(*calls), 2, LayerShape(), pipeline=True, cuda_graphs=True)
    assert graph.totals() == {"launches": 3, "syncs": 3, "copies": 6}  # one graph per step; the CPU lane's trips
    # eager, per layer: attention 2 norms + 2 linears (fused q/k/v, o) + 2 q/k norms + 2 ropes + 2 decode attention
    # = 10, router 2, one expert_ffn (3); layer 0 also the final norm + lm_head (2): 15 + 17 per step
    assert int(eager.launches.sum()) == 3 * (15 + 17)
    # the GPU runs every kernel either way; host launches add torch glue: 3 before each router, 1 after, 1 more for
    # the CPU lane's result (layer 1), 2 per step
    assert int((graph.pre_kernels + graph.post_kernels).sum()) == int((eager.pre_kernels + eager.post_kernels).sum())
    assert int((eager.pre_launches + eager.post_launches).sum()) == 3 * (15 + 17 + 2 * 4 + 1 + 2)
    assert int(eager.charged_syncs.sum()) == 6 and int(graph.charged_syncs.sum()) == 0


def test_declared_launches_are_the_triton_kernels_launched(monkeypatch):
    # count Triton's own launches (interpreter) inside each kernel-set call of the triton set, tiny shapes
    from triton.runtime.interpreter import InterpretedFunction

    from freetoken import kernels as k
    from freetoken.kernels.expert_gather import gather_experts
    from freetoken.kernels.placement import place_call

    launched = []
    real = InterpretedFunction.run
    monkeypatch.setattr(InterpretedFunction, "run", lambda self, *a, **kw: (launched.append(1), real(self, *a, **kw))[1])

    def count(fn, *args, **kw) -> int:
        launched.clear()
        fn(*args, **kw)
        return len(launched)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 32, generator=g)
    q1, q3 = torch.randn(1, 2, 16, generator=g), torch.randn(3, 2, 16, generator=g)
    cache = torch.randn(8, 2, 16, generator=g)
    slots = torch.tensor([[0, 1], [1, -1], [0, 1]], dtype=torch.int32)
    w = torch.rand(3, 2, generator=g)
    gate_up, down = torch.randn(2, 32, 32, generator=g) * 0.1, torch.randn(2, 32, 16, generator=g) * 0.1
    state = (torch.full((8,), -1, dtype=torch.int32), torch.full((2,), -1, dtype=torch.int32),
             torch.full((8,), -1, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))  # 1 layer, 8 experts, 2 slots
    got = {
        "rms_norm": count(k.rms_norm, x, torch.ones(32), 1e-6),
        "linear": count(k.linear, x, torch.randn(8, 32, generator=g)),
        "apply_rope": count(k.apply_rope, q3.contiguous(), torch.arange(3), 10000.0),
        "router_topk": count(k.router_topk, torch.randn(3, 8, generator=g), 2, True),
        "attention_decode": count(k.attention, q1, cache, cache, 4, 0.25),
        "attention_prefill": count(k.attention, q3, cache, cache, 2, 0.25),
        "expert_ffn": count(k.expert_ffn, x, slots, w, gate_up, down),
        "place_call": count(place_call, state, 0, torch.tensor([1, 3], dtype=torch.int32),
                            torch.ones(2, dtype=torch.int32), torch.arange(5, dtype=torch.int32), "most_tokens", 0,
                            True),
        "gather_experts": count(gather_experts, gate_up, torch.zeros_like(gate_up), torch.tensor([1], dtype=torch.int32),
                                torch.tensor([0], dtype=torch.int32), torch.tensor([1])),
    }
    assert got == {name: KERNEL_LAUNCHES[name] for name in got}
    assert np.all([v > 0 for v in got.values()])


def test_moe_block_graphs_launch_once_per_layer():
    # hand-derived: 2 MoE layers, 3 decode steps, bf16 experts (2 tensors), pipeline: eager, per layer, attention 10
    # (2 norms, 2 linears: fused q/k/v and o, 2 q/k norms, 2 ropes, decode attention 2), router 2, union 1,
    # decision 1, slot ids 1, one gather (both tensors), two expert_ffn calls 6 = 22; layer 0 also the final norm +
    # lm_head (2). Graphs: 10 + 1 per layer, + 2
    from tests.test_cost_lanes import log_of

    calls = [dict(layer=l, phase=1, hits=1, fetched=1) for _ in range(3) for l in (0, 1)]
    kw = dict(pipeline=True, cuda_graphs=False, record=True, device_placement=True)
    eager = freetoken_work(log_of(*calls), 2, LayerShape(), **kw)
    graph = freetoken_work(log_of(*calls), 2, LayerShape(), moe_graphs=True, **kw)
    assert int(eager.launches.sum()) == 3 * (2 * 22 + 2)
    assert int(graph.launches.sum()) == 3 * (2 * 11 + 2)
    assert graph.syncs.tolist() == eager.syncs.tolist() == [0, 0] * 3  # the recorder's copy is read without a wait
    assert int(graph.copies.sum()) == 3  # that copy, once per step
    with pytest.raises(ValueError, match="moe_graphs"):
        freetoken_work(log_of(*calls), 2, LayerShape(), moe_graphs=True, cuda_graphs=True,
                       **{k: v for k, v in kw.items() if k != "cuda_graphs"})
    # with a CPU lane (layer 1's calls send one expert to it): front, back and finish graphs per layer, whether or
    # not the lane had an expert: 10 + 3 per layer, + 2; one wait per layer; copies: the decision, x and weights per
    # layer, the lane's result up on layer 1, the recorder's once per step
    lane = [dict(layer=l, phase=1, hits=1, fetched=1 - l, cpu=l) for _ in range(3) for l in (0, 1)]
    hybrid = freetoken_work(log_of(*lane), 2, LayerShape(), moe_graphs=True, cpu_split=True, **kw)
    assert hybrid.launches.tolist() == [10 + 3 + 2, 10 + 3] * 3
    assert hybrid.syncs.tolist() == [1, 1] * 3 and hybrid.copies.tolist() == [3 + 1, 3 + 1] * 3
