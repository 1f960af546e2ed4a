"""DeepSeek-V4 in the live engine: logits equal HF transformers' DeepseekV4ForCausalLM at every capacity, in every
split, at every prefill chunk; greedy tokens equal HF generate; the recorded routing is HF's routers' picks.

The tiny random model has what sets V4 apart: hyper-connections over 3 residual streams (random fn / base / scale,
Sinkhorn), a sliding window of 4 keys with sinks, a compressed sparse layer (one entry per 4 tokens over overlapping
windows, the lightning indexer keeping 2 of them per query) and a heavily compressed one (one entry per 8 tokens)
of each kind after a sliding-only layer, their YaRN rope on compress_rope_theta, the grouped output projection, a
hash-routed first layer (a random token -> experts table), sqrt-softplus routing with a random correction bias, and
swiglu_limit 0.5 so the clamp bites in the experts and the shared expert. The 10-token prompt is longer than every
window (4, 8, and the 8 tokens an overlapping entry spans); index_topk 2 is below the entries a query sees from
position 11 on. 8 indexer heads keep exact ties of the relu'd index scores away (with 2 heads relu zeroes both
often, and torch.topk then picks among equal scores in an unspecified order, in HF as here).
Tolerance as in test_hf_match.py: 1e-4 x max |logit|.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.engine import SamplingParams

from .conftest import PROMPT
from .test_hf_match import assert_close, run_steps
from .tiny_hf import (Model, assert_greedy_is_hf, assert_logits_grid, assert_moves_logits, assert_routing_is_hf,
                      assert_triton_matches, hf_answers, make_engine, random_hf)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))  # the packers' helpers (no package there)
import packers  # noqa: E402

E, K, D, LAYERS = 8, 2, 64, 4
KINDS = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
         "compressed_sparse_attention"]
CONFIG = dict(hidden_size=D, moe_intermediate_size=32, num_hidden_layers=LAYERS, num_attention_heads=4, head_dim=32,
              q_lora_rank=24, num_experts_per_tok=K, n_routed_experts=E, vocab_size=128, sliding_window=4, o_groups=2,
              o_lora_rank=16, index_n_heads=8, index_head_dim=16, index_topk=2, hc_mult=3, swiglu_limit=0.5,
              compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
              layer_types=KINDS, mlp_layer_types=["hash_moe", "moe", "moe", "moe"], partial_rotary_factor=0.25,
              rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                               "beta_fast": 32.0, "beta_slow": 1.0},
              max_position_embeddings=64, initializer_range=0.1, eos_token_id=None, bos_token_id=None,
              pad_token_id=None)
RANDOMISED = ("sinks", "position_bias", "base", "scale", "norm.weight", "layernorm")


def randomise(hf, seed: int = 1) -> None:
    """HF starts sinks, position biases and hyper-connection bases at 0, scales and norms at 1, the correction bias
    at 0 and the hash table at expert 0: random values make each of them count."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if any(s in name for s in RANDOMISED):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)
            elif name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(b.shape[0])]))


def make_hf(**overrides):
    """The tiny model (seed 0, then randomise's values), unsaved."""
    hf = random_hf("deepseek_v4", **{**CONFIG, **overrides})
    randomise(hf)
    return hf


def build(out: Path, **overrides):
    hf = make_hf(**overrides)
    hf.save_pretrained(out)
    return hf


def answers(hf, path: Path) -> Model:
    return hf_answers(hf, path, gates=[layer.mlp.gate for layer in hf.model.layers])


BLOCK = (16, 16)
DENSE_FP8 = {"attn.wkv": "self_attn.kv_proj", "attn.wo_a": "self_attn.o_a_proj", "attn.wo_b": "self_attn.o_b_proj",
             "ffn.shared_experts.w1": "mlp.shared_experts.gate_proj",
             "ffn.shared_experts.w3": "mlp.shared_experts.up_proj",
             "ffn.shared_experts.w2": "mlp.shared_experts.down_proj"}  # (wq_a / wq_b: 24 columns, no 16 x 16 blocks)


