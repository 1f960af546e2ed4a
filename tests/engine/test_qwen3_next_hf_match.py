"""Qwen3-Next and Qwen3.5-MoE (hybrid Gated DeltaNet / gated attention) in the live engine: logits equal HF
transformers' Qwen3NextForCausalLM / Qwen3_5MoeForCausalLM / Qwen3_5MoeForConditionalGeneration at every capacity,
in every split.

The tiny random models have what sets these families apart: linear-attention layers (conv kernel 4 < the 10-token
prompt and its 4-token prefill chunks, two value heads per key head, random A_log / dt_bias / conv / output-norm
weights) between full-attention layers (gated output, per-head q/k norm, rope on a quarter of each head), (1 + w)
RMSNorms with random w, a sigmoid-gated shared expert; Qwen3-Next packs its DeltaNet projections per key head and
has a dense layer, Qwen3.5 keeps them apart. HF runs its torch fallbacks (torch_chunk_gated_delta_rule, the
recurrent rule and causal_conv1d_update in generate). Tolerance as in test_hf_match.py: 1e-4 x max |logit|.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.engine import CacheConfig, SamplingParams
from freetoken.models import CheckpointError
from freetoken.models.checkpoint import load_checkpoint

from .conftest import PROMPT
from .test_hf_match import CHUNK
from .tiny_hf import (Model, assert_greedy_is_hf, assert_logits_grid, assert_moves_logits, assert_routing_is_hf,
                      assert_triton_matches, hf_answers, make_engine, random_hf)

E, K, D = 8, 2, 64
TEXT = dict(hidden_size=D, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=128, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=32,
            shared_expert_intermediate_size=40, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=64,
            initializer_range=0.1, eos_token_id=None, bos_token_id=None, pad_token_id=None)
CONFIGS = {  # Qwen3-Next: full attention at 1 and 3, a dense MLP at layer 2; Qwen3.5: three linear layers, then full
    "qwen3_next": ("qwen3_next", dict(TEXT, layer_types=["linear_attention", "full_attention"] * 2,
                                      mlp_only_layers=[2], intermediate_size=48)),
    "qwen3_5_moe": ("qwen3_5_moe_text", dict(TEXT, full_attention_interval=4)),
}
VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=D, patch_size=4,
              spatial_merge_size=1, temporal_patch_size=1, num_position_embeddings=16)


def _randomise(hf) -> None:
    """HF starts every (1 + w) norm at w = 0 and the DeltaNet output norm at 1: random values make them count."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith("dt_bias"):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


def _answers(hf, path: Path, layers) -> Model:
    return hf_answers(hf, path, gates=[layer.mlp.gate for layer in layers if hasattr(layer.mlp, "gate")])


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Model]:
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    out = {}
    for name, (model_type, kw) in CONFIGS.items():
        hf = random_hf(model_type, **kw)
        _randomise(hf)
        path = tmp_path_factory.mktemp(name)
        hf.save_pretrained(path)
        out[name] = _answers(hf, path, hf.model.layers)
    torch.manual_seed(0)
    cfg = Qwen3_5MoeConfig(text_config=CONFIGS["qwen3_5_moe"][1], vision_config=VISION)
    hf = Qwen3_5MoeForConditionalGeneration(cfg).eval()
    _randomise(hf)
    path = tmp_path_factory.mktemp("qwen3_5_moe_multimodal")
    hf.save_pretrained(path)
    out["multimodal"] = _answers(hf, path, hf.model.language_model.layers)
    return out


def test_the_checkpoints_are_what_they_claim(models):
    nxt, q35 = models["qwen3_next"].ckpt.config, models["qwen3_5_moe"].ckpt.config
    assert nxt.linear_attention.layers == (0, 2) and nxt.moe_layers == (0, 1, 3) and nxt.dense_intermediate == 48
    assert q35.linear_attention.layers == (0, 1, 2) and q35.moe_layers == (0, 1, 2, 3)
    assert nxt.linear_attention.fused_projections and not q35.linear_attention.fused_projections
    assert nxt.rotary_dim == q35.rotary_dim == 4 and nxt.attention_output_gate and nxt.norm_unit_offset
    assert nxt.linear_attention.conv_kernel == 4 < len(PROMPT) and CHUNK == 4
    mm = models["multimodal"]
    assert mm.ckpt.config == q35.__class__(**{**_fields(q35), "architecture": "Qwen3_5MoeForConditionalGeneration"})
    assert len(mm.ckpt.notes) == 1 and "'model.visual.'" in mm.ckpt.notes[0] and "text-only" in mm.ckpt.notes[0]


