"""FP8 KV cache: the attention kernels reading e4m3 codes + per-(token, kv head) scales = their torch reference
(which decodes through torch's float8_e4m3fn, independent of the kernels' bit decoding); the format's round trip."""

from __future__ import annotations

import pytest
import torch

from freetoken.kernels import attention, attention_host, attention_ref
from freetoken.kernels.kv_fp8 import E4M3_MAX, dequantize_kv, quantize_kv
from freetoken.kv_dtype import kv_bytes_per_token
from tests.kernels.tolerances import assert_close


def _fp8_inputs(T, H, Hkv, Dh, S_max, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, Dh, generator=g).to(dtype)
    # heads of different ranges (0.1 .. 1), as real keys have: the per-head scale follows each
    spread = torch.logspace(-1, 0, Hkv)[None, :, None]
    k, ks = quantize_kv(torch.randn(S_max, Hkv, Dh, generator=g) * spread)
    v, vs = quantize_kv(torch.randn(S_max, Hkv, Dh, generator=g) * spread)
    return q, k, v, ks, vs


def test_quantize_round_trip_within_e4m3_rounding():
    """Each value comes back within half an e4m3 ulp: 2^-4 relative for normals, 2^-10 x scale below 2^-6 x scale
    (subnormals); each head's largest value maps to code 0x7e (448) exactly."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 3, 32, generator=g) * torch.tensor([1e-3, 1.0, 300.0])[None, :, None]
    x[4, 1] = 0.0  # an all-zero head: scale 1, codes 0
    codes, scale = quantize_kv(x)
    assert codes.dtype == torch.uint8 and scale.shape == (9, 3) and scale[4, 1] == 1.0
    back = dequantize_kv(codes, scale)
    bound = torch.maximum(x.abs() * 2**-4, scale[..., None] * 2**-10) * (1 + 1e-6)
    assert bool(((back - x).abs() <= bound).all())
    top = x.abs().argmax(-1, keepdim=True)
    hit = codes.gather(-1, top)[..., 0] & 0x7F
    assert bool((hit[x.abs().amax(-1) > 0] == 0x7E).all())
    assert torch.equal(scale[x.abs().amax(-1) > 0], (x.abs().amax(-1) / E4M3_MAX)[x.abs().amax(-1) > 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,H,Hkv,Dh,start_pos", [(7, 4, 2, 16, 0), (20, 2, 1, 24, 3), (5, 8, 2, 32, 70)])
def test_prefill_fp8_matches_reference(dtype, T, H, Hkv, Dh, start_pos):
    q, k, v, ks, vs = _fp8_inputs(T, H, Hkv, Dh, start_pos + T + 3, dtype, seed=T + start_pos)
    scale = Dh**-0.5
    assert_close(attention(q, k, v, start_pos, scale, k_scale=ks, v_scale=vs),
                 attention_ref(q, k, v, start_pos, scale, k_scale=ks, v_scale=vs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,Dh,start_pos", [(4, 4, 16, 0), (4, 1, 24, 9), (8, 2, 32, 150)])
def test_decode_fp8_matches_reference(dtype, H, Hkv, Dh, start_pos):
    q, k, v, ks, vs = _fp8_inputs(1, H, Hkv, Dh, start_pos + 4, dtype, seed=H + start_pos)
    scale = Dh**-0.5
    assert_close(attention(q, k, v, start_pos, scale, k_scale=ks, v_scale=vs),
                 attention_ref(q, k, v, start_pos, scale, k_scale=ks, v_scale=vs))


@pytest.mark.parametrize("T,start_pos", [(6, 10), (1, 20)])
def test_fp8_sinks_and_window_match_reference(T, start_pos):
    """gpt-oss's options over an FP8 cache: the decode window is a view of codes and scales alike."""
    q, k, v, ks, vs = _fp8_inputs(T, 4, 2, 16, start_pos + T, torch.float32, seed=5)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(6))
    got = attention(q, k, v, start_pos, 0.25, sinks=sinks, window=8, k_scale=ks, v_scale=vs)
    assert_close(got, attention_ref(q, k, v, start_pos, 0.25, sinks, 8, ks, vs))


@pytest.mark.parametrize("T,start_pos", [(5, 3), (1, 12)])
def test_host_kernels_read_fp8_like_the_reference(T, start_pos):
    q, k, v, ks, vs = _fp8_inputs(T, 4, 2, 16, start_pos + T, torch.float32, seed=7)
    assert_close(attention_host(q, k, v, start_pos, 0.25, k_scale=ks, v_scale=vs),
                 attention_ref(q, k, v, start_pos, 0.25, k_scale=ks, v_scale=vs))


def test_fp8_positions_past_the_query_are_never_read():
    """NaN codes (0x7f) and NaN scales past the query's position change nothing."""
    q, k, v, ks, vs = _fp8_inputs(1, 4, 2, 16, 12, torch.float32, seed=8)
    want = attention(q, k, v, 6, 0.25, k_scale=ks, v_scale=vs)
    k[7:], v[7:], ks[7:], vs[7:] = 0x7F, 0x7F, float("nan"), float("nan")
    assert_close(attention(q, k, v, 6, 0.25, k_scale=ks, v_scale=vs), want)


def test_fp8_cache_arguments_are_checked():
    q, k, v, ks, vs = _fp8_inputs(1, 4, 2, 16, 8, torch.float32, seed=9)
    with pytest.raises(TypeError, match="k_cache"):  # codes without scales
        attention(q, k, v, 3, 0.25)
    with pytest.raises(ValueError, match="k_scale: shape"):
        attention(q, k, v, 3, 0.25, k_scale=ks[:, :1].contiguous(), v_scale=vs)
    with pytest.raises(TypeError, match="v_scale"):
        attention(q, k, v, 3, 0.25, k_scale=ks, v_scale=vs.half())


def test_kv_bytes_per_token_by_hand():
    """Qwen3-30B-A3B: 48 layers x 4 kv heads, Dh 128. bf16: 2 x 192 x 128 x 2 = 98,304 bytes (its card's number);
    fp8: 2 x 192 x (128 + 4) = 50,688 (0.516x)."""
    assert kv_bytes_per_token(48 * 4, 128, "bf16", 4) == 98_304
    assert kv_bytes_per_token(48 * 4, 128, "auto", 2) == 98_304
    assert kv_bytes_per_token(48 * 4, 128, "auto", 4) == 196_608
    assert kv_bytes_per_token(48 * 4, 128, "fp8", 2) == 50_688
    with pytest.raises(ValueError, match="--kv-dtype: 'int8'"):
        kv_bytes_per_token(1, 128, "int8", 2)
