"""gpt-oss in the live engine: logits equal HF transformers' GptOssForCausalLM at every capacity, in every split,
unquantized and with MXFP4 experts.

The tiny random model has what sets gpt-oss apart: attention sinks, a sliding layer whose window (4) is shorter than
the prompt (10) and than the decode run, q/k/v/o biases, YaRN rope, a router bias, expert biases and the clamped
gated activation (limit 1.0, so the clamp bites). HF initialises biases to zero: they are drawn at random here.
The MXFP4 checkpoint holds the same model's experts packed by the compressed-tensors MXFP4 packer in gpt-oss's fused
`_blocks` / `_scales` layout (gate and up rows interleaved); its reference is HF loading that checkpoint with its
own MXFP4 dequantizer (Mxfp4Config(dequantize=True), fp32). Tolerance as in test_hf_match.py: 1e-4 x max |logit|.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from freetoken.models import CheckpointError
from freetoken.models.checkpoint import load_checkpoint
from freetoken.quant import expert_bytes

from .conftest import PROMPT
from .test_hf_match import run_steps
from .tiny_hf import (Model, assert_greedy_is_hf, assert_logits_grid, assert_moves_logits, assert_routing_is_hf,
                      assert_triton_matches, hf_answers, make_engine, random_hf)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))  # the packers' helpers (no package there)
import packers

LAYERS, E, I, D, WINDOW = 3, 8, 32, 64, 4  # layers 0 and 2 slide, 1 attends to everything
YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 16, "rope_theta": 10000.0}


def build_dense(out: Path) -> Model:
    hf = random_hf("gpt_oss", hidden_size=D, intermediate_size=I, num_hidden_layers=LAYERS, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, vocab_size=128, num_local_experts=E, num_experts_per_tok=2,
                   sliding_window=WINDOW, swiglu_limit=1.0, rope_parameters=dict(YARN), max_position_embeddings=64,
                   initializer_range=0.1, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    assert hf.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    if hf.model.layers[0].mlp.experts.limit != 1.0:  # transformers 5.17 and earlier clamp at 7.0 whatever it says
        pytest.skip(f"transformers {transformers.__version__} ignores swiglu_limit: its GptOss is no reference here")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("bias", "sinks")):
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if name.endswith("sinks") else 0.3))
    hf.save_pretrained(out)
    return hf_answers(hf, out, router_logits=True)


def build_mxfp4(dense: Path, out: Path) -> Model:
    """The dense checkpoint with every expert matrix packed MXFP4 as gpt-oss ships them: `{name}_blocks`
    [E, out, in/32, 16] and `{name}_scales` [E, out, in/32] of W [out, in] (the transpose of HF's x @ W layout)."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    shutil.copytree(dense, out)
    tensors = load_file(out / "model.safetensors")
    for l in range(LAYERS):
        for name in ("gate_up_proj", "down_proj"):
            prefix = f"model.layers.{l}.mlp.experts.{name}"
            packed, _ = packers.mxfp4_gpt_oss(prefix, tensors.pop(prefix).transpose(1, 2).contiguous())
            tensors.update(packed)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": packers.CONFIGS["mxfp4"]()}))
    hf = AutoModelForCausalLM.from_pretrained(out, quantization_config=Mxfp4Config(dequantize=True),
                                              dtype=torch.float32).eval()
    return hf_answers(hf, out, router_logits=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Model]:
    dense = build_dense(tmp_path_factory.mktemp("gpt_oss"))
    mxfp4 = build_mxfp4(dense.path, tmp_path_factory.mktemp("gpt_oss_mx") / "ckpt")
    return {"dense": dense, "mxfp4": mxfp4}


def test_the_checkpoints_are_what_they_claim(models):
    dense, mx = models["dense"], models["mxfp4"]
    cfg = dense.ckpt.config
    assert cfg.family == "gpt_oss" and cfg.sliding_layers == (0, 2) and cfg.sliding_window == WINDOW < len(PROMPT)
    assert cfg.rope_yarn is not None and cfg.expert_glu == "clamped" and cfg.glu_limit == 1.0
    gate, up, down = mx.ckpt.experts[0]
    assert gate.kind == up.kind == down.kind == "fp4" and gate.num_slots == E and down.shape == (D, I)
    assert (mx.logits - dense.logits).abs().max() > 1e-3  # the packed experts really differ from the dense ones


@pytest.mark.parametrize("fmt", ["dense", "mxfp4"])
def test_logits_match_hf_every_capacity_every_split(fmt, models):
    assert_logits_grid(models[fmt], E, f"gpt_oss {fmt}")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["dense", "mxfp4"])
