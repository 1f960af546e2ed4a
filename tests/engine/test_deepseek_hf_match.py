"""DeepSeek-V2 / V3 in the live engine: logits equal HF transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM
at every capacity, in every split, unquantized and with block-FP8 weights.

The tiny random models have what sets DeepSeek apart: multi-head latent attention (V2 with a plain q_proj and a v
head wider than q . k's, V3 with q LoRA and a v head narrower: both paddings of the shared cache head dim), rope on
the rope dims only with DeepSeek's interleaved pairs, a dense first layer (first_k_dense_replace=1), a shared expert,
V2's group_limited_greedy softmax routing with routed_scaling_factor, V3's sigmoid scores with a random
e_score_correction_bias, top-2 group scores and renormalised, scaled weights, and V3's YaRN with mscale /
mscale_all_dim (a cos/sin factor != 1 and a softmax scale times mscale_all_dim's scale squared).
The FP8 model is the V3 one with every attention, dense, shared-expert and routed-expert matrix packed by
transformers' Fp8Quantize in 16 x 16 blocks (`weight_scale_inv`, quant_method fp8, weight_block_size); its reference
is HF on the packer's own dequantized weights. Tolerance as in test_hf_match.py: 1e-4 x max |logit|.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from .tiny_hf import (Model, assert_greedy_is_hf, assert_logits_grid, assert_moves_logits, assert_routing_is_hf,
                      assert_triton_matches, hf_answers, make_engine, random_hf)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))  # the packers' helpers (no package there)
import packers

LAYERS, E, K, I, D = 3, 8, 2, 32, 64  # layer 0 dense, 1 and 2 routed
COMMON = dict(hidden_size=D, intermediate_size=48, moe_intermediate_size=I, num_hidden_layers=LAYERS,
              num_attention_heads=4, vocab_size=128, n_routed_experts=E, num_experts_per_tok=K, n_shared_experts=1,
              first_k_dense_replace=1, max_position_embeddings=64, initializer_range=0.1, eos_token_id=None,
              bos_token_id=None, pad_token_id=None)
CONFIGS = {
    "v2": ("deepseek_v2", dict(COMMON, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=8,
                               v_head_dim=24, topk_method="group_limited_greedy", n_group=2, topk_group=1,
                               routed_scaling_factor=1.5)),
    "v3": ("deepseek_v3", dict(COMMON, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
                               v_head_dim=24, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
                               rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                "original_max_position_embeddings": 16, "mscale": 1.0,
                                                "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0})),
}
BLOCK = (16, 16)
ATTN = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def _hf_answers(hf, path: Path) -> Model:
    return hf_answers(hf, path, gates=[layer.mlp.gate for layer in hf.model.layers[1:]])


def build(name: str, out: Path):
    model_type, kw = CONFIGS[name]
    hf = random_hf(model_type, **kw)
    if name == "v3":  # HF initialises the correction bias to zero
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for layer in hf.model.layers[1:]:
                layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.3)
    hf.save_pretrained(out)
    return hf


def build_fp8(hf, out: Path) -> Model:
    """The V3 model with its matrices packed block FP8; the HF model takes the packer's dequantized weights."""
    hf.save_pretrained(out)
    tensors = load_file(out / "model.safetensors")

    def pack(name: str, weight: torch.Tensor) -> None:
        del tensors[f"{name}.weight"]
        packed, ref = packers.fp8_block_transformers(name, weight.clone(), BLOCK)
        tensors.update(packed)
        weight.copy_(ref)

    for l, layer in enumerate(hf.model.layers):
        for p in ATTN:
            pack(f"model.layers.{l}.self_attn.{p}", getattr(layer.self_attn, p).weight.data)
        mlps = {"": layer.mlp} if l == 0 else {"shared_experts.": layer.mlp.shared_experts}
        for sub, mlp in mlps.items():
            for p in MLP:
                pack(f"model.layers.{l}.mlp.{sub}{p}", getattr(mlp, p).weight.data)
        if l:
            gate_up, down = layer.mlp.experts.gate_up_proj.data, layer.mlp.experts.down_proj.data  # [E, 2I, D]
            for e in range(E):
                for p, w in zip(MLP, (gate_up[e, :I], gate_up[e, I:], down[e])):
                    pack(f"model.layers.{l}.mlp.experts.{e}.{p}", w)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    qc = packers.CONFIGS["fp8_block"](BLOCK) | {"modules_to_not_convert": ["gate", "lm_head"]}
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": qc}))
    return _hf_answers(hf, out)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Model]:
    out = {}
    for name in CONFIGS:
        path = tmp_path_factory.mktemp(name)
        hf = build(name, path)
        out[name] = _hf_answers(hf, path)
    out["v3_fp8"] = build_fp8(hf, tmp_path_factory.mktemp("v3_fp8"))
    return out


