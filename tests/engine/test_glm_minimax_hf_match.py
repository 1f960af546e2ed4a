"""GLM-4 MoE, GLM-5 (DSA) and MiniMax-M2 in the live engine: logits equal HF transformers' Glm4MoeForCausalLM /
GlmMoeDsaForCausalLM / MiniMaxM2ForCausalLM at every capacity, in every split.

The tiny random models carry what sets each family apart. GLM-4 MoE: a dense first layer (first_k_dense_replace 1),
a shared expert, q/k/v biases, per-head q/k RMSNorm, rope on half of each head (partial_rotary_factor 0.5), sigmoid
routing with a random e_score_correction_bias, top-2 group scores over 4 groups of which 2 are eligible, renormalised
weights times routed_scaling_factor 2.5. MiniMax-M2: q/k RMSNorm over the whole projection, rope on rotary_dim 8 of
16 head dims, sigmoid routing with a random correction bias stored beside the gate (block_sparse_moe.), always
renormalised, Mixtral's w1 / w3 / w2 expert names. GLM-5: MLA with q LoRA and interleaved rope pairs, GLM-4's
routing, and DeepSeek sparse attention with index_topk 4 < the 10-token prompt (so prefill chunks past the first
and every decode step attend to 4 picked keys), the middle layer sharing the first one's picks.
Tolerance as in test_hf_match.py: 1e-4 x max |logit|.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.engine import CacheConfig, Engine
from freetoken.models.checkpoint import load_checkpoint
from freetoken.models.config import CheckpointError

from .conftest import PROMPT
from .test_hf_match import run_steps
from .tiny_hf import (Model, assert_greedy_is_hf, assert_logits_grid, assert_moves_logits, assert_routing_is_hf,
                      assert_triton_matches, hf_answers, make_engine, random_hf)

E, K, D, Dh = 8, 2, 64, 16
COMMON = dict(hidden_size=D, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=Dh, vocab_size=128, num_experts_per_tok=K, max_position_embeddings=64, initializer_range=0.1,
              eos_token_id=None, bos_token_id=None, pad_token_id=None)
CONFIGS = {
    "glm4_moe": dict(COMMON, n_routed_experts=E, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                     n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True,
                     attention_bias=True),  # partial_rotary_factor: HF's default 0.5
    # rotary_dim as released checkpoints carry it; the same partial rotary as a factor too, since transformers
    # 5.17 and earlier reads only the factor (its MiniMax-M2 rotated every head dim)
    "minimax_m2": dict(COMMON, num_local_experts=E, rotary_dim=8, partial_rotary_factor=0.5),
    "glm_moe_dsa": dict(COMMON, num_key_value_heads=4, n_routed_experts=E, moe_intermediate_size=32,
                        n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
                        routed_scaling_factor=2.5, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=24, index_topk=4, index_head_dim=16, index_n_heads=8,
                        indexer_types=["full", "shared", "full"]),
}


def _correction_bias(mlp) -> torch.Tensor:
    """GLM keeps it in the gate, MiniMax-M2 beside it."""
    gate = mlp.gate
    return gate.e_score_correction_bias if hasattr(gate, "e_score_correction_bias") else mlp.e_score_correction_bias


def build(name: str, out: Path) -> Model:
    hf = random_hf(name, **CONFIGS[name])
    moe = [layer.mlp for layer in hf.model.layers if hasattr(layer.mlp, "gate")]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HF initialises the correction bias to zero
        for mlp in moe:
            _correction_bias(mlp).copy_(torch.randn(E, generator=g) * 0.3)
    hf.save_pretrained(out)
    return hf_answers(hf, out, gates=[mlp.gate for mlp in moe])


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Model]:
    return {name: build(name, tmp_path_factory.mktemp(name)) for name in CONFIGS}


def test_the_checkpoints_are_what_they_claim(models):
    glm, mm = models["glm4_moe"].ckpt.config, models["minimax_m2"].ckpt.config
    assert glm.family == "glm4_moe" and glm.moe_layers == (1, 2) and glm.dense_intermediate == 48
    assert glm.shared_expert_intermediate == 32 and glm.qk_norm == "head" and glm.attention_bias
    assert glm.rotary_dim == 8 and glm.routing.n_group == 4 and glm.routing.topk_group == 2
    assert glm.routing.score == "sigmoid" and glm.routing.group_score == "top2" and glm.routing.scale == 2.5
    assert mm.family == "minimax_m2" and mm.moe_layers == (0, 1, 2) and mm.shared_expert_intermediate == 0
    assert mm.qk_norm == "full" and mm.rotary_dim == 8 and mm.norm_topk_prob and mm.expert_intermediate == 48
    assert mm.routing.correction_bias and mm.routing.n_group == 1 and mm.routing.scale == 1.0
    dsa = models["glm_moe_dsa"].ckpt.config
    assert dsa.family == "glm_moe_dsa" and dsa.moe_layers == (1, 2) and dsa.mla.q_lora_rank == 32
    assert dsa.dsa.index_topk == 4 < len(PROMPT) and dsa.dsa.indexer_layers == (0, 2) and dsa.head_dim == 24


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_hf_every_capacity_every_split(name, models):
    assert_logits_grid(models[name], E, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_triton_kernels(name, models):
    """The Triton path (interpreted on CPU) over the prompt (one chunk) and one decode step: hits, fetches, the CPU
    lane."""
    assert_triton_matches(models[name], E, len(PROMPT) + 1, f"{name} triton", chunk=len(PROMPT))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_equal_hf_generate(name, models):
    assert_greedy_is_hf(models[name])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_recorded_routing_is_hf_router_topk(name, models):
    """The trace's picks are the ids HF's own gate (Glm4MoeTopkRouter / MiniMaxM2TopKRouter) selects."""
    assert_routing_is_hf(models[name], K)


FEATURES = [("glm4_moe", "partial_rotary"), ("glm4_moe", "qk_norm"), ("glm4_moe", "groups"), ("glm4_moe", "scale"),
            ("glm4_moe", "correction_bias"), ("glm4_moe", "shared_expert"),
            ("minimax_m2", "partial_rotary"), ("minimax_m2", "qk_norm"), ("minimax_m2", "correction_bias"),
            ("minimax_m2", "sigmoid"), ("minimax_m2", "renormalise"), ("glm_moe_dsa", "sparse"),
            ("glm_moe_dsa", "correction_bias")]


@pytest.mark.parametrize("name,feature", FEATURES)
def test_every_feature_is_exercised(name, feature, models):
    """Dropping any one of them moves the logits well past the tolerance: each is really in play."""
    model = models[name]
    cfg = model.ckpt.config
    changed = {"partial_rotary": dict(rotary_dim=0), "qk_norm": dict(qk_norm="none"),
               "groups": dict(routing=replace(cfg.routing, n_group=1, topk_group=1)),
               "scale": dict(routing=replace(cfg.routing, scale=1.0)),
               "sigmoid": dict(routing=replace(cfg.routing, score="softmax")),
               "renormalise": dict(norm_topk_prob=False),
               "sparse": dict(dsa=cfg.dsa and replace(cfg.dsa, index_topk=64))}.get(feature, {})
    engine = make_engine(model, 0, "offload", ckpt=replace(model.ckpt, config=replace(cfg, **changed)))
    for lw in engine.decoder.layers:
        if feature == "correction_bias":
            lw.correction_bias = None
        if feature == "shared_expert":
            lw.shared_gate_up = None
    assert_moves_logits(engine, model)


# Published config.json fields (GLM-4.5 / 4.6 / 4.7 share the shape; MiniMax-M2 / M2.5 likewise): conf/model's
# glm-4.7 and minimax-m2.5 cards are what sim.checkpoint_card reads from them
GLM_4_7 = {"architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "first_k_dense_replace": 3,
           "head_dim": 128, "hidden_size": 5120, "intermediate_size": 12288, "max_position_embeddings": 202752,
           "model_type": "glm4_moe", "moe_intermediate_size": 1536, "n_group": 1, "n_routed_experts": 160,
           "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
           "num_hidden_layers": 92, "num_key_value_heads": 8, "num_nextn_predict_layers": 1,
           "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 1000000, "routed_scaling_factor": 2.5,
           "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": True, "vocab_size": 151552,
           "torch_dtype": "bfloat16"}
MINIMAX_M2_5 = {"architectures": ["MiniMaxM2ForCausalLM"], "head_dim": 128, "hidden_size": 3072,
                "intermediate_size": 1536, "max_position_embeddings": 196608, "model_type": "minimax_m2",
                "num_attention_heads": 48, "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8,
                "num_local_experts": 256, "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06, "rope_theta": 5000000,
                "rotary_dim": 64, "scoring_func": "sigmoid", "use_qk_norm": True, "use_routing_bias": True,
                "vocab_size": 200064, "torch_dtype": "bfloat16"}


def test_published_configs_read():
    """GLM-4.7's and MiniMax-M2.5's config.json fields -> the ModelConfig HF would use."""
    from freetoken.models import read_model_config

    family, cfg = read_model_config(GLM_4_7, "config.json")
    assert family.name == "glm4_moe" and cfg.moe_layers == tuple(range(3, 92)) and cfg.rotary_dim == 64
    assert cfg.rope_theta == 1e6 and cfg.shared_expert_intermediate == 1536 and cfg.qk_norm == "head"
    assert family.dense_tensors(cfg)["model.layers.3.mlp.gate.e_score_correction_bias"] == (160,)
    assert "model.layers.92.self_attn.q_proj.weight" not in family.dense_tensors(cfg)  # the MTP layer: not read
    family, cfg = read_model_config(MINIMAX_M2_5, "config.json")
    assert family.name == "minimax_m2" and cfg.num_moe_layers == 62 and cfg.rotary_dim == 64 and cfg.top_k == 8
    shapes = family.dense_tensors(cfg)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (48 * 128,)
    assert shapes["model.layers.0.block_sparse_moe.e_score_correction_bias"] == (256,)
    with pytest.raises(CheckpointError, match="scoring_func"):
        read_model_config(dict(MINIMAX_M2_5, scoring_func="softmax"), "config.json")
    with pytest.raises(CheckpointError, match="partial_rotary_factor"):
        read_model_config(dict(GLM_4_7, partial_rotary_factor=1.5), "config.json")


@pytest.mark.parametrize("card_name,config", [("glm-4.7", GLM_4_7), ("minimax-m2.5", MINIMAX_M2_5)])
def test_shipped_card_is_what_ft_predict_reads_from_the_config(card_name, config, tmp_path):
    """conf/model's card and `ft predict --model DIR` on the published config.json size the same model."""
    from freetoken.sim.model_card import load_model_card

    (tmp_path / "config.json").write_text(json.dumps(config))
    from_config, shipped = load_model_card(str(tmp_path)), load_model_card(card_name)
    for field in ("num_layers", "moe_layers", "num_experts", "top_k", "shared_experts", "hidden_size",
                  "expert_intermediate_size", "kv_bytes_per_token", "attention_layers", "attention_width"):
        assert getattr(from_config, field) == getattr(shipped, field), field
    assert abs(from_config.dense_params - shipped.dense_params) < 0.01
    assert abs(from_config.embedding_params - shipped.embedding_params) < 0.001
    assert from_config.expert_params == shipped.expert_params


