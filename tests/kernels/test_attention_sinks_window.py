"""attention's gpt-oss options (per-head sinks, sliding window) in both kernels vs the reference; the reference vs
transformers' gpt-oss eager_attention_forward with its sliding-window causal mask function."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import attention, attention_ref
from tests.kernels.tolerances import assert_close


def _inputs(T, H, Hkv, Dh, S_max, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, Dh, generator=g).to(dtype)
    k = torch.randn(S_max, Hkv, Dh, generator=g).to(dtype)
    v = torch.randn(S_max, Hkv, Dh, generator=g).to(dtype)
    sinks = torch.randn(H, generator=g) * 2  # some above, some below the scores
    return q, k, v, sinks


# T = 20: two 16-row query blocks, the second starting past the window; T = 37: one 64-row block whose rows see
# different 64-key blocks; start_pos 70 with window 3: the loop starts at key 64, not 0
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,H,Hkv,Dh,start_pos,window", [(7, 4, 2, 16, 0, 3), (20, 2, 1, 16, 3, 5),
                                                         (37, 2, 2, 16, 0, 4), (5, 8, 2, 32, 70, 3),
                                                         (6, 4, 2, 16, 2, 100)])
@pytest.mark.parametrize("with_sinks", [True, False])
def test_prefill_window_and_sinks(dtype, T, H, Hkv, Dh, start_pos, window, with_sinks):
    q, k, v, sinks = _inputs(T, H, Hkv, Dh, start_pos + T + 2, dtype, seed=T + start_pos)
    sinks = sinks if with_sinks else None
    got = attention(q, k, v, start_pos, Dh**-0.5, sinks=sinks, window=window)
    assert_close(got, attention_ref(q, k, v, start_pos, Dh**-0.5, sinks=sinks, window=window))


@pytest.mark.parametrize("T,start_pos", [(7, 0), (5, 70)])
def test_prefill_sinks_without_window(T, start_pos):
    q, k, v, sinks = _inputs(T, 4, 2, 16, start_pos + T, torch.float32, seed=T)
    assert_close(attention(q, k, v, start_pos, 0.25, sinks=sinks), attention_ref(q, k, v, start_pos, 0.25, sinks=sinks))


# start_pos 150: 151 keys merge three splits; window 100 keeps two; window 4 one short view
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("start_pos,window", [(150, None), (150, 100), (150, 4), (2, 4), (9, 10)])
def test_decode_window_and_sinks(dtype, start_pos, window):
    q, k, v, sinks = _inputs(1, 8, 2, 32, start_pos + 3, dtype, seed=start_pos)
    got = attention(q, k, v, start_pos, 32**-0.5, sinks=sinks, window=window)
    assert_close(got, attention_ref(q, k, v, start_pos, 32**-0.5, sinks=sinks, window=window))
    if window is not None:
        got_plain = attention(q, k, v, start_pos, 32**-0.5, window=window)
        assert_close(got_plain, attention_ref(q, k, v, start_pos, 32**-0.5, window=window))


def test_decode_equals_last_prefill_row_with_window_and_sinks():
    q, k, v, sinks = _inputs(12, 4, 2, 16, 12, torch.float32, seed=5)
    full = attention(q, k, v, 0, 0.25, sinks=sinks, window=3)
    for i in (0, 2, 11):
        assert_close(attention(q[i:i + 1], k, v, i, 0.25, sinks=sinks, window=3), full[i:i + 1])


def test_a_very_negative_sink_is_plain_attention_and_a_large_one_silences():
    q, k, v, sinks = _inputs(6, 4, 2, 16, 6, torch.float32, seed=6)
    plain = attention_ref(q, k, v, 0, 0.25)
    assert_close(attention(q, k, v, 0, 0.25, sinks=torch.full((4,), -1e4)), plain)
    assert attention(q, k, v, 0, 0.25, sinks=torch.full((4,), 60.0)).abs().max() < 1e-20


@pytest.mark.parametrize("T,start_pos,window", [(6, 0, 3), (4, 7, 5), (1, 9, 4), (5, 2, None)])
def test_reference_matches_hf_gpt_oss_eager_attention(T, start_pos, window):
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    H, Hkv, Dh = 4, 2, 16
    q, k, v, sinks = _inputs(T, H, Hkv, Dh, start_pos + T, torch.float32, seed=T + start_pos)
    L = start_pos + T
    allowed = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    q_idx, kv_idx = (start_pos + torch.arange(T))[:, None], torch.arange(L)[None, :]
    visible = allowed(torch.tensor(0), torch.tensor(0), q_idx, kv_idx).expand(T, L)  # [T, L]
    mask = torch.zeros(T, L).masked_fill(~visible, float("-inf"))[None, None]  # [1, 1, T, L] additive

    class Module(torch.nn.Module):  # what eager_attention_forward reads off GptOssAttention
        num_key_value_groups = H // Hkv
        training = False

    module = Module()
    module.sinks = torch.nn.Parameter(sinks)
    out, _ = eager_attention_forward(module, q.transpose(0, 1)[None], k[:L].transpose(0, 1)[None],
                                     v[:L].transpose(0, 1)[None], mask, scaling=0.3)  # [1, T, H, Dh]
    torch.testing.assert_close(attention_ref(q, k, v, start_pos, 0.3, sinks=sinks, window=window), out[0],
                               rtol=1e-5, atol=1e-5)


def test_bad_sinks_and_window_are_refused():
    q, k, v, _ = _inputs(3, 4, 2, 16, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="sinks"):
        attention(q, k, v, 0, 0.25, sinks=torch.zeros(3))
    with pytest.raises(TypeError, match="sinks"):
        attention(q, k, v, 0, 0.25, sinks=torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="window"):
        attention(q, k, v, 0, 0.25, window=0)