def build_quantized(hf, out: Path, experts: str = "fp4") -> Model:
    """The published layout: the attention and shared-expert matrices FP8 in 16 x 16 blocks with e8m0 scales under
    `.scale`, every routed expert FP4 (e2m1 + e8m0 per 32; expert_dtype fp4) or FP8 like the rest (fp8),
    compressors, router and norms as they are; HF runs on the packers' own dequantized weights (transformers'
    Fp8Dequantize for the FP4 experts)."""
    pack = packers.fp4_deepseek_v4 if experts == "fp4" else \
        (lambda name, w: packers.fp8_block_deepseek_v4(name, w, BLOCK))
    hf.save_pretrained(out)
    tensors = load_file(out / "model.safetensors")
    with torch.no_grad():
        for l, layer in enumerate(hf.model.layers):
            for ours, theirs in DENSE_FP8.items():
                name, param = f"model.layers.{l}.{ours}", layer.get_submodule(theirs).weight
                del tensors[name + ".weight"]
                packed, ref = packers.fp8_block_deepseek_v4(name, param.data.clone(), BLOCK)
                tensors.update(packed)
                param.copy_(ref)
            routed = layer.mlp.experts
            I = routed.down_proj.shape[-1]
            for e in range(E):
                for proj, rows in (("w1", slice(0, I)), ("w3", slice(I, 2 * I))):
                    name = f"model.layers.{l}.ffn.experts.{e}.{proj}"
                    del tensors[name + ".weight"]
                    packed, ref = pack(name, routed.gate_up_proj.data[e, rows].clone())
                    tensors.update(packed)
                    routed.gate_up_proj.data[e, rows] = ref
                name = f"model.layers.{l}.ffn.experts.{e}.w2"
                del tensors[name + ".weight"]
                packed, ref = pack(name, routed.down_proj.data[e].clone())
                tensors.update(packed)
                routed.down_proj.data[e] = ref
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    qc = packers.CONFIGS["fp8_deepseek_v4"](BLOCK) | {"expert_dtype": experts}
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": qc}))
    return answers(hf, out)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Model]:
    path = tmp_path_factory.mktemp("deepseek_v4")
    out = {"bf": answers(build(path), path)}
    for experts in ("fp4", "fp8"):
        out[experts] = build_quantized(make_hf(), tmp_path_factory.mktemp(f"deepseek_v4_{experts}"), experts)
    return out


@pytest.fixture(scope="module")
def model(models) -> Model:
    return models["bf"]


def test_the_checkpoint_is_what_it_claims(model):
    cfg = model.ckpt.config
    v = cfg.v4
    assert cfg.family == "deepseek_v4" and cfg.moe_layers == (0, 1, 2, 3) and cfg.num_kv_heads == 1
    assert v.kinds == ("sliding", "csa", "hca", "csa") and (v.csa_rate, v.hca_rate) == (4, 8)
    assert v.hash_layers == (0,) and v.hc_mult == 3 and v.rope_dim == 8 and v.window == 4 < len(PROMPT)
    assert v.compress_yarn.factor == 4.0 and v.compress_yarn.attention_factor == 1.0 and v.compress_rope_theta == 160000
    assert cfg.routing.score == "sqrtsoftplus" and cfg.expert_glu == "silu_limit" and cfg.glu_limit == 0.5
    assert len(model.tokens) - 1 > 2 * v.hca_rate  # decode runs past two heavily compressed windows
    assert model.ckpt.dense["model.layers.0.ffn.gate.tid2eid"].dtype == torch.int64


@pytest.mark.parametrize("name", ["bf", "fp4", "fp8"])
def test_logits_match_hf_every_capacity_every_split(models, name):
    assert_logits_grid(models[name], E, f"deepseek_v4 {name}")