@pytest.mark.slow
def test_sim_replay_makes_the_live_plans(models):
    """Sim = live on each family's recorded routing, every policy, one split each (test_sim_equals_live.py's
    harness; together the three splits)."""
    from .test_sim_equals_live import assert_sim_replays_live

    for name, split in zip(CONFIGS, ("hybrid", "offload", "cpu")):
        assert_sim_replays_live(models[name].ckpt, (5,), (split,))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_card_from_config_sizes_what_the_engine_holds(name, models):
    """ft predict --model DIR (a card from config.json alone) and the loaded engine size the same memory: dense
    bytes (shared experts, the dense layer, q/k norms and biases included), KV per token, bytes per expert."""
    from freetoken.serve.engine_backend import checkpoint_memory
    from freetoken.sim.model_card import load_model_card
    from freetoken.sim.planner import model_memory

    model = models[name]
    card, engine = load_model_card(str(model.path)), make_engine(model, 3, "offload")
    sim_memory, engine_memory = model_memory(card), checkpoint_memory(model.ckpt, 64)
    for field in ("dense_bytes", "kv_bytes_per_token", "expert_bytes", "num_experts", "min_slots"):
        assert getattr(sim_memory, field) == getattr(engine_memory, field), field
    assert card.expert_bytes() == engine.store.expert_bytes == 3 * D * model.ckpt.config.expert_intermediate * 4
    kv = engine.new_kv(8)
    cached = (*kv.k, *kv.v, *getattr(kv, "index_k", {}).values())  # DSA: the indexer keys beside the KV
    assert card.kv_bytes_per_token == sum(t.numel() * t.element_size() for t in cached) // 8