def test_triton_kernels(fmt, models):
    """The Triton path (interpreted on CPU): hits, fetches into slots and staging, and the CPU lane."""
    model = models[fmt]
    assert_triton_matches(model, LAYERS * E // 2, len(model.tokens) - 1, f"gpt_oss {fmt} triton")


@pytest.mark.parametrize("fmt", ["dense", "mxfp4"])
def test_greedy_tokens_equal_hf_generate(fmt, models):
    """Decode runs to position 18, far past the window of 4 on the sliding layers."""
    assert_greedy_is_hf(models[fmt])


@pytest.mark.parametrize("fmt", ["dense", "mxfp4"])
def test_recorded_routing_is_hf_router_topk(fmt, models):
    assert_routing_is_hf(models[fmt], 2)


@pytest.mark.parametrize("fmt", ["dense", "mxfp4"])
def test_expert_biases_travel_with_the_expert(fmt, models):
    model = models[fmt]
    engine = make_engine(model, 3, "offload", kernels="reference")  # a real slot pool (the host set aliases the store)
    store, pool = engine.store, engine.cache.pool
    bias_bytes = (2 * I + D) * 4  # fp32 gate_up and down biases
    weights = 3 * I * D * 4 if fmt == "dense" else 2 * expert_bytes(model.ckpt.quant, I, D) + expert_bytes(
        model.ckpt.quant, D, I)
    assert store.packed == (fmt == "mxfp4") and store.expert_bytes == weights + bias_bytes
    assert pool.nbytes == (pool.capacity + pool.staging) * store.expert_bytes
    run_steps(engine, model.tokens[:-1])
    c = engine.counters
    assert c.fetched_bytes == c.fetched * store.expert_bytes and c.fetched > 0
    # the pool rows hold exactly the store's biases of the experts resident there
    for key, slot in engine.cache.policy.slot_of.items():
        layer, expert = divmod(key, E)
        assert torch.equal(pool.b_gate_up[slot], store.b_gate_up[layer][expert])
        assert torch.equal(pool.b_down[slot], store.b_down[layer][expert])


@pytest.mark.parametrize("feature", ["window", "sinks", "yarn", "glu", "expert_bias"])
def test_every_gpt_oss_feature_is_exercised(feature, models):
    """Dropping any one of them moves the logits well past the tolerance: each is really in play."""
    model = models["dense"]
    cfg = model.ckpt.config
    changed = {"yarn": dict(rope_yarn=None), "glu": dict(expert_glu="silu"), "window": dict(sliding_layers=()),
               "sinks": dict(attention_sinks=False), "expert_bias": dict(expert_bias=False)}[feature]
    ckpt = replace(model.ckpt, config=replace(cfg, **changed))
    if feature == "expert_bias":
        ckpt.expert_biases = None
    assert_moves_logits(make_engine(model, 0, "offload", ckpt=ckpt), model)


def test_missing_expert_bias_and_bad_layer_types_are_named(models, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(models["mxfp4"].path, bad)
    tensors = load_file(bad / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.down_proj_bias"]
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.mlp\.experts\.down_proj_bias' not found"):
        load_checkpoint(bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(config | {"layer_types": ["sliding_attention"]}))
    with pytest.raises(CheckpointError, match="layer_types must list one of sliding_attention, full_attention per layer"):
        load_checkpoint(bad)


def test_a_published_style_config_reads():
    """gpt-oss-20b's config.json fields (rope_scaling with a top-level rope_theta, openai's experts_per_token
    beside num_experts_per_tok, layer_types alternating from a sliding layer 0) -> the ModelConfig HF would use."""
    from freetoken.models import read_model_config

    raw = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "eos_token_id": 200002,
           "experts_per_token": 4, "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
           "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
           "model_type": "gpt_oss", "num_attention_heads": 64, "num_hidden_layers": 24, "num_key_value_heads": 8,
           "num_local_experts": 32, "rms_norm_eps": 1e-05, "sliding_window": 128, "swiglu_limit": 7.0,
           "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                            "rope_type": "yarn", "truncate": False},
           "rope_theta": 150000, "tie_word_embeddings": False, "vocab_size": 201088}
    family, cfg = read_model_config(raw, "config.json")
    assert family.name == "gpt_oss" and cfg.top_k == 4 and cfg.num_experts == 32 and cfg.expert_intermediate == 2880
    assert cfg.rope_theta == 150000 and cfg.rope_yarn.factor == 32 and cfg.rope_yarn.truncate is False
    assert cfg.sliding_layers == tuple(range(0, 24, 2)) and cfg.sliding_window == 128 and cfg.eos_token_ids == (200002,)
    assert "model.layers.3.self_attn.sinks" in family.dense_tensors(cfg)
    assert family.dense_tensors(cfg)["model.layers.3.mlp.router.bias"] == (32,)


@pytest.mark.parametrize("fmt", ["dense", "mxfp4"])
def test_card_from_config_counts_the_expert_biases(fmt, models):
    """ft predict's card (config.json alone) sizes an expert as the engine's store does: weights plus biases."""
    from freetoken.serve.engine_backend import checkpoint_memory
    from freetoken.sim.checkpoint_card import card_from_checkpoint
    from freetoken.sim.planner import model_memory

    model = models[fmt]
    card = card_from_checkpoint(model.path)
    assert card.expert_bias_params == 2 * I + D
    assert card.expert_bytes() == make_engine(model, 3, "offload").store.expert_bytes
    assert model_memory(card).expert_bytes == checkpoint_memory(model.ckpt, 64).expert_bytes