def test_the_quantized_checkpoint_keeps_its_experts_packed(models):
    """FP4 experts stay packed (e2m1 + e8m0 per 32: 0.53 bytes per weight), the FP8 matrices are dequantized at load,
    and the packed weights really differ from the unquantized model's."""
    from freetoken.sim.checkpoint_card import card_from_checkpoint

    fp4 = models["fp4"]
    gate, up, down = fp4.ckpt.experts[1]
    assert gate.kind == up.kind == down.kind == "fp4" and gate.num_slots == E and down.shape == (D, 32)
    assert fp4.ckpt.quant.kind == "fp8_block" and fp4.ckpt.quant.expert_format.kind == "mxfp4"
    engine = make_engine(fp4, 3, "offload")
    assert engine.store.format == "mxfp4"
    assert card_from_checkpoint(fp4.path).expert_bytes() == engine.store.expert_bytes == 3 * 32 * 64 * 17 // 32
    assert (fp4.logits - models["bf"].logits).abs().max() > 1e-3
    fp8 = models["fp8"]  # expert_dtype fp8: the experts in the dense weights' FP8 blocks
    assert fp8.ckpt.experts[0][0].kind == "fp8" and fp8.ckpt.quant.expert_format is fp8.ckpt.quant


@pytest.mark.parametrize("name", ["fp4", "fp8"])
def test_quantized_greedy_tokens_equal_hf_generate(models, name):
    assert_greedy_is_hf(models[name])


@pytest.mark.parametrize("chunk", [1, 3, 5, 8, 10])
def test_logits_do_not_depend_on_the_prefill_chunk(model, chunk):
    """A compressor's windows straddle prefill chunks (the rows of an open window wait in the cache): every chunk
    size gives HF's one-shot logits."""
    assert_close(run_steps(make_engine(model, 16, "hybrid", chunk=chunk), model.tokens[:-1]), model.logits[:-1],
                 f"chunk {chunk}")


@pytest.mark.slow
def test_triton_kernels(model):
    """The Triton path (interpreted on CPU): hyper-connections, compression, compressed attention, hash weights,
    the clamped activation, with hits, fetches and the CPU lane. Two decode steps (the interpreter is slow)."""
    assert_triton_matches(model, E, len(PROMPT) + 2, "deepseek_v4 triton")


def test_greedy_tokens_equal_hf_generate(model):
    assert_greedy_is_hf(model)


def test_recorded_routing_is_hf_router_topk(model):
    """The hash layer's picks (HF's DeepseekV4HashRouter: tid2eid of the token) and the top-k layers' (its
    DeepseekV4TopKRouter) are the trace's."""
    assert_routing_is_hf(model, K)
    table = model.ckpt.dense["model.layers.0.ffn.gate.tid2eid"]
    assert (model.picks[:, 0] == table[model.tokens].sort(-1).values.numpy()).all()


@pytest.mark.parametrize("feature", ["sinks", "compressed", "indexer", "hash", "clamp", "compress_rope", "sinkhorn",
                                     "streams"])
def test_every_v4_feature_is_exercised(model, feature):
    """Dropping any one of them moves the logits well past the tolerance: each is really in play."""
    cfg = model.ckpt.config
    v = cfg.v4
    changed = {"compressed": dict(v4=replace(v, kinds=("sliding",) * LAYERS)),
               "indexer": dict(v4=replace(v, index_topk=64)),
               "clamp": dict(glu_limit=1e9),
               "compress_rope": dict(v4=replace(v, compress_yarn=None)),
               "sinkhorn": dict(v4=replace(v, hc_iters=1))}.get(feature, {})
    ckpt = replace(model.ckpt, config=replace(cfg, **changed))  # "compressed": the layers leave their compressors
    engine = make_engine(model, 0, "offload", ckpt=ckpt)
    for lw in engine.decoder.layers:
        if feature == "sinks":
            lw.attn.sinks.fill_(-1e9)
        elif feature == "hash":
            lw.hash_table = None
            lw.correction_bias = lw.correction_bias if lw.correction_bias is not None else torch.zeros(E)
        elif feature == "streams":  # one stream's worth: every comb the identity, post 1
            lw.hc_attn.base[3:6] = 30.0
            lw.hc_ffn.base[3:6] = 30.0
    assert_moves_logits(engine, model, feature)