@pytest.mark.parametrize("name,tensor,change", [
    ("glm4_moe", "model.layers.1.mlp.gate.e_score_correction_bias", None),
    ("glm4_moe", "model.layers.0.self_attn.q_norm.weight", (Dh * 4,)),
    ("minimax_m2", "model.layers.2.block_sparse_moe.e_score_correction_bias", None),
    ("minimax_m2", "model.layers.0.self_attn.k_norm.weight", (Dh,)),  # per head instead of the whole projection
    ("glm_moe_dsa", "model.layers.2.self_attn.indexer.wk.weight", None),
])
def test_bad_checkpoint_names_file_and_tensor(name, tensor, change, models, tmp_path):
    tensors = load_file(models[name].path / "model.safetensors")
    if change is None:
        del tensors[tensor]
    else:
        tensors[tensor] = torch.ones(change)
    (tmp_path / "config.json").write_text((models[name].path / "config.json").read_text())
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=tensor.replace(".", r"\.")) as err:
        load_checkpoint(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_dsa_picks_are_hf_indexer_picks(models, monkeypatch):
    """Every query's sparse key set (indexer layers 0 and 2, prefill chunks past index_topk and decode steps) is the
    set HF's GlmMoeDsaIndexer selects over the same tokens (its picks past a query's own position are masked)."""
    from transformers import AutoModelForCausalLM

    import freetoken.engine.mla as mla

    model = models["glm_moe_dsa"]
    tokens = model.tokens[:-1]
    hf = AutoModelForCausalLM.from_pretrained(model.path).eval()
    hf_picks = {}
    for l in (0, 2):
        hf.model.layers[l].self_attn.indexer.register_forward_hook(
            lambda mod, args, out, l=l: hf_picks.__setitem__(l, out[0]))
    with torch.no_grad():
        hf(torch.tensor([tokens]))
    ours, real = [], mla.pick

    def spy(cfg, rows, layer, kv, start_pos, positions):
        picks = real(cfg, rows, layer, kv, start_pos, positions)
        ours.append((layer, start_pos, picks))
        return picks

    monkeypatch.setattr(mla, "pick", spy)
    run_steps(make_engine(model, 0, "offload"), tokens)
    checked = 0
    for layer, start, picks in ours:
        if picks is None:  # every query sees at most index_topk keys: all of them, as HF's picks
            continue
        for t, row in enumerate(picks.tolist()):
            pos = start + t
            want = {p for p in hf_picks[layer][pos].tolist() if p <= pos}
            assert {p for p in row if p <= pos} == want, f"layer {layer} position {pos}"
            checked += 1
    assert checked == 2 * (len(tokens) - 4)  # both indexer layers, every query past the first chunk


def test_published_glm5_config_reads():
    """GLM-5's configuration (transformers' GlmMoeDsaConfig defaults are its published values)."""
    from transformers import GlmMoeDsaConfig

    from freetoken.models import read_model_config

    raw = GlmMoeDsaConfig().to_dict() | {"architectures": ["GlmMoeDsaForCausalLM"]}
    family, cfg = read_model_config(raw, "config.json")
    assert family.name == "glm_moe_dsa" and cfg.moe_layers == tuple(range(3, 78)) and cfg.num_experts == 256
    assert cfg.mla.q_lora_rank == 2048 and cfg.mla.qk_head_dim == 256 and cfg.head_dim == 256
    assert cfg.dsa.index_topk == 2048 and cfg.dsa.index_heads == 32 and len(cfg.dsa.indexer_layers) == 78
    assert cfg.routing.scale == 2.5 and cfg.routing.correction_bias
    with pytest.raises(CheckpointError, match="indexer_types"):
        read_model_config(raw | {"indexer_types": ["full"] * 77 + ["sparse"]}, "config.json")
    # transformers 5.17 names the layer kind deepseek_sparse_attention, later releases indexed_attention: same model
    for kind in ("deepseek_sparse_attention", "indexed_attention"):
        assert read_model_config(raw | {"layer_types": [kind] * 78}, "config.json")[1] == cfg
    with pytest.raises(CheckpointError, match="layer_types .*'sliding_attention'"):
        read_model_config(raw | {"layer_types": ["indexed_attention"] * 77 + ["sliding_attention"]}, "config.json")


@pytest.mark.parametrize("name", ["glm4_moe", "minimax_m2"])
def test_bf16_checkpoint_routes_as_hf(name, models, tmp_path):
    """A bf16 checkpoint: GLM's gate stays fp32 and routes h.float() (HF's _keep_in_fp32_modules_strict), MiniMax's
    runs in the weight's bf16; Engine.route gives HF's gate logits and picks on the same bf16 hidden states."""
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(models[name].path).to(torch.bfloat16).save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    engine = Engine(load_checkpoint(tmp_path), CacheConfig("lru", capacity=0), kernels="host", device="cpu")
    layer = engine.config.moe_layers[-1]
    mlp = hf.model.layers[layer].mlp
    h = torch.randn(64, D, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)  # [T, D]
    want_dtype = torch.float32 if name == "glm4_moe" else torch.bfloat16
    assert mlp.gate.weight.dtype == engine.decoder.layers[layer].router.dtype == want_dtype
    with torch.no_grad():
        if name == "glm4_moe":
            logits, weights, ids = mlp.gate(h)
        else:
            logits, weights, ids = mlp.gate(h, mlp.e_score_correction_bias)
    got_w, got_ids = engine.route(len(engine.config.moe_layers) - 1, h)
    np.testing.assert_array_equal(got_ids.sort(-1).values.numpy(), ids.sort(-1).values.numpy())
    order = lambda i: i.argsort(-1)  # noqa: E731  compare weights expert by expert
    torch.testing.assert_close(got_w.gather(1, order(got_ids.long())), weights.float().gather(1, order(ids)),
                               rtol=1e-5, atol=1e-6)
    if name == "glm4_moe":  # the same router in bf16 weighs the experts differently: the fp32 gate matters
        lw, cfg = engine.decoder.layers[layer], engine.config
        bf16 = engine.kernels.linear(h, lw.router.bfloat16()).float()
        bf16_w, bf16_ids = engine.kernels.router_topk(bf16, K, cfg.norm_topk_prob, bias=lw.correction_bias,
                                                      **cfg.routing.options())
        same = (bf16_ids.sort(-1).values == got_ids.sort(-1).values).all(-1)  # tokens with the same picks
        drift = (bf16_w.gather(1, order(bf16_ids.long())) - got_w.gather(1, order(got_ids.long())))[same]
        assert drift.abs().max() > 20 * 1e-5  # 20x the tolerance the fp32 gate meets above
