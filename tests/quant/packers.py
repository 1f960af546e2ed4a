"""Each format's independent packer, wrapped to write one [out, in] float matrix in its real checkpoint layout.

Every function returns (tensors under their full checkpoint names, the packer's own dequantized weight [out, in]
fp32). The packers are the ones the tests in this folder already check freetoken.quant against: auto-round's
GPTQ / AWQ exporters, transformers' `Fp8Quantize` / `Fp8Dequantize`, compressed-tensors' FP8 / MXFP4 / NVFP4
compressors (their fp32 dequantization), and, for act-order g_idx and AutoGPTQ's v1 wrap, the loops of
test_int4.py transcribing AutoGPTQ's `QuantLinear.pack`. `CONFIGS` holds the matching quantization_config.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

# tests/quant is on sys.path (no package): its test modules are importable by name
from test_fp4 import NVFP4_CT, NVFP4_MODELOPT
from test_int4 import pack_gptq, quantize, reference

Packed = tuple[dict[str, torch.Tensor], torch.Tensor]


def _grid(w: torch.Tensor, group_size: int, sym: bool):
    """w [out, in] -> (its int4 min-max grid point w' [out, in], scales [out, G] fp16, zeros [out, G])."""
    in_dim = w.shape[1]
    g_idx = torch.arange(in_dim) // (in_dim if group_size == -1 else group_size)
    q, zeros, scales = quantize(w, group_size, sym, g_idx)  # [in, out], [G, out], [G, out]
    return reference(q, zeros, scales, g_idx), scales.t().contiguous(), zeros.t().contiguous()


def _linear(w: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w.clone()
    return linear


def gptq_auto_round(prefix: str, w: torch.Tensor, group_size: int, sym: bool,
                    packing: str = "auto_round:auto_gptq") -> Packed:
    """auto-round's QuantLinear.pack: `auto_gptq` (v1, zeros - 1) or `gptqmodel` (v2, zeros as is)."""
    if packing.endswith("auto_gptq"):
        from auto_round_extension.torch.qlinear_torch_zp import QuantLinear
    else:
        from auto_round_extension.torch.qlinear_torch import QuantLinear
    on_grid, scales, zeros = _grid(w, group_size, sym)
    if packing.endswith("auto_gptq") and not sym and (zeros == 0).any():
        raise AssertionError("v1 cannot store a zero point of 0 (docs/quant.md); pick another weight")
    layer = QuantLinear(4, group_size, w.shape[1], w.shape[0], False)
    layer.device = torch.device("cpu")  # its gptqmodel pack reads self.device
    layer.pack(_linear(on_grid), scales.float(), zeros)
    return {f"{prefix}.qweight": layer.qweight, f"{prefix}.qzeros": layer.qzeros,
            f"{prefix}.scales": layer.scales}, on_grid


def gptq_act_order(prefix: str, w: torch.Tensor, group_size: int, sym: bool, seed: int = 0) -> Packed:
    """AutoGPTQ's v1 pack (test_int4.pack_gptq) with a permuted act-order g_idx."""
    in_dim = w.shape[1]
    g = torch.Generator().manual_seed(seed)
    g_idx = (torch.arange(in_dim, dtype=torch.int32) // group_size)[torch.randperm(in_dim, generator=g)]
    q, zeros, scales = quantize(w, group_size, sym, g_idx)
    qweight, qzeros = pack_gptq(q, zeros)
    return {f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros, f"{prefix}.scales": scales,
            f"{prefix}.g_idx": g_idx}, reference(q, zeros, scales, g_idx)


def awq_auto_round(prefix: str, w: torch.Tensor, group_size: int) -> Packed:
    """auto-round's AWQ `WQLinear_GEMM.from_linear` (asymmetric)."""
    from auto_round.export.export_to_awq.utils import WQLinear_GEMM

    on_grid, scales, zeros = _grid(w, group_size, sym=False)
    layer = WQLinear_GEMM.from_linear(_linear(on_grid), 4, group_size, scales=scales.t().contiguous(),
                                      zeros=zeros.t().contiguous())
    return {f"{prefix}.qweight": layer.qweight, f"{prefix}.qzeros": layer.qzeros,
            f"{prefix}.scales": layer.scales}, on_grid


def fp8_block_transformers(prefix: str, w: torch.Tensor, block: tuple[int, int], scale_fmt: str | None = None) -> Packed:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize

    qc = SimpleNamespace(weight_block_size=block, scale_fmt=scale_fmt)
    packed = Fp8Quantize(SimpleNamespace(quantization_config=qc))._quantize_one(f"{prefix}.weight", w)
    assert f"{prefix}.weight_scale_inv" in packed, "block must divide the matrix (transformers passes it through)"
    ref = Fp8Dequantize(None)._dequantize_one(packed[f"{prefix}.weight"], packed[f"{prefix}.weight_scale_inv"],
                                              output_dtype=torch.float32)
    return packed, ref


def _ct_scheme(preset: str):
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme(preset, ["Linear"])


def fp8_channel_ct(prefix: str, w: torch.Tensor) -> Packed:
    from compressed_tensors.compressors.naive_quantized.base import (
        FloatQuantizationCompressor,
    )
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = _ct_scheme("FP8_DYNAMIC")
    scale, zp = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), scheme.weights)
    sd = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    ref = FloatQuantizationCompressor.decompress(dict(sd), scheme)["weight"].float()
    return {f"{prefix}.{k}": v for k, v in sd.items()}, ref


def _ct_fp4(preset: str, compressor, w: torch.Tensor, group: int, with_global: bool):
    """compressed-tensors' compress, then its own dequantize in fp32 (its decompress rounds to bf16)."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.utils.helpers import (
        calculate_qparams,
        generate_gparam,
    )

    scheme = _ct_scheme(preset)
    gs = generate_gparam(w.min(), w.max()) if with_global else None
    g = w.reshape(w.shape[0], -1, group)
    scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights, global_scale=gs)
    sd = {"weight": w, "weight_scale": scale} | ({"weight_global_scale": gs} if with_global else {})
    packed = compressor.compress(sd, scheme)
    m, n = packed["weight_packed"].shape
    codes = unpack_fp4_from_uint8(packed["weight_packed"], m, 2 * n, dtype=torch.float32)
    scale32 = compressor._decompress_scale(packed["weight_scale"], torch.float32)
    ref = dequantize(x_q=codes, scale=scale32, args=scheme.weights, global_scale=packed.get("weight_global_scale"),
                     dtype=torch.float32)
    return packed, ref


def nvfp4_ct(prefix: str, w: torch.Tensor) -> Packed:
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor

    packed, ref = _ct_fp4("NVFP4", NVFP4PackedCompressor, w, 16, with_global=True)
    return {f"{prefix}.{k}": v for k, v in packed.items()}, ref


def nvfp4_modelopt(prefix: str, w: torch.Tensor) -> Packed:
    """The same codes in ModelOpt's names: `weight` packed, `weight_scale_2` = 1 / weight_global_scale."""
    ct, ref = nvfp4_ct(prefix, w)
    return {f"{prefix}.weight": ct[f"{prefix}.weight_packed"], f"{prefix}.weight_scale": ct[f"{prefix}.weight_scale"],
            f"{prefix}.weight_scale_2": (1.0 / ct[f"{prefix}.weight_global_scale"]).reshape(())}, ref


def mxfp4_gpt_oss(name: str, w: torch.Tensor) -> Packed:
    """w [E, out, in] -> gpt-oss fused `{name}_blocks` [E, out, in/32, 16], `{name}_scales` [E, out, in/32]."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor

    E, out_dim, in_dim = w.shape
    blocks, scales, refs = [], [], []
    for e in range(E):
        packed, ref = _ct_fp4("MXFP4", MXFP4PackedCompressor, w[e], 32, with_global=False)
        blocks.append(packed["weight_packed"].view(out_dim, in_dim // 32, 16))
        scales.append(packed["weight_scale"])
        refs.append(ref)
    return {f"{name}_blocks": torch.stack(blocks), f"{name}_scales": torch.stack(scales)}, torch.stack(refs)


def ct_config(weights: dict, fmt: str) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}


def gptq_config(group_size: int, sym: bool, packing: str = "auto_round:auto_gptq") -> dict:
    return {"quant_method": "auto-round", "bits": 4, "group_size": group_size, "sym": sym, "packing_format": packing}


CONFIGS = {
    "gptq_act_order": lambda g, sym: {"quant_method": "gptq", "bits": 4, "group_size": g, "sym": sym,
                                      "desc_act": True},
    "awq": lambda g: {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True, "version": "gemm"},
    "fp8_block": lambda block, scale_fmt=None: {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                                "weight_block_size": list(block), "scale_fmt": scale_fmt},
    "fp8_channel": lambda: ct_config(_ct_scheme("FP8_DYNAMIC").weights.model_dump(mode="json"), "float-quantized"),
    "mxfp4": lambda: {"quant_method": "mxfp4"},
    "nvfp4_ct": lambda: NVFP4_CT,
    "nvfp4_modelopt": lambda: NVFP4_MODELOPT,
}


def fp8_block_deepseek_v4(prefix: str, w: torch.Tensor, block: tuple[int, int]) -> Packed:
    """transformers' Fp8Quantize with ue8m0 scales, stored as DeepSeek-V4's published checkpoints store them: the
    e8m0 scale under `.scale`."""
    packed, ref = fp8_block_transformers(prefix, w, block, "ue8m0")
    scale = packed[f"{prefix}.weight_scale_inv"]
    return {f"{prefix}.weight": packed[f"{prefix}.weight"], f"{prefix}.scale": scale}, ref


def fp4_deepseek_v4(prefix: str, w: torch.Tensor) -> Packed:
    """DeepSeek-V4's FP4 experts: compressed-tensors' MXFP4 codes (e2m1, low nibble first, an e8m0 scale per 32
    inputs) as `.weight` [out, in / 2] int8 and `.scale` [out, in / 32] e8m0; the reference is transformers' own
    Fp8Dequantize of those two tensors (its FP4 path), as its loader dequantizes them."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    packed, _ = _ct_fp4("MXFP4", MXFP4PackedCompressor, w, 32, with_global=False)
    weight = packed["weight_packed"].view(torch.int8)
    scale = packed["weight_scale"].view(torch.uint8).view(torch.float8_e8m0fnu)
    ref = Fp8Dequantize(None)._dequantize_one(weight, scale, output_dtype=torch.float32)
    return {f"{prefix}.weight": weight, f"{prefix}.scale": scale}, ref


CONFIGS["fp8_deepseek_v4"] = lambda block: {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                            "weight_block_size": list(block), "scale_fmt": "ue8m0",
                                            "expert_dtype": "fp4"}
