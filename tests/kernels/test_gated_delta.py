"""The gated delta rule: chunked prefill and recurrent decode kernels vs HF's torch_chunk_gated_delta_rule and
torch_recurrent_gated_delta_rule (l2-normalised q / k, beta and g gates, grouped value heads)."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.gated_delta_chunk import gated_delta_chunk, gated_delta_chunk_ref
from freetoken.kernels.gated_delta_step import gated_delta_step, gated_delta_step_ref

HK, HV, DK, DV = 1, 2, 16, 8  # two value heads share one key head


def _inputs(T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(T, HK, DK, generator=g), torch.randn(T, HK, DK, generator=g)
    v = torch.randn(T, HV, DV, generator=g)
    gate = -torch.nn.functional.softplus(torch.randn(T, HV, generator=g))  # log decay < 0
    beta = torch.sigmoid(torch.randn(T, HV, generator=g))
    return q, k, v, gate, beta


def _hf(fn, q, k, v, gate, beta, state, **kw):
    """HF's functions take [B, T, H, D] and return (out, final state)."""
    out, final = fn(q[None], k[None], v[None], gate[None], beta[None], initial_state=state[None],
                    output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)
    return out[0], final[0]


def _close(a, b):
    torch.testing.assert_close(a.float(), b.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T", [5, 21])
def test_chunked_prefill_is_hf_chunk_rule(T):
    """Lengths not a multiple of the chunk (16 in the kernel, 64 in HF), from a non-zero state."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    q, k, v, gate, beta = _inputs(T, T)
    start = torch.randn(HV, DK, DV, generator=torch.Generator().manual_seed(9)) * 0.3
    want, want_state = _hf(torch_chunk_gated_delta_rule, q, k, v, gate, beta, start.clone())
    for fn in (gated_delta_chunk, gated_delta_chunk_ref):
        state = start.clone()
        _close(fn(q, k, v, gate, beta, state), want)
        _close(state, want_state)


@pytest.mark.parametrize("fn, T", [(gated_delta_chunk_ref, 200), (gated_delta_chunk, 50)],
                         ids=["reference-4-chunks-of-64", "kernel-4-chunks-of-16"])
def test_prefill_over_several_chunks_is_hf_chunk_rule(fn, T):
    """Enough tokens for three full chunks and a partial one: the state carried from chunk to chunk (its decay by the
    chunk's last cumulative gate, c_last) reaches every later chunk's output and the final state."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    q, k, v, gate, beta = _inputs(T, 3)
    start = torch.randn(HV, DK, DV, generator=torch.Generator().manual_seed(4)) * 0.3
    want, want_state = _hf(torch_chunk_gated_delta_rule, q, k, v, gate, beta, start.clone())
    state = start.clone()
    _close(fn(q, k, v, gate, beta, state), want)
    _close(state, want_state)


def test_decode_steps_continue_a_prefill_state():
    """Prefill 18 tokens (chunked), then 3 steps one token each: = HF's recurrent rule over all 21 tokens."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    q, k, v, gate, beta = _inputs(21, 2)
    want, want_state = _hf(torch_recurrent_gated_delta_rule, q, k, v, gate, beta, torch.zeros(HV, DK, DV))
    for prefill, step in ((gated_delta_chunk, gated_delta_step), (gated_delta_chunk_ref, gated_delta_step_ref)):
        state = torch.zeros(HV, DK, DV)
        outs = [prefill(q[:18], k[:18], v[:18], gate[:18], beta[:18], state)]
        for t in range(18, 21):
            sl = slice(t, t + 1)
            outs.append(step(q[sl], k[sl], v[sl], gate[sl], beta[sl], state))
        _close(torch.cat(outs), want)
        _close(state, want_state)


def test_step_over_several_tokens_is_hf_recurrent_rule():
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    q, k, v, gate, beta = _inputs(4, 11)
    start = torch.randn(HV, DK, DV, generator=torch.Generator().manual_seed(1)) * 0.3
    want, want_state = _hf(torch_recurrent_gated_delta_rule, q, k, v, gate, beta, start.clone())
    for fn in (gated_delta_step, gated_delta_step_ref):
        state = start.clone()
        _close(fn(q, k, v, gate, beta, state), want)
        _close(state, want_state)


def test_bad_state_is_named():
    q, k, v, gate, beta = _inputs(2, 0)
    with pytest.raises(ValueError, match="state"):
        gated_delta_step(q, k, v, gate, beta, torch.zeros(HV, DK, DV + 1))


def test_value_columns_over_several_blocks_and_odd_key_dim():
    """Dv = 80: several value-column programs per head (5 of 16 for fp32 inputs); Dk = 20 pads to 32 (masked). Chunk
    and step kernels against the references from one non-zero state."""
    g = torch.Generator().manual_seed(7)
    T, Dk, Dv = 18, 20, 80
    q, k = torch.randn(T, 1, Dk, generator=g), torch.randn(T, 1, Dk, generator=g)
    v = torch.randn(T, 2, Dv, generator=g)
    gate = -torch.nn.functional.softplus(torch.randn(T, 2, generator=g))
    beta = torch.sigmoid(torch.randn(T, 2, generator=g))
    start = torch.randn(2, Dk, Dv, generator=g) * 0.3
    for kernel, ref, sl in ((gated_delta_chunk, gated_delta_chunk_ref, slice(0, T)),
                            (gated_delta_step, gated_delta_step_ref, slice(0, 2))):
        ours, theirs = start.clone(), start.clone()
        args = (q[sl], k[sl], v[sl], gate[sl], beta[sl])
        _close(kernel(*args, ours), ref(*args, theirs))
        _close(ours, theirs)


def test_a_decode_batch_steps_each_sequence_against_its_own_state():
    """state [B, Hv, Dk, Dv] and one token per sequence: kernel and reference each equal HF's recurrent rule run on
    that sequence alone, from its own state."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    B = 3
    q, k, v, gate, beta = _inputs(B, 12)
    starts = torch.randn(B, HV, DK, DV, generator=torch.Generator().manual_seed(2)) * 0.3
    want = [_hf(torch_recurrent_gated_delta_rule, q[b:b + 1], k[b:b + 1], v[b:b + 1], gate[b:b + 1],
                beta[b:b + 1], starts[b].clone()) for b in range(B)]
    for fn in (gated_delta_step, gated_delta_step_ref):
        states = starts.clone()
        out = fn(q, k, v, gate, beta, states)
        for b in range(B):
            _close(out[b:b + 1], want[b][0])
            _close(states[b], want[b][1])
    with pytest.raises(ValueError, match="one token each"):
        gated_delta_step(q[:2], k[:2], v[:2], gate[:2], beta[:2], starts.clone())
