"""Host projections: dense rows in their own dtype and kept-packed matrices read as stored, against torch in fp32
on the same (dequantized) weights; a few rows (decode) and many (prefill), bias and strided inputs."""

from __future__ import annotations

import pytest
import torch

from freetoken.host import kernels as hk
from freetoken.host import ops
from tests.host import packed_random as pr
from tests.host.conftest import native_or_skip


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T", [1, 3, 5])
def test_dense_rows_equal_torch(T, dtype, generic):
    native_or_skip()
    gen = torch.Generator().manual_seed(T)
    w = (torch.randn(200, 256, generator=gen) / 8).to(dtype)
    x = torch.randn(T, 256, generator=gen).to(dtype)
    b = torch.randn(200, generator=gen).to(dtype)
    ref = x.float() @ w.float().T + b.float()
    out = hk.linear(x, w, b, generic=generic)
    assert out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]  # the output's rounding
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() < tol


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("K", [7, 16, 100, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp32_and_fp16_rows_of_any_length_equal_torch(dtype, K, generic):
    """Path B's fp32 dot products in vector chains (the 64-wide body, the 16-wide one, the tail: masked, or
    scalar), fp16 rows converted eight at a time and the rest one by one; fp32 activations, so the reference is
    exact on the same weights."""
    native_or_skip()
    gen = torch.Generator().manual_seed(K)
    w, x = torch.randn(33, K, generator=gen).to(dtype), torch.randn(3, K, generator=gen)
    ref = x.double() @ w.double().T
    out = hk.linear(x, w, generic=generic)
    assert ((out.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6
    assert torch.equal(hk.linear(x[1:2], w, generic=generic), out[1:2])  # a row's dots do not depend on the others


@pytest.mark.parametrize("fmt", pr.FORMATS)
@pytest.mark.parametrize("T", [1, 6])
def test_packed_rows_equal_torch_on_the_dequantized_weights(fmt, T):
    native_or_skip()
    gen = torch.Generator().manual_seed(7)
    w = pr.make(fmt, 1, 160, 256, gen).select(0)
    x = torch.randn(T, 256, generator=gen)
    ref = x @ w.to_float(0).T
    for generic in (False, True):
        out = hk.linear(x, w, generic=generic)
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-5


def test_strided_input_rows_and_the_op_dispatch():
    native_or_skip()
    gen = torch.Generator().manual_seed(8)
    w = torch.randn(64, 96, generator=gen).bfloat16()
    x = torch.randn(4, 2 * 96, generator=gen).bfloat16()[:, ::2]  # not contiguous
    ref = x.float() @ w.float().T
    assert ((hk.linear(x, w).float() - ref).abs().max() / ref.abs().max()).item() < 8e-3
    many = torch.randn(40, 96, generator=gen).bfloat16()  # beyond NATIVE_ROWS: torch's GEMM in bf16
    ref = many.float() @ w.float().T
    assert ((ops.linear(many, w).float() - ref).abs().max() / ref.abs().max()).item() < 8e-3
    packed = pr.make("int4-g32", 1, 64, 96 + 32, gen).select(0)  # a packed projection, any row count
    xp = torch.randn(40, 128, generator=gen)
    assert ((ops.linear(xp, packed) - xp @ packed.to_float(0).T).abs().max()).item() < 1e-4


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_fp32_fallback_over_weight_blocks_equals_one_fp32_product(x_dtype, monkeypatch):
    """Where torch's half GEMM is slow, a bf16 weight is converted FP32_BLOCK_ROWS rows at a time: the result (bias
    included, the last block ragged) is one fp32 F.linear's, rounded to x's dtype."""
    import torch.nn.functional as F

    from freetoken.host import grouped

    monkeypatch.setattr(grouped, "half_gemm_fast", lambda: False)
    monkeypatch.setattr(ops, "FP32_BLOCK_ROWS", 48)
    gen = torch.Generator().manual_seed(9)
    w, bias = torch.randn(130, 64, generator=gen).bfloat16(), torch.randn(130, generator=gen).bfloat16()
    x = torch.randn(ops.NATIVE_ROWS + 7, 64, generator=gen).to(x_dtype)
    want = F.linear(x.float(), w.float(), bias.float()).to(x_dtype)
    got = ops.linear(x, w, bias)
    assert got.dtype == x_dtype and torch.equal(got, want)
