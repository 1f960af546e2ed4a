"""The expert FFN's gpt-oss options (per-slot biases, the clamped gated activation) in expert_ffn and
expert_ffn_quant vs their references; the reference vs transformers' GptOssExperts (_apply_gate and forward)."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import expert_ffn, expert_ffn_quant, expert_ffn_quant_ref, expert_ffn_ref
from freetoken.kernels.expert_ffn import glu_ref
from freetoken.kernels.expert_ffn_quant import dequantize_experts
from freetoken.kernels.packed_random import random_packed
from tests.kernels.tolerances import assert_close

S, D, I, K = 5, 64, 32, 2
ALPHA, LIMIT = 1.702, 0.6  # a tight clamp: a fair share of gate and up values sit beyond it
PATHS = {"decode": 3, "prefill": 20}  # 6 pairs one per block; 40 pairs grouped by slot


def _inputs(T, g, dtype=torch.float32):
    x = torch.randn(T, D, generator=g).to(dtype)
    slot_ids = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32)
    slot_ids[::3, 1] = -1  # some picks not resident
    return x, slot_ids, torch.rand(T, K, generator=g)


def _biases(g, dtype=torch.float32):
    return (torch.randn(S, 2 * I, generator=g) * 0.3).to(dtype), (torch.randn(S, D, generator=g) * 0.3).to(dtype)


def _dense(g, dtype=torch.float32):
    return (torch.randn(S, 2 * I, D, generator=g) * 0.15).to(dtype), (torch.randn(S, D, I, generator=g) * 0.15).to(dtype)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("glu", ["clamped", "silu", "silu_limit"])
def test_expert_ffn_options_match_reference(path, bias, glu):
    g = torch.Generator().manual_seed(1)
    w_gu, w_d = _dense(g)
    b_gu, b_d = _biases(g) if bias else (None, None)
    x, slot_ids, weights = _inputs(PATHS[path], g)
    opts = dict(b_gate_up=b_gu, b_down=b_d, glu=glu, alpha=ALPHA, limit=LIMIT)
    ref = expert_ffn_ref(x, slot_ids, weights, w_gu, w_d, **opts)
    assert_close(expert_ffn(x, slot_ids, weights, w_gu, w_d, **opts), ref)
    if bias or glu != "silu":  # the option changed the answer
        assert (ref - expert_ffn_ref(x, slot_ids, weights, w_gu, w_d)).abs().max() > 1e-2


def test_expert_ffn_options_bf16():
    g = torch.Generator().manual_seed(2)
    w_gu, w_d = _dense(g, torch.bfloat16)
    b_gu, b_d = _biases(g, torch.bfloat16)
    x, slot_ids, weights = _inputs(20, g, torch.bfloat16)
    opts = dict(b_gate_up=b_gu, b_down=b_d, glu="clamped", alpha=ALPHA, limit=LIMIT)
    assert_close(expert_ffn(x, slot_ids, weights, w_gu, w_d, **opts), expert_ffn_ref(x, slot_ids, weights, w_gu, w_d, **opts))


@pytest.mark.parametrize("path", PATHS)
def test_expert_ffn_quant_mxfp4_with_options_matches_reference(path):
    g = torch.Generator().manual_seed(3)
    gate, up, down = (random_packed("fp4", S, shape, g, group=32) for shape in ((I, D), (I, D), (D, I)))
    b_gu, b_d = _biases(g)
    x, slot_ids, weights = _inputs(PATHS[path], g)
    opts = dict(b_gate_up=b_gu, b_down=b_d, glu="clamped", alpha=ALPHA, limit=LIMIT)
    out = expert_ffn_quant(x, slot_ids, weights, gate, up, down, **opts)
    ref = expert_ffn_quant_ref(x, slot_ids, weights, gate, up, down, **opts)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().amax().item())
    # the quantized reference is the dense one on the dequantized experts
    torch.testing.assert_close(ref, expert_ffn_ref(x, slot_ids, weights, *dequantize_experts(gate, up, down), **opts))


def _hf_experts(w_gu, w_d, b_gu, b_d):
    """transformers' GptOssExperts holding our slots: gate_up [S, D, 2I] with gate / up columns interleaved."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    cfg = GptOssConfig(hidden_size=D, intermediate_size=I, num_local_experts=S, swiglu_alpha=ALPHA,
                       swiglu_limit=LIMIT, num_hidden_layers=1, num_attention_heads=4, head_dim=16)
    hf = GptOssExperts(cfg)
    interleave = torch.stack([w_gu[:, :I], w_gu[:, I:]], dim=2).reshape(S, 2 * I, D)  # rows g0 u0 g1 u1 ...
    with torch.no_grad():
        hf.gate_up_proj.copy_(interleave.transpose(1, 2))
        hf.gate_up_proj_bias.copy_(torch.stack([b_gu[:, :I], b_gu[:, I:]], dim=2).reshape(S, 2 * I))
        hf.down_proj.copy_(w_d.transpose(1, 2))
        hf.down_proj_bias.copy_(b_d)
    return hf


def test_glu_ref_matches_hf_apply_gate():
    g = torch.Generator().manual_seed(4)
    hf = _hf_experts(*_dense(g), *_biases(g))
    gate_up = torch.randn(7, 2 * I, generator=g)  # HF's interleaved layout
    assert (gate_up.abs() > LIMIT).float().mean() > 0.3
    torch.testing.assert_close(glu_ref(gate_up[:, 0::2], gate_up[:, 1::2], "clamped", ALPHA, LIMIT),
                               hf._apply_gate(gate_up), rtol=0, atol=0)


def test_reference_matches_hf_gpt_oss_experts_forward():
    g = torch.Generator().manual_seed(5)
    w_gu, w_d = _dense(g)
    b_gu, b_d = _biases(g)
    hf = _hf_experts(w_gu, w_d, b_gu, b_d)
    T = 6
    x = torch.randn(T, D, generator=g)
    slots = torch.stack([torch.randperm(S, generator=g)[:K] for _ in range(T)]).to(torch.int32)  # distinct picks
    weights = torch.softmax(torch.randn(T, K, generator=g), -1)
    with torch.no_grad():
        expected = hf(x, slots.long(), weights)
    got = expert_ffn_ref(x, slots, weights, w_gu, w_d, b_gate_up=b_gu, b_down=b_d, glu="clamped", alpha=ALPHA,
                         limit=LIMIT)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bad_options_are_refused():
    g = torch.Generator().manual_seed(6)
    w_gu, w_d = _dense(g)
    b_gu, b_d = _biases(g)
    x, slot_ids, weights = _inputs(3, g)
    with pytest.raises(ValueError, match="glu: unknown 'gelu'; valid: silu, clamped, silu_limit"):
        expert_ffn(x, slot_ids, weights, w_gu, w_d, glu="gelu")
    with pytest.raises(ValueError, match="b_gate_up"):
        expert_ffn(x, slot_ids, weights, w_gu, w_d, b_gate_up=b_gu[:, :I])
    with pytest.raises(ValueError, match="b_down"):
        expert_ffn(x, slot_ids, weights, w_gu, w_d, b_down=b_d[:2])