def test_the_checkpoints_are_what_they_claim(models):
    v2, v3 = models["v2"].ckpt.config, models["v3"].ckpt.config
    assert v2.family == "deepseek_v2" and v3.family == "deepseek_v3" and v2.moe_layers == v3.moe_layers == (1, 2)
    assert v2.mla.q_lora_rank == 0 and v3.mla.q_lora_rank == 32 and v2.mla.rope_interleave and v3.mla.rope_interleave
    assert v2.head_dim == 24 > v2.mla.qk_head_dim and v3.head_dim == 32 > v3.mla.v_head_dim  # both paddings
    assert v2.routing.score == "softmax" and v2.routing.n_group == 2 and v2.norm_topk_prob is False
    assert v3.routing.score == "sigmoid" and v3.routing.group_score == "top2" and v3.routing.correction_bias
    assert v3.rope_yarn.attention_factor != 1.0 and v3.mla.softmax_mscale != 1.0
    assert v2.shared_expert_intermediate == v3.shared_expert_intermediate == I and v2.dense_intermediate == 48
    fp8 = models["v3_fp8"]
    gate, up, down = fp8.ckpt.experts[0]
    assert gate.kind == up.kind == down.kind == "fp8" and gate.num_slots == E and down.shape == (D, I)
    assert (fp8.logits - models["v3"].logits).abs().max() > 1e-3  # the packed weights really differ


