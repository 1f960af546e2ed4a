"""Quantized Qwen3.5-MoE (hybrid: Gated DeltaNet and gated attention) through the hybrid path: GPTQ, AWQ and block-FP8
checkpoints made the way tests/engine/test_quant_hf_match.py makes them (each format's own packer, its real layout,
its quantization_config) give HF's logits on the packers' dequantized weights at capacities 0 / half / all in every
split, and HF's greedy tokens.

What each format quantizes, as its exporters do for these models: GPTQ every linear of the blocks (the DeltaNet
input and output projections, the gated attention's q (with its gate rows) / k / v / o, the shared expert, the
routed experts) but the DeltaNet b / a projections (4 rows: the exporters leave such tiny ones alone), the routers
and the lm head; AWQ the routed experts; FP8 (16 x 16 blocks) what GPTQ does. The routed experts stay packed; the
other quantized linears are dequantized at load, or, the attention projections, kept packed for the host kernels.
Tolerance as in test_hf_match.py: 1e-4 x max |logit|.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from .test_qwen3_next_hf_match import CONFIGS, _randomise
from .tiny_hf import Model, assert_greedy_is_hf, assert_logits_grid, hf_answers, random_hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))  # the packers' helpers (no package there)
import packers  # noqa: E402

E = 8
TEXT = dict(CONFIGS["qwen3_5_moe"][1], shared_expert_intermediate_size=32)  # 32: whole int4 groups in its down
BLOCKS = [  # (module under model.layers.N., HF attribute path) of the linears besides the routed experts
    ("linear_attn.in_proj_qkv", "linear_attn.in_proj_qkv"), ("linear_attn.in_proj_z", "linear_attn.in_proj_z"),
    ("linear_attn.out_proj", "linear_attn.out_proj"),
    ("self_attn.q_proj", "self_attn.q_proj"), ("self_attn.k_proj", "self_attn.k_proj"),
    ("self_attn.v_proj", "self_attn.v_proj"), ("self_attn.o_proj", "self_attn.o_proj"),
    ("mlp.shared_expert.gate_proj", "mlp.shared_expert.gate_proj"),
    ("mlp.shared_expert.up_proj", "mlp.shared_expert.up_proj"),
    ("mlp.shared_expert.down_proj", "mlp.shared_expert.down_proj"),
]
FORMATS = {  # name -> (quantization_config, packer, quantizes BLOCKS too, the experts' packed kind)
    "gptq": (packers.gptq_config(32, True) | {"modules_to_not_convert": ["gate", "lm_head", "in_proj_b",
                                                                         "in_proj_a"]},
             lambda p, w: packers.gptq_auto_round(p, w, 32, True), True, "int4"),
    "awq": (packers.CONFIGS["awq"](32), lambda p, w: packers.awq_auto_round(p, w, 32), False, "int4"),
    "fp8_block": (packers.CONFIGS["fp8_block"]((16, 16)) | {"modules_to_not_convert": ["gate", "lm_head"]},
                  lambda p, w: packers.fp8_block_transformers(p, w, (16, 16)), True, "fp8"),
}


def build(fmt: str, out: Path) -> Model:
    config, pack, blocks, _ = FORMATS[fmt]
    hf = random_hf("qwen3_5_moe_text", **TEXT)
    _randomise(hf)
    hf.save_pretrained(out)
    tensors = load_file(out / "model.safetensors")

    def quantize(prefix: str, weight: torch.Tensor) -> None:
        del tensors[prefix + ".weight"]
        packed, ref = pack(prefix, weight.clone())
        tensors.update(packed)
        weight.copy_(ref)

    with torch.no_grad():
        for l, layer in enumerate(hf.model.layers):
            if blocks:
                for ours, theirs in BLOCKS:
                    if hasattr(layer, theirs.split(".")[0]):  # DeltaNet or attention, by the layer's type
                        quantize(f"model.layers.{l}.{ours}", layer.get_submodule(theirs).weight.data)
            experts = layer.mlp.experts
            I = experts.down_proj.shape[-1]
            for e in range(E):
                m = f"model.layers.{l}.mlp.experts.{e}."
                quantize(m + "gate_proj", experts.gate_up_proj.data[e, :I])
                quantize(m + "up_proj", experts.gate_up_proj.data[e, I:])
                quantize(m + "down_proj", experts.down_proj.data[e])
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(raw | {"quantization_config": config}))
    return hf_answers(hf, out, gates=[layer.mlp.gate for layer in hf.model.layers])


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Model]:
    return {fmt: build(fmt, tmp_path_factory.mktemp(f"qwen3_5_{fmt}")) for fmt in FORMATS}


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_checkpoint_is_what_it_claims(models, fmt):
    ckpt = models[fmt].ckpt
    assert ckpt.config.linear_attention.layers == (0, 1, 2) and ckpt.quant is not None
    gate, up, down = ckpt.experts[0]
    assert gate.kind == up.kind == down.kind == FORMATS[fmt][3] and gate.num_slots == E
    raw = load_file(models[fmt].path / "model.safetensors")
    deltanet = [n for n in raw if n.startswith("model.layers.0.linear_attn.in_proj_qkv.")]
    quantized = any(not n.endswith(".weight") for n in deltanet)  # a qweight / scale beside (or for) the weight
    assert quantized == FORMATS[fmt][2]  # the DeltaNet projection is stored quantized where the format does
    assert "model.layers.0.linear_attn.in_proj_b.weight" in raw  # left plain


@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_match_hf_every_capacity_every_split(models, fmt):
    assert_logits_grid(models[fmt], E, f"qwen3.5 {fmt}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_tokens_equal_hf_generate(models, fmt):
    assert_greedy_is_hf(models[fmt])
