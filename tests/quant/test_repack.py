"""Checkpoint tensors written by each format's independent packer -> repack -> PackedWeight.to_float equals the
packer's own dequantized weight (freetoken.quant.dequantize is this same path)."""

import packers
import pytest
import torch

from freetoken.quant import QuantError, dequantize, parse_quant_config
from freetoken.quant.repack import repack, stack, take_rows

P = "model.layers.1.mlp.experts.2.gate_proj"


def _w(out_dim=64, in_dim=128, seed=0):
    torch.manual_seed(seed)
    return torch.randn(out_dim, in_dim) * torch.logspace(-1, 0.5, in_dim)  # groups of different ranges


def _check(fmt, tensors, ref, prefix=P, exact=True):
    packed = repack(fmt, tensors, prefix)
    got = packed.to_float(0)
    assert got.dtype == torch.float32
    if exact:
        assert torch.equal(got, ref)
    else:  # ModelOpt multiplies by amax/2688 where compressed-tensors divided by its reciprocal: last-bit rounding
        assert torch.allclose(got, ref, rtol=1e-6, atol=0)
    return packed


CASES = {
    "gptq v1 sym g32": (lambda: packers.gptq_config(32, True), lambda w: packers.gptq_auto_round(P, w, 32, True)),
    "gptq v1 sym g-1": (lambda: packers.gptq_config(-1, True), lambda w: packers.gptq_auto_round(P, w, -1, True)),
    "gptq v2 asym g64": (lambda: packers.gptq_config(64, False, "auto_round:gptqmodel"),
                         lambda w: packers.gptq_auto_round(P, w, 64, False, "auto_round:gptqmodel")),
    "gptq act-order asym g32": (lambda: packers.CONFIGS["gptq_act_order"](32, False),
                                lambda w: packers.gptq_act_order(P, w, 32, False)),
    "awq asym g32": (lambda: packers.CONFIGS["awq"](32), lambda w: packers.awq_auto_round(P, w, 32)),
    "awq asym g128": (lambda: packers.CONFIGS["awq"](128), lambda w: packers.awq_auto_round(P, w, 128)),
    "fp8 block fp32": (lambda: packers.CONFIGS["fp8_block"]((32, 64)),
                       lambda w: packers.fp8_block_transformers(P, w, (32, 64))),
    "fp8 block e8m0": (lambda: packers.CONFIGS["fp8_block"]((32, 32), "ue8m0"),
                       lambda w: packers.fp8_block_transformers(P, w, (32, 32), "ue8m0")),
    "fp8 channel": (packers.CONFIGS["fp8_channel"], lambda w: packers.fp8_channel_ct(P, w)),
    "nvfp4 compressed-tensors": (packers.CONFIGS["nvfp4_ct"], lambda w: packers.nvfp4_ct(P, w)),
    "nvfp4 modelopt": (packers.CONFIGS["nvfp4_modelopt"], lambda w: packers.nvfp4_modelopt(P, w)),
}


@pytest.mark.parametrize("case", CASES)
def test_repack_equals_the_packer(case):
    config, pack = CASES[case]
    w = _w()
    tensors, ref = pack(w)
    fmt = parse_quant_config(config())
    packed = _check(fmt, tensors, ref, exact=case != "nvfp4 modelopt")
    assert packed.num_slots == 1 and packed.shape == tuple(w.shape)
    assert (ref - w).abs().max() < 0.35 * w.abs().max()  # and the packer really quantized w


def test_repack_keeps_act_order_g_idx_and_drops_the_plain_one():
    fmt = parse_quant_config(packers.CONFIGS["gptq_act_order"](32, True))
    tensors, ref = packers.gptq_act_order(P, _w(seed=1), 32, True, seed=1)
    assert _check(fmt, tensors, ref).g_idx is not None
    plain = parse_quant_config(packers.gptq_config(32, True))
    tensors, ref = packers.gptq_auto_round(P, _w(seed=1), 32, True)
    tensors[f"{P}.g_idx"] = torch.arange(128, dtype=torch.int32) // 32  # what many GPTQ exporters store anyway
    assert _check(plain, tensors, ref).g_idx is None


def test_gptq_v1_wrapped_zero_reads_as_16():
    # AutoGPTQ stores zero - 1; a zero point of 0 wraps to nibble 15 and reads back as 16 (docs/quant.md)
    w = _w(16, 64, seed=2).abs()  # all >= 0: asymmetric zero points are 0
    in_dim = w.shape[1]
    g_idx = torch.arange(in_dim) // 32
    q, zeros, scales = packers.quantize(w, 32, False, g_idx)
    assert (zeros == 0).all()
    qweight, qzeros = packers.pack_gptq(q, zeros)
    tensors = {f"{P}.qweight": qweight, f"{P}.qzeros": qzeros, f"{P}.scales": scales}
    fmt = parse_quant_config({"quant_method": "gptq", "group_size": 32, "sym": False})
    packed = _check(fmt, tensors, packers.reference(q, zeros + 16, scales, g_idx))
    assert (packed.zeros == 16).all()