def _fields(cfg) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe", "multimodal"])
def test_logits_match_hf_every_capacity_every_split(name, models):
    assert_logits_grid(models[name], E, f"{name}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_triton_kernels(name, models):
    """The Triton path (interpreted on CPU): conv, chunked and recurrent delta rule, gated norm, and the cache's
    hits, fetches and CPU lane. Three decode steps (the interpreter is slow; the grid above decodes eight)."""
    assert_triton_matches(models[name], E, len(PROMPT) + 3, f"{name} triton")


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe", "multimodal"])
def test_greedy_tokens_equal_hf_generate(name, models):
    assert_greedy_is_hf(models[name])


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_recorded_routing_is_hf_router_topk(name, models):
    assert_routing_is_hf(models[name], K)


def test_every_qwen3_next_feature_is_exercised(models):
    """Dropping the (1 + w) offset, the partial rotary, the output gate or the DeltaNet output norm's weight moves
    the logits well past the tolerance."""
    from dataclasses import replace

    model = models["qwen3_next"]
    cfg = model.ckpt.config
    for what, changed in (("offset", dict(norm_unit_offset=False)), ("rotary", dict(rotary_dim=16))):
        assert_moves_logits(make_engine(model, 0, "offload", ckpt=replace(model.ckpt, config=replace(cfg, **changed))),
                            model, what)
    for what in ("out_gate", "norm"):
        engine = make_engine(model, 0, "offload")
        for lw in engine.decoder.layers:
            if what == "out_gate":
                lw.out_gate = None
            elif lw.deltanet is not None:
                lw.deltanet.norm = torch.ones_like(lw.deltanet.norm)
        assert_moves_logits(engine, model, what)


def test_recurrent_state_is_reused_only_where_it_exists(models):
    """A second turn that appends prefills only the new tokens (the states are at the cache's length); one that
    edits earlier restarts from zero. Both equal a cold run."""
    model = models["qwen3_5_moe"]
    engine = make_engine(model, 5, "hybrid")
    turn1 = model.tokens[:len(PROMPT) + 3]
    cold = list(engine.generate(model.tokens, SamplingParams(greedy=True), max_tokens=4, stop_token_ids=[]))
    kv = engine.new_kv(64)
    list(engine.generate(turn1, SamplingParams(greedy=True), max_tokens=1, stop_token_ids=[], kv=kv))
    assert kv.length == len(turn1)
    before = engine.stats.prefill_tokens
    warm = list(engine.generate(model.tokens, SamplingParams(greedy=True), max_tokens=4, stop_token_ids=[], kv=kv))
    assert engine.stats.prefill_tokens - before == len(model.tokens) - len(turn1) and warm == cold
    edited = [5] + model.tokens[1:]
    before = engine.stats.prefill_tokens
    got = list(engine.generate(edited, SamplingParams(greedy=True), max_tokens=4, stop_token_ids=[], kv=kv))
    assert engine.stats.prefill_tokens - before == len(edited)
    assert got == list(make_engine(model, 5, "hybrid").generate(edited, SamplingParams(greedy=True), max_tokens=4,
                                                           stop_token_ids=[]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_sim_replay_makes_the_live_plans(name, models):
    """Sim = live on each family's recorded routing, every policy (test_sim_equals_live.py's harness)."""
    from freetoken.placement import POLICIES
    from freetoken.sim.calls import trace_calls
    from freetoken.sim.replay import replay

    from .conftest import policy_options
    from .test_sim_equals_live import CHUNK as SIM_CHUNK
    from .test_sim_equals_live import SPLITS as SIM_SPLITS
    from .test_sim_equals_live import _sim_policy, live_run

    ckpt = models[name].ckpt
    probe = live_run(ckpt, CacheConfig("lru", capacity=0)).trace()
    for policy in sorted(POLICIES):
        opts = policy_options(policy, probe, SIM_CHUNK)
        for capacity in (7,):
            for name, split in SIM_SPLITS.items():
                engine = live_run(ckpt, CacheConfig(policy, capacity=capacity, split=split, options=opts))
                trace = engine.trace()
                sim = replay(trace_calls(trace, SIM_CHUNK), _sim_policy(policy, capacity, trace, opts), split,
                             keep_plans=True)
                assert sim.plans and sim.plans == engine.cache.plans, f"{policy} capacity={capacity} {name}"


# bad checkpoints
def _copy(model: Model, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(model.path, out)
    return out


def test_missing_linear_attention_tensor_is_named(models, tmp_path):
    path = _copy(models["qwen3_5_moe"], tmp_path)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.linear_attn.A_log"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.linear_attn\.A_log.*not found"):
        load_checkpoint(path)


def test_conv_kernel_size_mismatch_is_named(models, tmp_path):
    path = _copy(models["qwen3_next"], tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"linear_conv_kernel_dim": 3}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.layers\.0\.linear_attn\.conv1d"
                                              r"\.weight' has shape \[96, 1, 4\], expected \[96, 1, 3\]"):
        load_checkpoint(path)


def test_unknown_layer_type_is_named(models, tmp_path):
    path = _copy(models["qwen3_next"], tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["layer_types"][1] = "sliding_attention"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: layer_types\[1\] 'sliding_attention' is not one of"):
        load_checkpoint(path)


# sizing
@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_card_from_config_sizes_what_the_engine_holds(name, models):
    """ft predict's card (config.json alone): expert bytes as the store holds them, dense bytes as loaded (the
    DeltaNet weights included), KV bytes per token of the attention layers only, and the per-sequence states."""
    from freetoken.serve.engine_backend import checkpoint_memory
    from freetoken.sim.checkpoint_card import card_from_checkpoint
    from freetoken.sim.planner import model_memory

    model = models[name]
    card = card_from_checkpoint(model.path)
    engine = make_engine(model, 3, "offload")
    kv = engine.new_kv(8)
    cfg = model.ckpt.config
    assert card.expert_bytes() == engine.store.expert_bytes
    linear = len(cfg.linear_attention.layers)
    assert card.attention_layers == 4 - linear and linear == {"qwen3_next": 2, "qwen3_5_moe": 3}[name]
    assert card.kv_bytes_per_token == sum(t.numel() * t.element_size() for t in (*kv.k, *kv.v)) // 8
    assert card.kv_bytes_per_token == (4 - linear) * 2 * 2 * 16 * 4  # attention layers x k, v x 2 heads x 16 x fp32
    # per DeltaNet layer: conv 96 channels x 3 taps + recurrent 4 heads x 16 x 8, both fp32 here: 3,200 bytes
    assert card.state_bytes_per_sequence == kv.state_bytes() == linear * (96 * 3 + 4 * 16 * 8) * 4
    assert (card.linear_layers, card.linear_heads, card.linear_key_head_dim, card.linear_value_head_dim) == \
        (linear, 4, 16, 8)
    assert card.dense_bytes() + card.embedding_bytes() == sum(t.numel() * t.element_size()
                                                              for t in model.ckpt.dense.values())
    engine_memory, sim_memory = checkpoint_memory(model.ckpt, 64), model_memory(card)
    for field in ("dense_bytes", "kv_bytes_per_token", "expert_bytes", "num_experts", "min_slots", "state_bytes"):
        assert getattr(sim_memory, field) == getattr(engine_memory, field), field


PUBLISHED_QWEN3_6 = {  # Qwen3.6-35B-A3B's published shape (conf/model/qwen3.6-35b-a3b.yaml's sources)
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "tie_word_embeddings": False, "dtype": "bfloat16",
    "text_config": {"vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
                    "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                    "shared_expert_intermediate_size": 512, "full_attention_interval": 4,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}}


def test_qwen3_6_card_is_what_its_config_gives(tmp_path):
    """conf/model/qwen3.6-35b-a3b.yaml = the card ft predict derives from the published config values; the hand
    count of the per-sequence state: 30 DeltaNet layers x (8192 conv channels x 3 x 2 B + 32 x 128 x 128 x 4 B)."""
    from freetoken.sim.checkpoint_card import card_from_checkpoint
    from freetoken.sim.model_card import load_model_card

    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED_QWEN3_6))
    derived, conf = card_from_checkpoint(tmp_path), load_model_card("qwen3.6-35b-a3b")
    for field in ("num_layers", "moe_layers", "num_experts", "top_k", "shared_experts", "hidden_size",
                  "expert_intermediate_size", "kv_bytes_per_token", "attention_layers", "attention_width",
                  "state_bytes_per_sequence", "expert_bits", "dense_bits", "linear_layers", "linear_heads",
                  "linear_key_head_dim", "linear_value_head_dim"):
        assert getattr(conf, field) == getattr(derived, field), field
    assert abs(conf.dense_params - derived.dense_params) < 1e-4 and abs(conf.embedding_params - derived.embedding_params) < 1e-5
    assert conf.state_bytes_per_sequence == 30 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)
    assert conf.expert_bytes() == 3 * 2048 * 512 * 2 and conf.kv_bytes_per_token == 10 * 2 * 2 * 256 * 2


def test_ft_generate_says_what_the_multimodal_load_left_out(models, capsys):
    """`ft generate` on the Qwen3_5MoeForConditionalGeneration checkpoint: one stderr line names the skipped vision
    tower; the greedy tokens are HF's."""
    from freetoken.cli import main

    model = models["multimodal"]
    ids = ",".join(map(str, PROMPT))
    assert main(["generate", "--model", str(model.path), "--token-ids", ids, "--greedy", "--max-tokens", "3",
                 "--stop-token-ids", "", "--kernels", "host", "--device", "cpu", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["token_ids"] == model.tokens[len(PROMPT):len(PROMPT) + 3]
    notes = [line for line in out.err.splitlines() if "model.visual." in line]
    assert len(notes) == 1 and "not loaded" in notes[0] and str(model.path) in notes[0]
