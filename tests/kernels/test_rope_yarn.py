"""Scaled rope: yarn_inv_freq vs transformers' YaRN (inv_freq and attention factor) and gpt-oss's rotary embedding +
apply_rotary_pos_emb; the kernel with explicit frequencies and a cos/sin scale vs the reference."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import apply_rope, apply_rope_ref
from freetoken.kernels.rope import yarn_inv_freq
from tests.kernels.tolerances import assert_close

YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096, "rope_theta": 150000.0}


def _gpt_oss_rotary(params: dict, Dh: int):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    cfg = GptOssConfig(hidden_size=4 * Dh, num_attention_heads=4, head_dim=Dh, rope_parameters=dict(params),
                       num_hidden_layers=1, num_local_experts=2, num_experts_per_tok=1)
    return GptOssRotaryEmbedding(cfg)


@pytest.mark.parametrize("params", [YARN, YARN | {"truncate": True, "factor": 4.0, "original_max_position_embeddings": 16},
                                    YARN | {"attention_factor": 0.8, "beta_fast": 8.0}])
def test_yarn_matches_hf(params):
    Dh = 64
    rotary = _gpt_oss_rotary(params, Dh)
    inv_freq, scale = yarn_inv_freq(params["rope_theta"], Dh, params["factor"],
                                    params["original_max_position_embeddings"], params["beta_fast"],
                                    params["beta_slow"], params["truncate"], params.get("attention_factor"))
    torch.testing.assert_close(inv_freq, rotary.inv_freq, rtol=1e-6, atol=0)
    assert scale == pytest.approx(rotary.attention_scaling, rel=1e-12)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(9, 3, Dh, generator=g), torch.randn(9, 3, Dh, generator=g)
    pos = torch.tensor([0, 1, 5, 17, 300, 4095, 4096, 9000, 70000])
    from transformers.models.gpt_oss.modeling_gpt_oss import apply_rotary_pos_emb

    cos, sin = rotary(q, pos[None, :])  # [1, T, Dh / 2]
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    for x, want in ((q, q_hf), (k, k_hf)):
        torch.testing.assert_close(apply_rope_ref(x, pos, 0.0, inv_freq=inv_freq, scale=scale),
                                   want[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_with_inv_freq_and_scale_matches_reference(dtype):
    inv_freq, scale = yarn_inv_freq(150000.0, 16, 32.0, 4096)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 4, 16, generator=g).to(dtype)
    pos = torch.tensor([0, 3, 40, 4000, 5000, 120000])
    out = apply_rope(x, pos, 150000.0, inv_freq=inv_freq, scale=scale)
    assert_close(out, apply_rope_ref(x, pos, 150000.0, inv_freq=inv_freq, scale=scale))
    assert_close(apply_rope(x[:1], pos[:1], 1.0, inv_freq=inv_freq, scale=scale), x[:1] * scale)  # position 0: scaled


def test_wrong_inv_freq_is_refused():
    x = torch.randn(2, 1, 16)
    with pytest.raises(ValueError, match="inv_freq"):
        apply_rope(x, torch.zeros(2, dtype=torch.int64), 1e4, inv_freq=torch.ones(4))
    with pytest.raises(ValueError, match="yarn"):
        yarn_inv_freq(1e4, 16, 0.0, 4096)
