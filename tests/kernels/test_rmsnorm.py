"""rms_norm kernel vs its reference; the reference vs torch.nn.functional.rms_norm and HF's Qwen3MoeRMSNorm."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import rms_norm, rms_norm_ref
from tests.kernels.tolerances import assert_close


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,D", [(1, 64), (7, 40), (3, 33)])
def test_kernel_matches_reference(dtype, T, D):
    g = torch.Generator().manual_seed(T * 100 + D)
    x = (torch.randn(T, D, generator=g) * 3).to(dtype)
    w = (torch.rand(D, generator=g) + 0.5).to(dtype)
    assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6))


def test_per_head_norm_on_strided_rows():
    """Qwen3 q/k norm: [T*H, Dh] rows; rows of a wider buffer (row stride > D) are read in place."""
    g = torch.Generator().manual_seed(1)
    buf = torch.randn(6, 48, generator=g)
    x = buf[:, 8:24]  # [6, 16], stride(0) = 48
    w = torch.rand(16, generator=g) + 0.5
    out = rms_norm(x, w, 1e-5)
    assert out.is_contiguous()
    assert_close(out, rms_norm_ref(x.contiguous(), w, 1e-5))


def test_reference_matches_torch_and_hf():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 24, generator=g)
    w = torch.rand(24, generator=g) + 0.5
    torch.testing.assert_close(
        rms_norm_ref(x, w, 1e-6), torch.nn.functional.rms_norm(x, (24,), w, 1e-6), rtol=1e-6, atol=1e-6
    )
    hf = Qwen3MoeRMSNorm(24, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        hf.weight.copy_(w.bfloat16())
        xb = x.bfloat16()
        torch.testing.assert_close(rms_norm_ref(xb, hf.weight, 1e-6), hf(xb), rtol=0, atol=0)


def test_bad_weight_shape_is_named():
    with pytest.raises(ValueError, match="weight"):
        rms_norm(torch.randn(2, 8), torch.randn(9), 1e-6)


def test_unit_offset_order_is_qwen3_next():
    """round_normed=False with the weight stored as 1 + w (fp32): HF's Qwen3NextRMSNorm bit for bit in bf16, where
    the Llama order (round, then weight) differs."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

    g = torch.Generator().manual_seed(4)
    x = (torch.randn(7, 40, generator=g) * 3).bfloat16()
    hf = Qwen3NextRMSNorm(40, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        hf.weight.copy_((torch.randn(40, generator=g) * 0.5).bfloat16())
        want = hf(x)
    w = hf.weight.float() + 1.0
    torch.testing.assert_close(rms_norm_ref(x, w, 1e-6, round_normed=False), want, rtol=0, atol=0)
    assert_close(rms_norm(x, w, 1e-6, round_normed=False), want)
    assert (rms_norm_ref(x, w, 1e-6) != want).any()  # the other order is a different rounding
