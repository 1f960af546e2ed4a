"""The live router hint: layer l + 1's router on layer l's hidden state, checked against HF's modules by brute force,
recorded in the trace (with its accuracy), and replayed: the simulator with the recorded hint makes the live Plans.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from freetoken.engine import CacheConfig, Engine, SamplingParams
from freetoken.placement import Split, make_policy
from freetoken.placement.router_hint import MeasuredHint, RecordedHint
from freetoken.sim.calls import trace_calls
from freetoken.sim.replay import replay
from freetoken.trace import load, save
from freetoken.trace.stats import hint_accuracy

from .conftest import DECODE_STEPS, PROMPT, hf_topk
from .test_sim_equals_live import CHUNK, SECOND_PROMPT

HINT_FAMILIES = ("qwen3_moe", "mixtral")


def hf_hint(ref, upto: int) -> np.ndarray:
    """[T, L, K] brute force with HF's own modules: layer l + 1's post-attention norm and gate on the residual that
    enters layer l's post-attention norm (the hidden state layer l's MoE reads), top-k of the softmax; -1 on layer 0."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ref.path).eval()
    layers = hf.model.layers
    resid = {}
    hooks = [layer.post_attention_layernorm.register_forward_pre_hook(
        lambda mod, args, l=l: resid.__setitem__(l, args[0][0])) for l, layer in enumerate(layers)]
    with torch.no_grad():
        hf(torch.tensor([ref.tokens[:upto]]))
        out = np.full((upto, len(layers), ref.top_k), -1, np.int64)
        for l in range(len(layers) - 1):
            nxt = layers[l + 1]
            logits = nxt.post_attention_layernorm(resid[l]) @ nxt.mlp.gate.weight.T  # [T, E]
            out[:, l + 1] = torch.topk(torch.softmax(logits.float(), -1), ref.top_k, dim=-1).indices.numpy()
    for h in hooks:
        h.remove()
    return out


@pytest.mark.parametrize("family", HINT_FAMILIES)
def test_live_hint_is_next_router_on_this_hidden_state(family, hf_models, checkpoints, tmp_path):
    ref = hf_models[family]
    cache = CacheConfig("lookahead", capacity=5, options={"hint": "router"})
    engine = Engine(checkpoints[family], cache, kernels="reference", device="cpu", prefill_chunk=CHUNK)
    out = list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=DECODE_STEPS + 1, stop_token_ids=[]))
    assert PROMPT + out == ref.tokens  # the hint never changes the math
    trace = load(save(engine.trace(), tmp_path / "hinted.safetensors"))  # the field survives the file format
    T = len(trace.token)
    want = hf_hint(ref, T)
    np.testing.assert_array_equal(trace.hint, want)
    true = hf_topk(ref, T)  # [T, L, K]
    acc = hint_accuracy(trace)
    brute = np.mean([len(set(want[t, 1]) & set(true[t, 1])) / ref.top_k for t in range(T)])
    assert np.isnan(acc[0]) and acc[1] == pytest.approx(brute)
    assert 0 < brute < 1  # a real prediction: neither always right nor always wrong on this model


def test_hint_off_records_no_field(checkpoints):
    engine = Engine(checkpoints["qwen3_moe"], CacheConfig("lru", capacity=3), kernels="reference", device="cpu")
    list(engine.generate(PROMPT, SamplingParams(greedy=True), max_tokens=3, stop_token_ids=[]))
    assert engine.trace().hint is None and not engine.hinting
    hinted = Engine(checkpoints["qwen3_moe"], CacheConfig("lru", capacity=3), kernels="reference", device="cpu",
                    router_hint=True)  # any policy: record the hint to measure it
    list(hinted.generate(PROMPT, SamplingParams(greedy=True), max_tokens=3, stop_token_ids=[]))
    assert (hinted.trace().hint[:, 1] >= 0).all() and (hinted.trace().hint[:, 0] == -1).all()


def test_router_hint_cannot_be_off_when_the_policy_reads_it(checkpoints):
    cache = CacheConfig("hinted_sweep", capacity=3, options={"hint": "router"})
    with pytest.raises(ValueError, match="router_hint cannot be off"):
        Engine(checkpoints["qwen3_moe"], cache, kernels="reference", device="cpu", router_hint=False)
    with pytest.raises(ValueError, match="hint must be 'router'"):
        Engine(checkpoints["qwen3_moe"], CacheConfig("lookahead", capacity=3, options={"hint": "oracle"}),
               kernels="reference", device="cpu")


@pytest.mark.parametrize("policy,measure", [("lookahead", False), ("hinted_sweep", False), ("hinted_sweep", True)])
def test_sim_with_recorded_hint_makes_the_live_plans(policy, measure, checkpoints):
    """Sim = live with the live hint: the engine plans with its early router's predictions; the simulator replays
    the recorded trace with the recorded predictions (RecordedHint) and makes the same Plans, call by call
    (measure: hinted_sweep weighs the hint by the accuracy it has shown so far, live and replayed alike)."""
    ckpt = checkpoints["qwen3_moe"]
    prefetched = 0
    opts = {"hint": "router", "min_confidence": 0.5} if policy == "hinted_sweep" else {"hint": "router"}
    if measure:
        opts["measure"] = True
    for capacity in (3, 7):
        for split in (Split("offload"), Split("hybrid", bp=2.0, bh=1.0)):
            engine = Engine(ckpt, CacheConfig(policy, capacity=capacity, split=split, options=opts),
                            kernels="reference", device="cpu", prefill_chunk=CHUNK, keep_plans=True)
            for request, prompt in enumerate((PROMPT, SECOND_PROMPT)):
                list(engine.generate(prompt, SamplingParams(greedy=True), max_tokens=DECODE_STEPS + 1,
                                     stop_token_ids=[], request=request))
            trace = engine.trace()
            sim_opts = {k: v for k, v in opts.items() if k != "hint"}
            sim_policy = make_policy(policy, capacity, trace.num_layers, trace.num_experts,
                                     hint=RecordedHint(trace, CHUNK), **sim_opts)
            sim = replay(trace_calls(trace, CHUNK), sim_policy, split, keep_plans=True)
            live = engine.cache.plans
            assert len(sim.plans) == len(live)
            for i, (want, got) in enumerate(zip(sim.plans, live)):
                assert want == got, f"{policy} capacity={capacity} {split.mode}: call {i} differs"
            prefetched += engine.counters.prefetched
    measured = MeasuredHint(trace, CHUNK, seed=0)  # the recorded accuracy, replayed as a synthetic hint
    np.testing.assert_array_equal(measured.accuracy[1:], hint_accuracy(trace)[1:])
    sim = replay(trace_calls(trace, CHUNK), make_policy(policy, 7, trace.num_layers, trace.num_experts,
                                                        hint=measured, **sim_opts), Split("offload"))
    assert sim.total.accesses == sum(len(c.experts) for c in trace_calls(trace, CHUNK))
    assert prefetched > 0  # the hint drove ahead-of-need copies
