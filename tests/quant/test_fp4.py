"""MXFP4 and NVFP4: pack with compressed-tensors' compressors, read back with ours (and transformers' gpt-oss reader)."""

import dataclasses

import pytest
import torch

from freetoken.quant import (
    QuantError,
    dequantize,
    parse_quant_config,
)

P = "model.layers.0.mlp.experts.5.up_proj"
NVFP4_CT = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group"}}}}
NVFP4_MODELOPT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}


def _ct_pack(preset, w, group, with_global):
    """compressed-tensors' packing of w under `preset` (its imports here: ~2 s of every test worker's collection)."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    compressor = {"MXFP4": MXFP4PackedCompressor, "NVFP4": NVFP4PackedCompressor}[preset]
    scheme = preset_name_to_scheme(preset, ["Linear"])
    gs = generate_gparam(w.min(), w.max()) if with_global else None
    g = w.reshape(w.shape[0], -1, group)
    scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights, global_scale=gs)
    sd = {"weight": w, "weight_scale": scale} | ({"weight_global_scale": gs} if with_global else {})
    packed = compressor.compress(sd, scheme)
    ref = compressor.decompress(dict(packed), scheme)["weight"]  # bf16
    return packed, ref


def _weights(seed, e, out_dim, in_dim):
    torch.manual_seed(seed)
    return torch.randn(e, out_dim, in_dim) * torch.logspace(-2, 1, in_dim)  # groups of very different ranges


def test_mxfp4_gpt_oss_layout_matches_compressed_tensors_and_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    experts, out_dim, in_dim = 3, 8, 96
    w = _weights(0, experts, out_dim, in_dim)
    blocks, scales, refs = [], [], []
    for e in range(experts):
        packed, ref = _ct_pack("MXFP4", w[e], 32, with_global=False)
        blocks.append(packed["weight_packed"].view(out_dim, in_dim // 32, 16))  # gpt-oss: [out, G, 16]
        scales.append(packed["weight_scale"])  # [out, G] uint8 exponents
        refs.append(ref)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    tensors = {f"{name}_blocks": torch.stack(blocks), f"{name}_scales": torch.stack(scales)}
    assert tensors[f"{name}_scales"].dtype == torch.uint8
    fmt = parse_quant_config({"quantization_config": {"quant_method": "mxfp4"}})
    # transformers' gpt-oss reader returns [E, in, out]
    hf = convert_moe_packed_tensors(tensors[f"{name}_blocks"], tensors[f"{name}_scales"], dtype=torch.float32)
    for e in range(experts):
        ours = dequantize(fmt, tensors, name, expert=e)
        assert torch.equal(ours, refs[e].to(torch.float32))
        assert torch.equal(ours, hf[e].t())
        assert ((ours - w[e]).abs() <= w[e].abs().reshape(out_dim, -1, 32).amax(-1).repeat_interleave(32, 1) / 2).all()


def _nvfp4_ct(seed=1, out_dim=16, in_dim=64):
    w = _weights(seed, 1, out_dim, in_dim)[0]
    packed, ref = _ct_pack("NVFP4", w, 16, with_global=True)
    return w, {f"{P}.{k}": v for k, v in packed.items()}, ref


def test_nvfp4_compressed_tensors_matches_and_global_scale_divides():
    w, tensors, ref = _nvfp4_ct()
    fmt = parse_quant_config(NVFP4_CT)
    assert fmt.global_scale == "divide"
    ours = dequantize(fmt, tensors, P)
    assert ref.dtype == torch.bfloat16 and torch.equal(ours.to(torch.bfloat16), ref)  # exact after ref's rounding
    assert (ours - w).abs().max() < 0.3 * w.abs().max()
    # the wrong direction: multiply by 448*6/amax instead of dividing
    wrong = dequantize(dataclasses.replace(fmt, global_scale="multiply"), tensors, P)
    gs = tensors[f"{P}.weight_global_scale"].item()
    assert gs == pytest.approx(448 * 6 / w.abs().max().item(), rel=1e-6)  # stored as the reciprocal of amax/2688
    assert torch.allclose(wrong, ours * gs * gs, rtol=1e-5)
    assert (wrong - w).abs().max() > 1000 * w.abs().max()


def test_nvfp4_modelopt_names_multiply():
    # the ModelOpt layout of the same codes: `weight` packed, `weight_scale_2` = 1 / weight_global_scale
    _, ct, ref = _nvfp4_ct(seed=2)
    gs = ct[f"{P}.weight_global_scale"]
    tensors = {f"{P}.weight": ct[f"{P}.weight_packed"], f"{P}.weight_scale": ct[f"{P}.weight_scale"],
               f"{P}.weight_scale_2": (1.0 / gs).reshape(())}
    fmt = parse_quant_config({"quantization_config": NVFP4_MODELOPT})
    assert fmt.global_scale == "multiply"
    assert torch.equal(dequantize(fmt, tensors, P, dtype=torch.bfloat16), ref)


def test_nvfp4_missing_global_scale_names_the_tensor():
    _, tensors, _ = _nvfp4_ct()
    del tensors[f"{P}.weight_global_scale"]
    with pytest.raises(QuantError, match=f"missing tensor '{P}.weight_global_scale'"):
        dequantize(parse_quant_config(NVFP4_CT), tensors, P)


def test_mxfp4_wrong_scale_shape_names_the_tensor():
    name = "model.layers.1.mlp.experts.down_proj"
    tensors = {f"{name}_blocks": torch.zeros(2, 4, 3, 16, dtype=torch.uint8),
               f"{name}_scales": torch.zeros(2, 4, 2, dtype=torch.uint8)}
    with pytest.raises(QuantError, match=f"{name}_scales"):
        dequantize(parse_quant_config({"quant_method": "mxfp4"}), tensors, name, expert=0)
