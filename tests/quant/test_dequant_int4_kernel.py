"""The Triton int4 GEMM (interpreter on CPU) vs the torch dequantizer, on GPTQ tensors packed as in test_int4."""

import pytest
import torch
from test_int4 import pack_awq_cols, pack_gptq, quantize

from freetoken.kernels.dequant_int4 import int4_linear, int4_linear_ref


def _packed(out_dim, in_dim, group_size, act_order, seed=0):
    torch.manual_seed(seed)
    w = torch.randn(out_dim, in_dim)
    gs = in_dim if group_size == -1 else group_size
    g_idx = (torch.arange(in_dim, dtype=torch.int32) // gs)
    if act_order:
        g_idx = g_idx[torch.randperm(in_dim)].contiguous()
    q, zeros, scales = quantize(w, group_size, False, g_idx)
    qweight, qzeros = pack_gptq(q, zeros)
    return w, qweight, qzeros, scales, g_idx if act_order else None


@pytest.mark.parametrize("T,out_dim,in_dim,group_size,act_order", [
    (1, 72, 128, 32, False),   # N not a multiple of BLOCK_N
    (5, 64, 96, 32, True),     # K not a multiple of BLOCK_K, act-order groups
    (3, 16, 128, -1, False),   # one group per output channel
])
def test_int4_linear_matches_torch_dequant(T, out_dim, in_dim, group_size, act_order):
    w, qweight, qzeros, scales, g_idx = _packed(out_dim, in_dim, group_size, act_order)
    x = torch.randn(T, in_dim)
    ours = int4_linear(x, qweight, qzeros, scales, group_size, g_idx=g_idx)
    ref = int4_linear_ref(x, qweight, qzeros, scales, group_size, g_idx=g_idx)
    assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert (ours - x @ w.t()).abs().max() > 1e-3  # it is the quantized weight, not the original


@pytest.mark.parametrize("T,out_dim,in_dim,group_size", [(1, 72, 128, 32), (4, 64, 96, 32)])
def test_int4_linear_awq_matches_torch_dequant(T, out_dim, in_dim, group_size):
    torch.manual_seed(T)
    w = torch.randn(out_dim, in_dim)
    g_idx = torch.arange(in_dim) // group_size
    q, zeros, scales = quantize(w, group_size, False, g_idx)
    qweight, qzeros = pack_awq_cols(q), pack_awq_cols(zeros)
    x = torch.randn(T, in_dim)
    ours = int4_linear(x, qweight, qzeros, scales, group_size, zero_offset=0, layout="awq")
    ref = int4_linear_ref(x, qweight, qzeros, scales, group_size, zero_offset=0, layout="awq")
    assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    # the same codes read in GPTQ's plain nibble order give another product
    plain = int4_linear_ref(x, pack_awq_cols(q, range(8)), pack_awq_cols(zeros, range(8)), scales, group_size,
                            zero_offset=0, layout="awq")
    assert (ours - plain).abs().max() > 0.1 * ref.abs().max()


def test_int4_linear_bf16_input():
    _, qweight, qzeros, scales, _ = _packed(64, 64, 32, False, seed=1)
    x = torch.randn(2, 64).bfloat16()
    ours = int4_linear(x, qweight, qzeros, scales, 32)
    ref = int4_linear_ref(x, qweight, qzeros, scales, 32)
    assert ours.dtype == torch.bfloat16
    assert torch.allclose(ours.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.float().abs().max().item())


def test_int4_linear_bad_arguments_are_named():
    _, qweight, qzeros, scales, _ = _packed(16, 64, 32, False)
    with pytest.raises(ValueError, match="scales: shape"):
        int4_linear(torch.randn(1, 64), qweight, qzeros, scales[:1], 32)
    with pytest.raises(ValueError, match="group_size: 48"):
        int4_linear(torch.randn(1, 64), qweight, qzeros, scales, 48)
    with pytest.raises(ValueError, match="layout: 'exl2'"):
        int4_linear(torch.randn(1, 64), qweight, qzeros, scales, 32, layout="exl2")
