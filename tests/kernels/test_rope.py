"""apply_rope kernel vs its reference; the reference vs HF Llama's LlamaRotaryEmbedding + apply_rotary_pos_emb."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import apply_rope, apply_rope_ref
from tests.kernels.tolerances import assert_close


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,H,Dh,rotary_dim,first_pos", [(1, 4, 16, None, 0), (7, 3, 32, None, 100), (5, 2, 24, 16, 9)])
def test_kernel_matches_reference(dtype, T, H, Dh, rotary_dim, first_pos):
    g = torch.Generator().manual_seed(T + H + Dh)
    x = torch.randn(T, H, Dh, generator=g).to(dtype)
    pos = torch.arange(first_pos, first_pos + T, dtype=torch.int64)
    out = apply_rope(x, pos, 10000.0, rotary_dim)
    assert_close(out, apply_rope_ref(x, pos, 10000.0, rotary_dim))
    if rotary_dim is not None:  # dims past rotary_dim pass through bit for bit
        assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])


def test_strided_view_of_qkv_and_unsorted_positions():
    """q as a view of a fused qkv projection output: token stride > H * Dh."""
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(6, (4 + 2 * 2) * 16, generator=g)
    q = qkv[:, : 4 * 16].view(6, 4, 16)
    pos = torch.tensor([5, 0, 17, 3, 3, 1000], dtype=torch.int64)
    assert_close(apply_rope(q, pos, 1e6), apply_rope_ref(q.contiguous(), pos, 1e6))


def test_position_zero_is_identity():
    x = torch.randn(1, 2, 8)
    assert_close(apply_rope(x, torch.zeros(1, dtype=torch.int64), 10000.0), x)


def test_reference_matches_hf_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    T, H, Dh, theta = 9, 3, 32, 500000.0
    cfg = LlamaConfig(hidden_size=H * Dh, num_attention_heads=H, head_dim=Dh,
                      rope_parameters={"rope_type": "default", "rope_theta": theta})
    rotary = LlamaRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(T, H, Dh, generator=g)
    k = torch.randn(T, H, Dh, generator=g)
    pos = torch.arange(40, 40 + T, dtype=torch.int64)
    cos, sin = rotary(q, pos[None, :])  # [1, T, Dh]
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)  # [1, H, T, Dh]
    torch.testing.assert_close(apply_rope_ref(q, pos, theta), q_hf[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apply_rope_ref(k, pos, theta), k_hf[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_odd_rotary_dim_is_refused():
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rope(torch.randn(1, 1, 8), torch.zeros(1, dtype=torch.int64), 10000.0, 5)
