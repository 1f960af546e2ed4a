"""add_rms_norm (the residual add + RMSNorm in one launch) against the add and rms_norm_ref it replaces,
interpreted: the sum bit for bit in fp32 (one rounding, as torch's add), the norm as rms_norm's."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.rmsnorm import add_rms_norm, add_rms_norm_ref, rms_norm


@pytest.mark.parametrize("T, D, dtype, round_normed", [(1, 64, torch.float32, True), (3, 48, torch.float32, False),
                                                       (2, 64, torch.bfloat16, True)])
def test_add_rms_norm_equals_add_then_norm(T, D, dtype, round_normed):
    g = torch.Generator().manual_seed(T + D)
    x, y = (torch.randn(T, D, generator=g).to(dtype) for _ in range(2))
    w = (torch.rand(D, generator=g) + 0.5).to(dtype)
    s, out = add_rms_norm(x, y, w, 1e-6, round_normed)
    s_ref, out_ref = add_rms_norm_ref(x, y, w, 1e-6, round_normed)
    if dtype == torch.float32:
        assert torch.equal(s, s_ref) and torch.equal(s, x + y)
    else:  # Triton's interpreter rounds fp32 -> bf16 its own way (compiled kernels round to nearest even): 1 ulp
        torch.testing.assert_close(s, s_ref, rtol=2 ** -7, atol=0)
    tol = dict(rtol=0, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out, out_ref, **tol)
    assert torch.equal(out, rms_norm(s, w, 1e-6, round_normed))  # the same arithmetic as the unfused kernel
