"""The CPU engine's torch kernels (kernels/host.py) vs the oracles: the slot-grouped expert FFN (slot -1 pairs,
repeated slots, biases, the clamped activation, packed experts) and SDPA attention (prefill at an offset, decode,
GQA; sinks and windows handed to the reference)."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import (attention_host, attention_ref, expert_ffn_host, expert_ffn_quant_host,
                               expert_ffn_quant_ref, expert_ffn_ref)
from freetoken.kernels.packed_random import random_packed

S, D, I, K = 5, 32, 48, 3


def _inputs(T, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).to(dtype)
    slot_ids = torch.randint(0, S, (T, K), generator=g, dtype=torch.int32)
    slot_ids[::3, 0] = -1  # some picks are computed by another lane
    weights = torch.rand(T, K, generator=g)
    w_gate_up = (torch.randn(S, 2 * I, D, generator=g) / D**0.5).to(dtype)
    w_down = (torch.randn(S, D, I, generator=g) / I**0.5).to(dtype)
    return g, x, slot_ids, weights, w_gate_up, w_down


@pytest.mark.parametrize("T", [1, 4, 37])
def test_host_equals_oracle(T):
    _, x, slot_ids, weights, w_gate_up, w_down = _inputs(T, seed=T)
    out = expert_ffn_host(x, slot_ids, weights, w_gate_up, w_down)
    ref = expert_ffn_ref(x, slot_ids, weights, w_gate_up, w_down)
    assert ref.abs().amax() > 0.1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_host_biases_and_clamped_activation():
    g, x, slot_ids, weights, w_gate_up, w_down = _inputs(9, seed=3)
    b_gate_up, b_down = torch.randn(S, 2 * I, generator=g) * 3, torch.randn(S, D, generator=g)
    opts = {"b_gate_up": b_gate_up, "b_down": b_down, "glu": "clamped", "alpha": 1.702, "limit": 1.5}
    out = expert_ffn_host(x, slot_ids, weights, w_gate_up, w_down, **opts)
    ref = expert_ffn_ref(x, slot_ids, weights, w_gate_up, w_down, **opts)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    plain = expert_ffn_host(x, slot_ids, weights, w_gate_up, w_down)
    assert (plain - out).abs().amax() > 0.1  # the options change the result, so the match above means something


def test_host_bf16_matches_oracle():
    _, x, slot_ids, weights, w_gate_up, w_down = _inputs(6, seed=5, dtype=torch.bfloat16)
    out = expert_ffn_host(x, slot_ids, weights, w_gate_up, w_down)
    ref = expert_ffn_ref(x, slot_ids, weights, w_gate_up, w_down)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_all_pairs_elsewhere_gives_zero():
    _, x, slot_ids, weights, w_gate_up, w_down = _inputs(4, seed=7)
    out = expert_ffn_host(x, torch.full_like(slot_ids, -1), weights, w_gate_up, w_down)
    assert out.abs().amax() == 0


@pytest.mark.parametrize("kind,layout", [("int4", {"group": 16}), ("fp8", {"block": (8, 16)}), ("fp4", {"group": 16})])
def test_quant_host_equals_oracle(kind, layout):
    g = torch.Generator().manual_seed(11)
    gate, up = (random_packed(kind, S, (I, D), g, **layout) for _ in range(2))
    down = random_packed(kind, S, (D, I), g, **(layout if kind != "fp8" else {"block": (16, 8)}))
    x = torch.randn(7, D, generator=g)
    slot_ids = torch.randint(0, S, (7, K), generator=g, dtype=torch.int32)
    slot_ids[1] = -1
    weights = torch.rand(7, K, generator=g)
    out = expert_ffn_quant_host(x, slot_ids, weights, gate, up, down)
    ref = expert_ffn_quant_ref(x, slot_ids, weights, gate, up, down)
    assert ref.abs().amax() > 0.1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().amax().item())


@pytest.mark.parametrize("T,start", [(1, 0), (1, 9), (6, 0), (5, 4)])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_attention_host_equals_reference(T, start, Hkv):
    g = torch.Generator().manual_seed(T * 10 + start + Hkv)
    H, Dh, S_max = 4, 8, 16
    q = torch.randn(T, H, Dh, generator=g)
    k, v = torch.randn(S_max, Hkv, Dh, generator=g), torch.randn(S_max, Hkv, Dh, generator=g)
    out = attention_host(q, k, v, start, Dh**-0.5)
    ref = attention_ref(q, k, v, start, Dh**-0.5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    if T > 1:  # the causal mask matters: without it the first query would see the later keys
        unmasked = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k[:start + T].repeat_interleave(H // Hkv, 1).transpose(0, 1),
            v[:start + T].repeat_interleave(H // Hkv, 1).transpose(0, 1), scale=Dh**-0.5).transpose(0, 1)
        assert (unmasked - ref).abs().amax() > 1e-3


def test_attention_host_sinks_and_window_follow_reference():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 2, 8, generator=g), torch.randn(10, 2, 8, generator=g), torch.randn(10, 2, 8, generator=g)
    sinks = torch.randn(2, generator=g)
    out = attention_host(q, k, v, 5, 0.3, sinks=sinks, window=4)
    torch.testing.assert_close(out, attention_ref(q, k, v, 5, 0.3, sinks=sinks, window=4))
