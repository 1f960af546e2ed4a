"""Causal depthwise conv1d (prefill with a conv state, and the one-token update) vs HF's causal_conv1d_fn /
causal_conv1d_update (transformers' torch fallbacks for Qwen3-Next / Qwen3.5)."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels.causal_conv1d import causal_conv1d, causal_conv1d_ref
from freetoken.kernels.causal_conv1d_update import causal_conv1d_update, causal_conv1d_update_ref
from tests.kernels.tolerances import assert_close

C, KW = 24, 4


def _inputs(T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, C, generator=g), torch.randn(C, KW, generator=g) * 0.5


@pytest.mark.parametrize("T", [1, 3, 19])
def test_prefill_from_zero_state_is_hf_causal_conv1d_fn(T):
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_fn

    x, w = _inputs(T, T)
    want = causal_conv1d_fn(x.t()[None].contiguous(), w, None, activation="silu")[0].t()  # [T, C]
    for fn in (causal_conv1d, causal_conv1d_ref):
        state = torch.zeros(C, KW - 1)
        assert_close(fn(x, w, state), want)
        last = torch.cat([torch.zeros(KW - 1, C), x])[-(KW - 1):].t()
        torch.testing.assert_close(state, last, rtol=0, atol=0)  # the last K - 1 inputs, zeros before the start


@pytest.mark.parametrize("split", [1, 2, 7])
def test_second_chunk_continues_the_state(split):
    """Prefilling [0, split) then [split, T) equals one pass over all T (HF's conv over the whole sequence)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_fn

    x, w = _inputs(11, 40 + split)
    want = causal_conv1d_fn(x.t()[None].contiguous(), w, None, activation="silu")[0].t()
    state = torch.zeros(C, KW - 1)
    got = torch.cat([causal_conv1d(x[:split], w, state), causal_conv1d(x[split:], w, state)])
    assert_close(got, want)


def test_decode_steps_continue_a_prefill_state():
    """Steps after a prefill: kernel = reference = HF's causal_conv1d_update (its state holds K inputs)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_update as hf_update

    x, w = _inputs(9, 7)
    ours, ref = torch.zeros(C, KW - 1), torch.zeros(C, KW - 1)
    causal_conv1d(x[:6], w, ours)
    causal_conv1d_ref(x[:6], w, ref)
    hf_state = torch.cat([torch.zeros(KW, C), x[:6]])[-KW:].t()[None].contiguous()  # [1, C, K]
    for t in range(6, 9):
        want = hf_update(x[t:t + 1].t()[None].contiguous(), hf_state, w, None, "silu")[0].t()  # [1, C]
        assert_close(causal_conv1d_update(x[t:t + 1].contiguous(), w, ours), want)
        assert_close(causal_conv1d_update_ref(x[t:t + 1], w, ref), want)
        torch.testing.assert_close(ours, hf_state[0, :, 1:], rtol=0, atol=0)


def test_bad_state_shape_is_named():
    x, w = _inputs(2, 0)
    with pytest.raises(ValueError, match="conv_state"):
        causal_conv1d(x, w, torch.zeros(C, KW))


def test_channels_over_several_blocks():
    """300 channels: three channel blocks of 128 in prefill, two of 256 in the update (the last ones partial)."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(20, 300, generator=g), torch.randn(300, KW, generator=g) * 0.5
    ours, ref = torch.zeros(300, KW - 1), torch.zeros(300, KW - 1)
    assert_close(causal_conv1d(x[:19], w, ours), causal_conv1d_ref(x[:19], w, ref))
    assert_close(causal_conv1d_update(x[19:].contiguous(), w, ours), causal_conv1d_update_ref(x[19:], w, ref))
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_a_decode_batch_shifts_each_sequence_state():
    """x [B, C] against state [B, C, K - 1]: each row = that sequence's own one-token update (HF's), each state
    shifted alone; x may be a column slice of a wider projection (row stride > C)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_update as hf_update

    B = 3
    wide, w = _inputs(B, 21)
    wide = torch.cat([wide, torch.randn(B, 5)], dim=1)  # the conv channels are the first C columns
    x = wide[:, :C]
    starts = torch.randn(B, C, KW - 1, generator=torch.Generator().manual_seed(3))
    for fn in (causal_conv1d_update, causal_conv1d_update_ref):
        states = starts.clone()
        out = fn(x, w, states)
        for b in range(B):
            hf_state = torch.cat([torch.zeros(C, 1), starts[b]], dim=1)[None].contiguous()  # [1, C, K]
            want = hf_update(x[b:b + 1].t()[None].contiguous(), hf_state, w, None, "silu")[0].t()
            assert_close(out[b:b + 1], want)
            torch.testing.assert_close(states[b], hf_state[0, :, 1:], rtol=0, atol=0)


@pytest.mark.parametrize("T", [1, 37])
def test_bf16_references_are_hf_at_a_real_width(T):
    """bf16 weights and inputs, 2,048 channels (the references sum the taps in fp32, where HF's fallbacks run bf16
    F.conv1d): prefill from a carried state = HF's causal_conv1d_fn over the whole sequence, then one decode step =
    its causal_conv1d_update."""
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_fn
    from transformers.models.qwen3_next.modeling_qwen3_next import causal_conv1d_update as hf_update

    g = torch.Generator().manual_seed(T)
    width = 2048
    x = torch.randn(5 + T + 1, width, generator=g).bfloat16()
    w = (torch.randn(width, KW, generator=g) * 0.5).bfloat16()
    state = torch.zeros(width, KW - 1, dtype=torch.bfloat16)
    causal_conv1d_ref(x[:5], w, state)  # an earlier chunk
    got = causal_conv1d_ref(x[5:5 + T], w, state)
    want = causal_conv1d_fn(x[:5 + T].t()[None].contiguous(), w, None, activation="silu")[0].t()[5:]
    assert got.dtype == torch.bfloat16
    assert_close(got, want)
    hf_state = torch.cat([torch.zeros(KW, width, dtype=torch.bfloat16), x[:5 + T]])[-KW:].t()[None].contiguous()
    step = hf_update(x[-1:].t()[None].contiguous(), hf_state, w, None, "silu")[0].t()  # [1, C]
    assert_close(causal_conv1d_update_ref(x[-1:], w, state), step)
    torch.testing.assert_close(state, hf_state[0, :, 1:], rtol=0, atol=0)
