"""add_norm_linear (residual add, RMSNorm and the projection after it in one launch) against the composition it
replaces (add_rms_norm_ref / rms_norm_ref, then linear_ref), interpreted."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.norm_linear import MAX_ROWS, add_norm_linear, add_norm_linear_ref


@pytest.mark.parametrize("T, D, N, add, bias, round_normed", [(1, 64, 80, True, False, True),
                                                             (1, 48, 33, False, True, True),
                                                             (3, 200, 64, True, True, False)])
def test_add_norm_linear_equals_composition(T, D, N, add, bias, round_normed):
    g = torch.Generator().manual_seed(D + N)
    x = torch.randn(T, D, generator=g)
    y = torch.randn(T, D, generator=g) if add else None
    nw = torch.rand(D, generator=g) + 0.5
    w = torch.randn(N, D, generator=g) / D ** 0.5
    b = torch.randn(N, generator=g) if bias else None
    s, out = add_norm_linear(x, y, nw, 1e-6, w, b, round_normed)
    s_ref, out_ref = add_norm_linear_ref(x, y, nw, 1e-6, w, b, round_normed)
    assert torch.equal(s, s_ref)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)


def test_add_norm_linear_is_for_decode_rows():
    with pytest.raises(ValueError, match="decode GEMV"):
        add_norm_linear(torch.zeros(MAX_ROWS + 1, 16), None, torch.ones(16), 1e-6, torch.zeros(4, 16))