@pytest.mark.slow
def test_sim_replay_makes_the_live_plans(model):
    """Sim = live on V4's recorded routing (hash and top-k layers), every policy."""
    from .test_sim_equals_live import assert_sim_replays_live

    assert_sim_replays_live(model.ckpt, (3, 17))


def test_card_from_config_sizes_what_the_engine_holds(model):
    """ft predict's card (config.json alone) = the engine's bytes: experts as the store holds them, dense weights as
    loaded (the hash table aside), the cache per token (a key = value row per layer, the compressed entries and
    indexer keys in their per-token share) and the compressors' window rows per sequence."""
    from freetoken.serve.engine_backend import checkpoint_memory
    from freetoken.sim.checkpoint_card import card_from_checkpoint
    from freetoken.sim.planner import model_memory

    card = card_from_checkpoint(model.path)
    engine = make_engine(model, 3, "offload")
    tokens = 64  # a multiple of both compression rates: whole entries
    kv = engine.new_kv(tokens)
    assert card.expert_bytes() == engine.store.expert_bytes
    # per token: 4 layers x 32 + csa 2 x (32 + 16) / 4 + hca 32 / 8 = 128 + 24 + 4 = 156 values, fp32
    assert card.kv_bytes_per_token == 156 * 4
    assert card.kv_bytes_per_token * tokens + card.state_bytes_per_sequence == kv.cache_bytes()
    # window rows: two csa layers of 2 windows x 4 rows x (kv + gate) x 2 x (32 + 16), hca 8 rows x (kv + gate) x 32
    assert card.state_bytes_per_sequence == kv.state_bytes() == (2 * (2 * 4 * 2 * 2 * 48) + 8 * 2 * 32) * 4
    table = model.ckpt.dense["model.layers.0.ffn.gate.tid2eid"]
    weights = sum(t.numel() * t.element_size() for t in model.ckpt.dense.values()) - table.numel() * 8
    assert card.dense_bytes() + card.embedding_bytes() == weights
    engine_memory, sim_memory = checkpoint_memory(model.ckpt, 64), model_memory(card)
    for field in ("kv_bytes_per_token", "expert_bytes", "num_experts", "min_slots", "state_bytes"):
        assert getattr(sim_memory, field) == getattr(engine_memory, field), field


def test_published_tensor_names_load_the_same(model, tmp_path):
    """The published checkpoints' names (no `model.` prefix, embed.weight, hc_head_fn, ...) and an mtp layer (not
    loaded, said once) give the same model."""
    path = tmp_path / "published"
    shutil.copytree(model.path, path)
    tensors = load_file(path / "model.safetensors")
    renamed = {"embed.weight" if n == "model.embed_tokens.weight" else
               n.replace("model.hc_head.hc_", "hc_head_") if n.startswith("model.hc_head.") else
               n.removeprefix("model."): t for n, t in tensors.items()}
    renamed["mtp.0.attn.wq_a.weight"] = torch.zeros(2, 2)
    assert "layers.1.attn.compressor.wkv.weight" in renamed and "norm.weight" in renamed
    save_file(renamed, path / "model.safetensors", metadata={"format": "pt"})
    from freetoken.models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    assert len(ckpt.notes) == 1 and "'mtp.'" in ckpt.notes[0] and "multi-token-prediction" in ckpt.notes[0]
    assert_close(run_steps(make_engine(model, 8, "hybrid", ckpt=ckpt), model.tokens[:-1]), model.logits[:-1],
                 "published names")


