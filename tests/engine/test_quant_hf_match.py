"""Quantized checkpoints in the live engine: experts stay packed in the host store and the slot pool, and logits
equal HF transformers' on the same dequantized weights, at every capacity, in every split.

Each format's checkpoint is a tiny random Qwen3-MoE whose expert matrices were written by that format's
independent packer (tests/quant/packers.py: auto-round, transformers, compressed-tensors) in its real layout
(per-expert GPTQ / AWQ / FP8 / NVFP4 tensors; gpt-oss's fused MXFP4 blocks with gate and up rows interleaved),
with the matching quantization_config. GPTQ and block FP8 quantize attention too; the router, norms, embedding
and lm_head stay plain (`modules_to_not_convert` / `ignore`). The HF reference model gets the packer's own
dequantized values (fp32) in place of those weights. Tolerance as in test_hf_match.py: 1e-4 x max |logit|.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.models import CheckpointError
from freetoken.models.checkpoint import Checkpoint, load_checkpoint
from freetoken.quant import expert_bytes

from .conftest import DECODE_STEPS, PROMPT
from .test_hf_match import assert_close, assert_grid, run_steps
from .tiny_hf import make_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))  # the packers' helpers (no package there)
import packers

E, I, D, LAYERS = 4, 32, 64, 2
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Format:
    make_config: Callable[[], dict]  # the quantization_config, made when a model is built: compressed-tensors'
    # schemes take ~4 s to import, which every test worker paid while collecting, whatever it ran
    pack: object  # (prefix, w [out, in]) -> (tensors, dequantized w); None for the fused mxfp4 layout
    attention: bool = False  # attention projections quantized as well


FORMATS = {
    "gptq": Format(lambda: packers.gptq_config(32, True) | {"modules_to_not_convert": ["gate", "lm_head"]},
                   lambda p, w: packers.gptq_auto_round(p, w, 32, True), attention=True),
    "awq": Format(lambda: packers.CONFIGS["awq"](32), lambda p, w: packers.awq_auto_round(p, w, 32)),
    "fp8_block": Format(lambda: packers.CONFIGS["fp8_block"]((32, 32)) | {"modules_to_not_convert": ["gate",
                                                                                                     "lm_head"]},
                        lambda p, w: packers.fp8_block_transformers(p, w, (32, 32)), attention=True),
    "fp8_channel": Format(lambda: packers.CONFIGS["fp8_channel"]() | {"ignore": ["lm_head", "re:.*mlp.gate$"]},
                          packers.fp8_channel_ct),
    "mxfp4": Format(packers.CONFIGS["mxfp4"], None),
    "nvfp4": Format(lambda: packers.CONFIGS["nvfp4_ct"]() | {"ignore": ["lm_head", "re:.*mlp.gate$"]},
                    packers.nvfp4_ct),
}
KIND = {"gptq": "int4", "awq": "int4", "fp8_block": "fp8", "fp8_channel": "fp8", "mxfp4": "fp4", "nvfp4": "fp4"}
TRITON_CASES = ("gptq", "fp8_block", "nvfp4")  # one per packed kind


@dataclass
class QuantModel:
    path: Path
    ckpt: Checkpoint
    tokens: list[int]  # prompt + HF's greedy continuation on the dequantized weights
    logits: torch.Tensor  # [len(tokens), V]


def build(fmt_name: str, out: Path) -> QuantModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    fmt = FORMATS[fmt_name]
    cfg = AutoConfig.for_model("qwen3_moe", hidden_size=D, intermediate_size=48, num_hidden_layers=LAYERS,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=128, num_experts_per_tok=2,
                               initializer_range=0.1, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                               num_experts=E, moe_intermediate_size=I, head_dim=16, norm_topk_prob=True)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    hf.save_pretrained(out)
    tensors = load_file(out / "model.safetensors")
    for l in range(LAYERS):
        layer = hf.model.layers[l]
        m = f"model.layers.{l}.mlp.experts."
        gate_up, down = layer.mlp.experts.gate_up_proj.data, layer.mlp.experts.down_proj.data  # [E, 2I, D], [E, D, I]
        if fmt.pack is None:  # gpt-oss: one tensor per projection, gate/up rows interleaved (gate = even rows)
            interleaved = torch.stack([gate_up[:, :I], gate_up[:, I:]], dim=2).reshape(E, 2 * I, D)
            for name, w, target in (("gate_up_proj", interleaved, None), ("down_proj", down, down)):
                packed, ref = packers.mxfp4_gpt_oss(m + name, w)
                tensors.update(packed)
                if target is None:
                    gate_up[:, :I], gate_up[:, I:] = ref[:, 0::2], ref[:, 1::2]
                else:
                    target.copy_(ref)
            for e in range(E):
                for p in ("gate_proj", "up_proj", "down_proj"):
                    del tensors[f"{m}{e}.{p}.weight"]
            continue
        for e in range(E):
            for p, w in (("gate_proj", gate_up[e, :I]), ("up_proj", gate_up[e, I:]), ("down_proj", down[e])):
                del tensors[f"{m}{e}.{p}.weight"]
                packed, ref = fmt.pack(f"{m}{e}.{p}", w.clone())
                tensors.update(packed)
                w.copy_(ref)
        if fmt.attention:
            for p in ATTN:
                prefix = f"model.layers.{l}.self_attn.{p}"
                weight = getattr(layer.self_attn, p).weight.data
                del tensors[f"{prefix}.weight"]
                packed, ref = fmt.pack(prefix, weight.clone())
                tensors.update(packed)
                weight.copy_(ref)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": fmt.make_config()}))
    with torch.no_grad():
        gen = hf.generate(torch.tensor([PROMPT]), max_new_tokens=DECODE_STEPS + 1, do_sample=False,
                          min_new_tokens=DECODE_STEPS + 1)
        tokens = gen[0].tolist()
        logits = hf(torch.tensor([tokens])).logits[0].float()
    return QuantModel(out, load_checkpoint(out), tokens, logits)


@pytest.fixture(scope="module")
def quant_models(tmp_path_factory):
    built: dict[str, QuantModel] = {}

    def get(name: str) -> QuantModel:
        if name not in built:
            built[name] = build(name, tmp_path_factory.mktemp(name))
        return built[name]

    return get


@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_match_hf_every_capacity_every_split(fmt, quant_models):
    model = quant_models(fmt)
    gate, up, down = model.ckpt.experts[0]
    assert gate.kind == up.kind == down.kind == KIND[fmt] and gate.num_slots == E
    assert gate.shape == up.shape == (I, D) and down.shape == (D, I)
    def staged_bytes(capacity, split, engine):
        c = engine.counters
        if capacity == 0 and split == "offload":  # every expert through the staging rows
            assert c.fetched_bytes == c.fetched * engine.store.expert_bytes and c.fetched > 0

    assert_grid(lambda capacity, split: make_engine(model, capacity, split), model.tokens[:-1], model.logits[:-1],
                (0, LAYERS * E // 2, LAYERS * E), fmt, staged_bytes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_slot_pool_holds_packed_bytes(fmt, quant_models):
    model = quant_models(fmt)
    engine = make_engine(model, 3, "hybrid", kernels="reference")  # a real slot pool (the host set aliases the store)
    store, pool = engine.store, engine.cache.pool
    fq = model.ckpt.quant
    assert store.packed and pool.packed
    # the packed layout's closed form (freetoken.quant.cost), gate + up + down
    assert store.expert_bytes == 2 * expert_bytes(fq, I, D) + expert_bytes(fq, D, I)
    held = sum(t.numel() * t.element_size() for w in (pool.gate, pool.up, pool.down) for t in w.tensors().values())
    assert held == (pool.capacity + pool.staging) * store.expert_bytes == pool.nbytes
    dense_fp32 = (pool.capacity + pool.staging) * 3 * I * D * 4
    assert held < 0.3 * dense_fp32  # int4 ~0.15, fp8 ~0.26, fp4 ~0.14 of fp32


@pytest.mark.slow
@pytest.mark.parametrize("fmt", TRITON_CASES)
def test_triton_expert_ffn_quant(fmt, quant_models):
    """The Triton path (interpreted on CPU): hits, fetches into slots and staging, and the CPU lane."""
    model = quant_models(fmt)
    engine = make_engine(model, LAYERS * E // 2, "hybrid", kernels="triton")
    logits = run_steps(engine, model.tokens[:-1])
    assert_close(logits, model.logits[:-1], f"{fmt} triton")
    c = engine.counters
    assert c.hits > 0 and c.fetched > 0 and c.cpu > 0


def _rewrite(model: QuantModel, tmp_path: Path, drop: str | None = None, config: dict | None = None) -> Path:
    import shutil

    out = tmp_path / "bad"
    shutil.copytree(model.path, out)
    if drop is not None:
        tensors = load_file(out / "model.safetensors")
        del tensors[drop]
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    if config is not None:
        raw = json.loads((out / "config.json").read_text())
        raw["quantization_config"] |= config
        (out / "config.json").write_text(json.dumps(raw))
    return out


def test_missing_scale_is_named(quant_models, tmp_path):
    name = "model.layers.1.mlp.experts.2.up_proj.scales"
    with pytest.raises(CheckpointError, match=f"missing tensor '{name}'"):
        load_checkpoint(_rewrite(quant_models("gptq"), tmp_path, drop=name))


def test_missing_nvfp4_global_scale_is_named(quant_models, tmp_path):
    name = "model.layers.0.mlp.experts.3.down_proj.weight_global_scale"
    with pytest.raises(CheckpointError, match=f"missing tensor '{name}'"):
        load_checkpoint(_rewrite(quant_models("nvfp4"), tmp_path, drop=name))


def test_wrong_group_size_is_named(quant_models, tmp_path):
    bad = _rewrite(quant_models("awq"), tmp_path, config={"group_size": 128})
    with pytest.raises(CheckpointError, match=r"experts\.0\.gate_proj\.qweight: group_size 128 does not divide the "
                                              r"input dim 64"):
        load_checkpoint(bad)


def test_neither_plain_nor_quantized_is_named(quant_models, tmp_path):
    bad = _rewrite(quant_models("gptq"), tmp_path, drop="model.layers.0.self_attn.k_proj.qweight")
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' not found and no "
                                              r"'model\.layers\.0\.self_attn\.k_proj\.qweight' \(gptq\)"):
        load_checkpoint(bad)


def test_ft_generate_on_a_quantized_checkpoint(quant_models, capsys):
    from freetoken.cli import main

    model = quant_models("gptq")
    ids = ",".join(map(str, PROMPT))
    assert main(["generate", "--model", str(model.path), "--token-ids", ids, "--greedy", "--max-tokens", str(DECODE_STEPS),
                 "--json", "--kernels", "host", "--device", "cpu", "--capacity", "3", "--stop-token-ids",
                 ""]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["token_ids"] == model.tokens[len(PROMPT):len(PROMPT) + DECODE_STEPS]
    assert out["experts"] == "gptq int4 g32"
    assert "experts: gptq int4 g32" in captured.err


def test_server_memory_plan_counts_packed_bytes(quant_models):
    from freetoken.serve.engine_backend import checkpoint_memory, expert_format

    model = quant_models("nvfp4")
    fq = model.ckpt.quant
    mem = checkpoint_memory(model.ckpt, 64)
    # e2m1 [N, K/2] + e4m3 scales [N, K/16] + one fp32 global, per matrix: 32*64/2 + 32*4 + 4 = 1156, x3
    assert mem.expert_bytes == 2 * expert_bytes(fq, I, D) + expert_bytes(fq, D, I) == 3 * 1156
    assert mem.kv_bytes_per_token == 2 * LAYERS * 2 * 16 * 4  # fp32 compute dtype: K and V, 2 kv heads x 16
    assert expert_format(model.ckpt) == "nvfp4"


def test_fp8_weight_without_its_scale_is_named(quant_models, tmp_path):
    bad = _rewrite(quant_models("fp8_block"), tmp_path, drop="model.layers.1.self_attn.o_proj.weight_scale_inv")
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.self_attn\.o_proj\.weight' is torch\.float8_e4m3fn "
                                              r"but 'model\.layers\.1\.self_attn\.o_proj\.weight_scale_inv' is missing"):
        load_checkpoint(bad)
    expert_scale = "model.layers.0.mlp.experts.1.down_proj.weight_scale_inv"
    with pytest.raises(CheckpointError, match=f"missing tensor '{expert_scale}'"):
        load_checkpoint(_rewrite(quant_models("fp8_block"), tmp_path / "2", drop=expert_scale))
