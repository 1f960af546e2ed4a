"""FP8: pack with transformers' block quantizer (DeepSeek layout) and compressed-tensors' per-channel compressor."""

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize

from freetoken.quant import (
    QuantError,
    dequantize,
    parse_quant_config,
)

BLOCK_CFG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
P = "model.layers.0.mlp.experts.3.down_proj"


def _hf_block_pack(w, scale_fmt=None):
    qc = SimpleNamespace(weight_block_size=(128, 128), scale_fmt=scale_fmt)
    return Fp8Quantize(SimpleNamespace(quantization_config=qc))._quantize_one(f"{P}.weight", w)


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_block_fp8_matches_transformers(scale_fmt):
    torch.manual_seed(0)
    w = torch.randn(256, 384) * torch.linspace(0.01, 3.0, 384)  # blocks of very different ranges
    packed = _hf_block_pack(w, scale_fmt)
    assert packed[f"{P}.weight"].dtype == torch.float8_e4m3fn and packed[f"{P}.weight_scale_inv"].shape == (2, 3)
    ref = Fp8Dequantize(None)._dequantize_one(packed[f"{P}.weight"], packed[f"{P}.weight_scale_inv"],
                                              output_dtype=torch.float32)
    fmt = parse_quant_config({"quantization_config": {**BLOCK_CFG, "scale_fmt": scale_fmt}})
    ours = dequantize(fmt, packed, P)
    assert torch.equal(ours, ref)
    assert (ours - w).abs().max() < 0.07 * w.abs().max()  # and it is a quantization of w (e4m3: 3 mantissa bits)


def test_block_fp8_partial_edge_blocks():
    # out=200, in=130: the last block row/col is partial; scales computed here per the DeepSeek definition
    torch.manual_seed(1)
    w = torch.randn(200, 130)
    scale = torch.empty(2, 2)
    q = torch.empty_like(w)
    for i in range(2):
        for j in range(2):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            scale[i, j] = blk.abs().max() / 448.0
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = blk / scale[i, j]
    q8 = q.to(torch.float8_e4m3fn)
    ref = q8.float() * scale.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :130]
    ours = dequantize(parse_quant_config(BLOCK_CFG), {f"{P}.weight": q8, f"{P}.weight_scale_inv": scale}, P)
    assert torch.equal(ours, ref)


def test_channel_fp8_matches_compressed_tensors():
    from compressed_tensors.compressors.naive_quantized.base import (
        FloatQuantizationCompressor,
    )
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    torch.manual_seed(2)
    w = torch.randn(48, 64) * torch.linspace(0.1, 5, 48)[:, None]
    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    scale, zp = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), scheme.weights)
    sd = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    assert sd["weight"].dtype == torch.float8_e4m3fn
    ref = FloatQuantizationCompressor.decompress(dict(sd), scheme)["weight"]
    cfg = {"quant_method": "compressed-tensors", "format": "float-quantized",
           "config_groups": {"group_0": {"targets": ["Linear"], "weights": scheme.weights.model_dump(mode="json")}}}
    fmt = parse_quant_config(cfg)
    assert fmt.kind == "fp8_channel"
    ours = dequantize(fmt, {f"{P}.{k}": v for k, v in sd.items()}, P)
    assert torch.equal(ours.to(ref.dtype), ref)  # exact after the reference's own output rounding
    assert (ours - w).abs().max() < 0.07 * w.abs().max()


def test_missing_scale_names_the_tensor():
    w = torch.zeros(128, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(QuantError, match=f"{P}.weight_scale_inv"):
        dequantize(parse_quant_config(BLOCK_CFG), {f"{P}.weight": w}, P)


def test_wrong_scale_grid_names_the_tensor():
    tensors = {f"{P}.weight": torch.zeros(256, 128, dtype=torch.float8_e4m3fn), f"{P}.weight_scale_inv": torch.ones(1, 1)}
    with pytest.raises(QuantError, match=r"weight_scale_inv.*\(1, 1\).*\(2, 1\)"):
        dequantize(parse_quant_config(BLOCK_CFG), tensors, P)