def test_state_is_reused_only_where_it_exists(model):
    """A second turn that appends prefills only its new tokens (the compressors' window rows are at the cache's
    length); one that edits earlier restarts from zero. Both equal a cold run."""
    engine = make_engine(model, 5, "hybrid")
    turn1 = model.tokens[:len(PROMPT) + 3]
    cold = list(engine.generate(model.tokens, SamplingParams(greedy=True), max_tokens=4, stop_token_ids=[]))
    kv = engine.new_kv(64)
    list(engine.generate(turn1, SamplingParams(greedy=True), max_tokens=1, stop_token_ids=[], kv=kv))
    before = engine.stats.prefill_tokens
    warm = list(engine.generate(model.tokens, SamplingParams(greedy=True), max_tokens=4, stop_token_ids=[], kv=kv))
    assert engine.stats.prefill_tokens - before == len(model.tokens) - len(turn1) and warm == cold
    edited = [5] + model.tokens[1:]
    before = engine.stats.prefill_tokens
    got = list(engine.generate(edited, SamplingParams(greedy=True), max_tokens=4, stop_token_ids=[], kv=kv))
    assert engine.stats.prefill_tokens - before == len(edited)
    assert got == list(make_engine(model, 5, "hybrid").generate(edited, SamplingParams(greedy=True), max_tokens=4,
                                                                stop_token_ids=[]))


def test_transformers_default_config_reads():
    """transformers' DeepseekV4Config defaults (DeepSeek-V4-Flash-Base's shape): 43 layers, 64 heads of 512, 64
    rope dims, 256 experts top-6, the first 3 layers hash-routed, hc_mult 4."""
    from transformers import DeepseekV4Config

    from freetoken.models import read_model_config

    raw = DeepseekV4Config().to_dict() | {"architectures": ["DeepseekV4ForCausalLM"]}
    family, cfg = read_model_config(raw, "config.json")
    v = cfg.v4
    assert family.name == "deepseek_v4" and cfg.num_layers == 43 and cfg.head_dim == 512 and v.rope_dim == 64
    assert cfg.num_experts == 256 and cfg.top_k == 6 and v.hash_layers == (0, 1, 2) and v.hc_mult == 4
    assert v.kinds[:3] == ("hca", "hca", "hca") and v.kinds[3] == "csa" and (v.csa_rate, v.hca_rate) == (4, 128)
    assert v.kv_values_per_token(43, 512) == 43 * 512 + 20 * (512 + 128) / 4 + 23 * 512 / 128


@pytest.mark.parametrize("fields, message", [
    (dict(hc_mult=0), "field 'hc_mult' must be a positive integer, got 0"),
    (dict(o_groups=3), "num_attention_heads 64 is not a multiple of o_groups 3"),
    (dict(num_key_value_heads=2), "num_key_value_heads must be 1 (DeepSeek-V4 shares one key = value head), got 2"),
    (dict(layer_types=["sliding_attention"] * 42 + ["full_attention"]),
     "layer_types must list one of sliding_attention, compressed_sparse_attention, heavily_compressed_attention per "
     "layer (43), got " + repr(["sliding_attention"] * 42 + ["full_attention"])),
    (dict(mlp_layer_types=["moe"] * 3), "mlp_layer_types must list one of hash_moe, moe per layer (43), got "
                                        "['moe', 'moe', 'moe']"),
    (dict(compress_rates={"compressed_sparse_attention": 0}),
     "compress_rates must be positive, got 0 (compressed_sparse_attention) and 128 (heavily_compressed_attention)"),
    (dict(partial_rotary_factor=0.0), "field 'partial_rotary_factor' must be a number in (0, 1], got 0.0"),
    (dict(scoring_func="softmax"), "scoring_func 'softmax' is not supported (sqrtsoftplus)"),
    (dict(hc_eps=float("nan")), "field 'hc_eps' must be finite, got nan"),
])
def test_bad_v4_config_values_are_named(fields, message):
    """DeepSeek-V4's own fields, each refused in one line naming config.json's field."""
    from transformers import DeepseekV4Config

    from freetoken.models import CheckpointError, read_model_config

    raw = DeepseekV4Config().to_dict() | {"architectures": ["DeepseekV4ForCausalLM"]} | fields
    with pytest.raises(CheckpointError) as err:
        read_model_config(raw, "config.json")
    assert str(err.value) == f"config.json: {message}"
