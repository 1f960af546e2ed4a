"""GPTQ / AWQ int4 packed here by hand, for what auto-round's packers (test_int4_auto_round.py) do not cover: act-order
g_idx (they take none), AutoGPTQ's own v1 layout, and weights quantized from a float tensor rather than given on
the grid. auto-gptq and gptqmodel need CUDA builds, so their packers cannot run here.

The packers transcribe the exporters' loops: AutoGPTQ `QuantLinear.pack` (qweight rows = 8 input elements, qzeros
columns = 8 outputs, nibble j at bits 4j, zeros stored minus one in the v1 `gptq` format) and AutoAWQ
`WQLinear_GEMM.from_linear` (both packed along the outputs, nibble i holds column 8c + [0,2,4,6,1,3,5,7][i], zeros
as is). They are loops over the definition, sharing no code with freetoken.quant.int4's vectorised unpacking.
"""

import pytest
import torch

from freetoken.quant import (
    QuantError,
    dequantize,
    parse_quant_config,
    stored_bytes,
)

P = "model.layers.2.mlp.experts.7.gate_proj"


def quantize(w, group_size, sym, g_idx):
    """w [out, in] -> int codes [in, out], zeros [G, out], fp16 scales [G, out], per the GPTQ/AWQ min-max grid."""
    out_dim = w.shape[0]
    groups = int(g_idx.max()) + 1
    scales = torch.empty(groups, out_dim, dtype=torch.float16)
    zeros = torch.empty(groups, out_dim, dtype=torch.int32)
    for g in range(groups):
        cols = w[:, g_idx == g]
        lo, hi = cols.amin(1).clamp(max=0), cols.amax(1).clamp(min=0)
        if sym:
            s, z = (2 * torch.maximum(lo.abs(), hi) / 15), torch.full((out_dim,), 8)
        else:
            s = (hi - lo) / 15
            z = torch.round(-lo / s).clamp(0, 15)
        scales[g], zeros[g] = s.half(), z.int()
    s_k, z_k = scales.float()[g_idx], zeros[g_idx]  # [in, out]
    q = torch.clamp(torch.round(w.t() / s_k) + z_k, 0, 15).int()
    return q, zeros, scales


