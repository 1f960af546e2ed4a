"""attention (prefill + decode kernels) vs its reference; the reference vs torch scaled_dot_product_attention."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import attention, attention_ref
from freetoken.kernels.attention_decode import decode_splits
from tests.kernels.tolerances import assert_close


def _inputs(T, H, Hkv, Dh, S_max, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, Dh, generator=g).to(dtype)
    k = torch.randn(S_max, Hkv, Dh, generator=g).to(dtype)
    v = torch.randn(S_max, Hkv, Dh, generator=g).to(dtype)
    return q, k, v


# T = 20: two 16-row query blocks; T > 32 takes the 64-row block; start_pos 70: two 64-key blocks;
# Dh = 24 is masked up to a 32-wide block; H / Hkv = 1, 2, 4
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "T,H,Hkv,Dh,start_pos",
    [(7, 4, 2, 16, 0), (7, 4, 1, 24, 5), (20, 2, 1, 16, 3), (37, 2, 2, 16, 0), (5, 8, 2, 32, 70)],
)
def test_prefill_matches_reference(dtype, T, H, Hkv, Dh, start_pos):
    q, k, v = _inputs(T, H, Hkv, Dh, start_pos + T + 3, dtype, seed=T + H + start_pos)
    scale = Dh**-0.5
    assert_close(attention(q, k, v, start_pos, scale), attention_ref(q, k, v, start_pos, scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H,Hkv,Dh,start_pos", [(4, 4, 16, 0), (4, 1, 24, 9), (8, 2, 32, 150)])
def test_decode_matches_reference(dtype, H, Hkv, Dh, start_pos):
    q, k, v = _inputs(1, H, Hkv, Dh, start_pos + 4, dtype, seed=H + start_pos)
    scale = Dh**-0.5
    assert_close(attention(q, k, v, start_pos, scale), attention_ref(q, k, v, start_pos, scale))


def test_decode_at_151_keys_merges_several_splits():
    """The 150 case above: 151 keys, 64-key blocks, 2 kv heads -> 3 splits of 64 keys merged by the second kernel."""
    assert decode_splits(151, 2, 64) == (3, 64)


def test_decode_equals_last_prefill_row_and_ignores_future_cache():
    """Decoding query i at start_pos + i gives the prefill row i; cache entries past the query never matter."""
    q, k, v = _inputs(6, 4, 2, 16, 12, torch.float32, seed=11)
    full = attention(q, k, v, 0, 0.25)
    k_noisy, v_noisy = k.clone(), v.clone()
    k_noisy[6:], v_noisy[6:] = 1e4, float("nan")
    for i in (0, 5):
        assert_close(attention(q[i : i + 1], k_noisy, v_noisy, i, 0.25), full[i : i + 1])


def test_strided_q_view():
    qkv = torch.randn(5, (4 + 2 * 2) * 16)
    q = qkv[:, : 4 * 16].view(5, 4, 16)
    _, k, v = _inputs(5, 4, 2, 16, 8, torch.float32, seed=12)
    assert_close(attention(q, k, v, 2, 0.25), attention_ref(q.contiguous(), k, v, 2, 0.25))


@pytest.mark.parametrize("T,start_pos", [(6, 0), (4, 7), (1, 9)])
def test_reference_matches_sdpa(T, start_pos):
    H, Hkv, Dh = 4, 2, 16
    q, k, v = _inputs(T, H, Hkv, Dh, start_pos + T, torch.float32, seed=T + start_pos)
    L = start_pos + T
    mask = torch.arange(L)[None, :] <= (start_pos + torch.arange(T))[:, None]  # [T, L], True = attend
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k[:L].transpose(0, 1)[None], v[:L].transpose(0, 1)[None],
        attn_mask=mask, scale=0.3, enable_gqa=True,
    )[0].transpose(0, 1)  # [T, H, Dh]
    torch.testing.assert_close(attention_ref(q, k, v, start_pos, 0.3), sdpa, rtol=1e-5, atol=1e-5)


def test_overflowing_cache_is_refused():
    q, k, v = _inputs(4, 2, 1, 16, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="start_pos"):
        attention(q, k, v, 5, 0.25)
    with pytest.raises(ValueError, match="multiple"):
        attention(torch.randn(1, 3, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16), 0, 0.25)


def test_decode_merge_block_does_not_follow_the_context_length():
    """BLOCK_S of the merge depends on the kv head count only (one compiled merge as the context grows): 256 target
    programs / Hkv splits at most, capped at 64 (the kernel loops past that)."""
    from freetoken.kernels.attention_decode import merge_block

    assert [merge_block(h) for h in (1, 4, 8, 64, 512)] == [64, 64, 32, 4, 2]
    for hkv in (8, 64):  # here every split count fits one block
        assert max(decode_splits(L, hkv, 64)[0] for L in range(1, 40_000, 97)) <= merge_block(hkv)


def test_decode_merge_loops_over_more_splits_than_its_block():
    """Hkv = 1 at a long context: 80 splits through a BLOCK_S of 64 equals the torch reference."""
    g = torch.Generator().manual_seed(3)
    L, H, Dh = 80 * 64, 2, 16
    q = torch.randn(1, H, Dh, generator=g)
    k, v = torch.randn(L, 1, Dh, generator=g), torch.randn(L, 1, Dh, generator=g)
    assert decode_splits(L, 1, 64)[0] == 80
    assert_close(attention(q, k, v, L - 1, Dh**-0.5), attention_ref(q, k, v, L - 1, Dh**-0.5))
