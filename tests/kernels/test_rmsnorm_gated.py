"""Gated RMSNorm (Gated DeltaNet's output norm) vs its reference and HF's Qwen3NextRMSNormGated."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.rmsnorm_gated import rms_norm_gated, rms_norm_gated_ref
from tests.kernels.tolerances import assert_close


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,D", [(1, 8), (5, 24)])
def test_kernel_matches_reference(dtype, N, D):
    g = torch.Generator().manual_seed(N + D)
    x, z = torch.randn(N, D, generator=g).to(dtype), torch.randn(N, D, generator=g).to(dtype)
    w = (torch.rand(D, generator=g) + 0.5).to(dtype)
    assert_close(rms_norm_gated(x, z, w, 1e-6), rms_norm_gated_ref(x, z, w, 1e-6))


def test_reference_is_hf():
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

    g = torch.Generator().manual_seed(3)
    x, z, w = torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g), torch.rand(16, generator=g) + 0.5
    hf = Qwen3NextRMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(w)
        torch.testing.assert_close(rms_norm_gated_ref(x, z, w, 1e-6), hf(x, z), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(rms_norm_gated(x, z, w, 1e-6), hf(x, z), rtol=1e-5, atol=1e-5)