def pack_gptq(q, zeros, zero_offset=1):
    in_dim, out_dim = q.shape
    qweight = torch.zeros(in_dim // 8, out_dim, dtype=torch.int64)
    for row in range(in_dim // 8):
        for j in range(8):
            qweight[row] |= q[row * 8 + j].to(torch.int64) << (4 * j)
    z = zeros - zero_offset
    qzeros = torch.zeros(zeros.shape[0], out_dim // 8, dtype=torch.int64)
    for col in range(out_dim // 8):
        for j in range(8):
            qzeros[:, col] |= (z[:, col * 8 + j].to(torch.int64) & 0xF) << (4 * j)
    to_i32 = lambda x: torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)
    return to_i32(qweight), to_i32(qzeros)


def pack_awq_cols(x, order_map=(0, 2, 4, 6, 1, 3, 5, 7)):
    packed = torch.zeros(x.shape[0], x.shape[1] // 8, dtype=torch.int64)
    for col in range(x.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= x[:, col * 8 + order_map[i]].to(torch.int64) << (i * 4)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def reference(q, zeros, scales, g_idx):
    return ((q - zeros[g_idx]).float() * scales.float()[g_idx]).t()  # [out, in]


CASES = [(32, True, False), (64, False, False), (128, True, True), (128, False, True), (-1, False, False)]


@pytest.mark.parametrize("group_size,sym,act_order", CASES)
def test_gptq_matches_hand_packed(group_size, sym, act_order):
    torch.manual_seed(group_size + sym)
    out_dim, in_dim = 24, 256
    w = torch.randn(out_dim, in_dim)
    gs = in_dim if group_size == -1 else group_size
    g_idx = torch.arange(in_dim, dtype=torch.int32) // gs
    if act_order:
        g_idx = g_idx[torch.randperm(in_dim)]  # desc_act: input k's group is where GPTQ visited it
    q, zeros, scales = quantize(w, group_size, sym, g_idx)
    qweight, qzeros = pack_gptq(q, zeros)
    tensors = {f"{P}.qweight": qweight, f"{P}.qzeros": qzeros, f"{P}.scales": scales}
    if act_order:
        tensors[f"{P}.g_idx"] = g_idx
    cfg = {"quant_method": "gptq", "bits": 4, "group_size": group_size, "sym": sym, "desc_act": act_order}
    ours = dequantize(parse_quant_config(cfg), tensors, P)
    assert torch.equal(ours, reference(q, zeros, scales, g_idx))
    assert (ours - w).abs().max() < 0.15 * w.abs().max()
    packed_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    assert stored_bytes(parse_quant_config(cfg), out_dim, in_dim) == packed_bytes


def test_gptq_v2_and_auto_round_zero_conventions():
    torch.manual_seed(3)
    w = torch.randn(16, 64)
    g_idx = torch.arange(64) // 32
    q, zeros, scales = quantize(w, 32, False, g_idx)
    ref = reference(q, zeros, scales, g_idx)
    for cfg, offset in [({"quant_method": "gptq", "checkpoint_format": "gptq_v2"}, 0),
                        ({"quant_method": "auto-round", "packing_format": "auto_round:auto_gptq"}, 1),
                        ({"quant_method": "auto-round", "packing_format": "auto_round:gptqmodel"}, 0)]:
        qweight, qzeros = pack_gptq(q, zeros, zero_offset=offset)
        tensors = {f"{P}.qweight": qweight, f"{P}.qzeros": qzeros, f"{P}.scales": scales}
        fmt = parse_quant_config({**cfg, "bits": 4, "group_size": 32, "sym": False})
        assert torch.equal(dequantize(fmt, tensors, P), ref), cfg


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_awq_matches_hand_packed(group_size):
    torch.manual_seed(group_size)
    out_dim, in_dim = 32, 256
    w = torch.randn(out_dim, in_dim)
    g_idx = torch.arange(in_dim) // group_size
    q, zeros, scales = quantize(w, group_size, False, g_idx)
    tensors = {f"{P}.qweight": pack_awq_cols(q), f"{P}.qzeros": pack_awq_cols(zeros), f"{P}.scales": scales}
    fmt = parse_quant_config({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": group_size,
                                                      "zero_point": True, "version": "gemm"}})
    ours = dequantize(fmt, tensors, P)
    assert torch.equal(ours, reference(q, zeros, scales, g_idx))
    # reading AWQ's interleaved nibbles in plain order must scramble columns: the order matters
    plain = {**tensors, f"{P}.qweight": pack_awq_cols(q, order_map=range(8))}
    assert not torch.equal(dequantize(fmt, plain, P), ours)


def test_group_size_not_dividing_the_dim_names_the_tensor():
    fmt = parse_quant_config({"quant_method": "gptq", "bits": 4, "group_size": 128})
    tensors = {f"{P}.qweight": torch.zeros(192 // 8, 16, dtype=torch.int32)}
    with pytest.raises(QuantError, match=f"{P}.qweight.*group_size 128 does not divide the input dim 192"):
        dequantize(fmt, tensors, P)


def test_missing_tensors_are_named():
    fmt = parse_quant_config({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True})
    tensors = {f"{P}.qweight": torch.zeros(8, 16, dtype=torch.int32)}
    with pytest.raises(QuantError, match=f"missing tensor '{P}.qzeros'"):
        dequantize(fmt, tensors, P)
    tensors |= {f"{P}.qzeros": torch.zeros(2, 2, dtype=torch.int32), f"{P}.scales": torch.ones(2, 16).half()}
    with pytest.raises(QuantError, match=f"'{P}.g_idx'.*desc_act"):
        dequantize(fmt, tensors, P)
    tensors[f"{P}.scales"] = torch.ones(3, 16).half()
    with pytest.raises(QuantError, match=rf"{P}.scales.*\(3, 16\), expected \(2, 16\)"):
        dequantize(parse_quant_config({"quant_method": "gptq", "group_size": 32}), tensors, P)