@pytest.mark.parametrize("name", ["v2", "v3", "v3_fp8"])
def test_logits_match_hf_every_capacity_every_split(name, models):
    assert_logits_grid(models[name], E, f"deepseek {name}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["v2", "v3_fp8"])
def test_triton_kernels(name, models):
    """The Triton path (interpreted on CPU): hits, fetches into slots and staging, and the CPU lane."""
    model = models[name]
    assert_triton_matches(model, E, len(model.tokens) - 1, f"deepseek {name} triton")


@pytest.mark.parametrize("name", ["v2", "v3", "v3_fp8"])
def test_greedy_tokens_equal_hf_generate(name, models):
    assert_greedy_is_hf(models[name])


@pytest.mark.parametrize("name", ["v2", "v3", "v3_fp8"])
def test_recorded_routing_is_hf_router_topk(name, models):
    """The trace's picks are the ids HF's own gate (DeepseekV2TopkRouter / V3TopkRouter) selects."""
    model = models[name]
    assert len(model.ckpt.config.moe_layers) == 2
    assert_routing_is_hf(model, K)


@pytest.mark.parametrize("name,feature", [("v2", "interleave"), ("v2", "groups"), ("v2", "scale"),
                                          ("v3", "correction_bias"), ("v3", "softmax_mscale"), ("v3", "sigmoid")])
def test_every_deepseek_feature_is_exercised(name, feature, models):
    """Dropping any one of them moves the logits well past the tolerance: each is really in play."""
    model = models[name]
    cfg = model.ckpt.config
    changed = {"interleave": dict(mla=replace(cfg.mla, rope_interleave=False)),
               "softmax_mscale": dict(mla=replace(cfg.mla, softmax_mscale=1.0)),
               "groups": dict(routing=replace(cfg.routing, n_group=1, topk_group=1)),
               "scale": dict(routing=replace(cfg.routing, scale=1.0)),
               "sigmoid": dict(routing=replace(cfg.routing, score="softmax")),
               "correction_bias": {}}[feature]
    ckpt = replace(model.ckpt, config=replace(cfg, **changed))
    engine = make_engine(model, 0, "offload", ckpt=ckpt)
    if feature == "correction_bias":
        for lw in engine.decoder.layers[1:]:
            lw.correction_bias = None
    assert_moves_logits(engine, model)


def test_published_configs_read():
    """DeepSeek-V2-Lite's and DeepSeek-V3's config.json fields -> the ModelConfig HF would use."""
    from freetoken.models import read_model_config

    lite = {"architectures": ["DeepseekV2ForCausalLM"], "first_k_dense_replace": 1, "hidden_size": 2048,
            "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
            "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
            "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
            "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 1.0,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                             "original_max_position_embeddings": 4096, "type": "yarn"},
            "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128, "vocab_size": 102400}
    family, cfg = read_model_config(lite, "config.json")
    assert family.name == "deepseek" and cfg.moe_layers == tuple(range(1, 27)) and cfg.top_k == 6
    assert cfg.mla.qk_head_dim == 192 == cfg.head_dim and cfg.shared_expert_intermediate == 2816
    assert cfg.routing.n_group == 1 and cfg.rope_yarn.factor == 40 and cfg.rope_yarn.attention_factor == 1.0
    assert abs(cfg.mla.softmax_mscale - (0.1 * 0.707 * np.log(40) + 1) ** 2) < 1e-12
    v3 = dict(lite, architectures=["DeepseekV3ForCausalLM"], first_k_dense_replace=3, n_group=8, topk_group=4,
              n_routed_experts=256, n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5,
              topk_method="noaux_tc", q_lora_rank=1536, num_hidden_layers=61)
    family, cfg = read_model_config(v3, "config.json")
    assert cfg.family == "deepseek_v3" and cfg.moe_layers[0] == 3 and cfg.mla.q_lora_rank == 1536
    assert cfg.routing == cfg.routing.__class__("sigmoid", 8, 4, "top2", 2.5, True) and cfg.norm_topk_prob
    assert family.dense_tensors(cfg)["model.layers.3.mlp.gate.e_score_correction_bias"] == (256,)


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_rope_first_layout_keeps_hf_scores(version):
    """mla.py's load-time row order (rope dims first, pairs de-interleaved) + apply_rope_ref on the first R dims
    gives HF's q . k: V2's complex-pair rotation (apply_rotary_emb) and V3's apply_rotary_pos_emb_interleave."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    from freetoken.engine.mla import _rope_first
    from freetoken.kernels import apply_rope_ref

    T, H, N, R, theta = 6, 3, 4, 8, 10000.0
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(T, H, N + R, generator=g), torch.randn(T, 1, N + R, generator=g)  # HF order: nope, rope
    pos = torch.arange(3, 3 + T)
    inv_freq = 1.0 / theta ** (torch.arange(0, R, 2).float() / R)
    angle = pos.float()[:, None] * inv_freq  # [T, R / 2]
    if version == "v2":
        cis = torch.polar(torch.ones_like(angle), angle)[None]  # [1, T, R / 2]
        q_rot, k_rot = apply_rotary_emb(q[None, ..., N:].transpose(1, 2), k[None, ..., N:].transpose(1, 2), cis)
    else:
        cos, sin = torch.cat([angle, angle], -1).cos()[None], torch.cat([angle, angle], -1).sin()[None]
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q[None, ..., N:].transpose(1, 2),
                                                       k[None, ..., N:].transpose(1, 2), cos, sin)
    hf_q = torch.cat([q[..., :N], q_rot[0].transpose(0, 1)], -1)  # [T, H, N + R]
    hf_k = torch.cat([k[..., :N], k_rot[0].transpose(0, 1)], -1)
    order = _rope_first(N, R, interleave=True)
    ours_q = apply_rope_ref(q[..., order], pos, theta, R)
    ours_k = apply_rope_ref(k[..., order], pos, theta, R)
    want = torch.einsum("thd,sd->hts", hf_q, hf_k[:, 0])
    got = torch.einsum("thd,sd->hts", ours_q, ours_k[:, 0])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = torch.einsum("thd,sd->hts", apply_rope_ref(q[..., _rope_first(N, R, False)], pos, theta, R),
                         apply_rope_ref(k[..., _rope_first(N, R, False)], pos, theta, R)[:, 0])
    assert (plain - want).abs().max() > 1e-2  # without the de-interleave the scores are wrong


@pytest.mark.slow
def test_sim_replay_makes_the_live_plans(models):
    """Sim = live on DeepSeek-V3's recorded routing, every policy (test_sim_equals_live.py's harness)."""
    from .test_sim_equals_live import assert_sim_replays_live

    assert_sim_replays_live(models["v3"].ckpt, (3, 7))


def test_card_from_config_sizes_what_the_engine_holds(models):
    """ft predict's card (config.json alone): expert bytes as the store holds them, and the KV bytes per token of
    the decompressed per-head cache."""
    from freetoken.sim.checkpoint_card import card_from_checkpoint

    model = models["v3"]
    card = card_from_checkpoint(model.path)
    engine = make_engine(model, 3, "offload")
    kv = engine.new_kv(8)
    assert card.expert_bytes() == engine.store.expert_bytes
    assert card.kv_bytes_per_token == sum(t.numel() * t.element_size() for t in (*kv.k, *kv.v)) // 8