def test_mxfp4_fused_all_experts_and_gate_up_split():
    E, I, D = 3, 8, 64
    torch.manual_seed(3)
    w = torch.randn(E, 2 * I, D) * torch.logspace(-2, 1, D)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    tensors, refs = packers.mxfp4_gpt_oss(name, w)
    fmt = parse_quant_config(packers.CONFIGS["mxfp4"]())
    packed = repack(fmt, tensors, name)
    assert packed.num_slots == E and packed.shape == (2 * I, D)
    gate, up = take_rows(packed, 0, 2), take_rows(packed, 1, 2)
    for e in range(E):
        ours = dequantize(fmt, tensors, name, expert=e)
        assert torch.equal(packed.to_float(e), ours) and torch.equal(ours, refs[e])
        assert torch.equal(gate.to_float(e), ours[0::2]) and torch.equal(up.to_float(e), ours[1::2])
    assert gate.shape == (I, D) and gate.nbytes_per_slot * 2 == packed.nbytes_per_slot


def test_stack_per_expert_parts():
    fmt = parse_quant_config(packers.CONFIGS["gptq_act_order"](32, False))
    parts, refs = [], []
    for e in range(3):
        prefix = f"model.layers.0.mlp.experts.{e}.up_proj"
        tensors, ref = packers.gptq_act_order(prefix, _w(16, 64, seed=e), 32, False, seed=e)
        if e == 1:  # one expert without act order: stacked with its plain g_idx
            tensors.pop(f"{prefix}.g_idx")
            g = torch.arange(64) // 32
            q, zeros, scales = packers.quantize(_w(16, 64, seed=e), 32, False, g)
            tensors[f"{prefix}.qweight"], tensors[f"{prefix}.qzeros"] = packers.pack_gptq(q, zeros)
            tensors[f"{prefix}.scales"] = scales
            ref = packers.reference(q, zeros, scales, g)
        parts.append(repack(fmt if e != 1 else parse_quant_config(packers.gptq_config(32, False)), tensors, prefix))
        refs.append(ref)
    stacked = stack(parts)
    assert stacked.num_slots == 3 and stacked.g_idx.shape == (3, 64)
    for e in range(3):
        assert torch.equal(stacked.to_float(e), refs[e])
    fp8 = repack(parse_quant_config(packers.CONFIGS["fp8_channel"]()), packers.fp8_channel_ct(P, _w(16, 64))[0], P)
    with pytest.raises(QuantError, match="experts: part 1 has layout"):
        stack([parts[0], fp8])


def test_errors_name_the_tensor():
    fmt = parse_quant_config(packers.gptq_config(32, True))
    tensors, _ = packers.gptq_auto_round(P, _w(), 32, True)
    with pytest.raises(QuantError, match=f"missing tensor '{P}.scales'"):
        repack(fmt, {k: v for k, v in tensors.items() if not k.endswith("scales")}, P)
    wrong = parse_quant_config({**packers.gptq_config(128, True)})
    with pytest.raises(QuantError, match=rf"{P}.qzeros.*shape \(4, 8\), expected \(1, 8\)"):
        repack(wrong, tensors, P)
    odd = {f"{P}.qweight": torch.zeros(96 // 8, 64, dtype=torch.int32)}
    with pytest.raises(QuantError, match=f"{P}.qweight.*group_size 64 does not divide the input dim 96"):
        repack(parse_quant_config(packers.gptq_config(64, True)), odd, P)
    fp8 = parse_quant_config(packers.CONFIGS["fp8_block"]((32, 32)))
    tensors, _ = packers.fp8_block_transformers(P, _w(), (32, 32))
    with pytest.raises(QuantError, match=f"missing tensor '{P}.weight_scale_inv'"):
        repack(fp8, {f"{P}.weight": tensors[f"{P}.weight"]}, P)
    with pytest.raises(QuantError, match=rf"{P}.weight_scale_inv.*\(2, 4\), expected \(1, 1\)"):
        repack(parse_quant_config(packers.CONFIGS["fp8_block"]((64, 128))), tensors, P)
    nv = parse_quant_config(packers.CONFIGS["nvfp4_ct"]())
    tensors, _ = packers.nvfp4_ct(P, _w())
    del tensors[f"{P}.weight_global_scale"]
    with pytest.raises(QuantError, match=f"missing tensor '{P}.weight_global_scale'"):
        repack(nv, tensors, P)
