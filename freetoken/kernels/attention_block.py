"""One key block of online-softmax attention (base 2), shared by the prefill and decode kernels.

The block's K and V tiles come from the cache as stored, or, FP8_KV, as e4m3 codes (uint8) decoded in registers
(kv_fp8.py) with the K scale folded into the scores and the V scale into the probabilities (p v = (p * s_v) codes).
The caller owns the loop over key blocks, the visibility mask (causal, window, end of the cache) and the final
acc / l.
"""

from __future__ import annotations

from freetoken.kernels.dot import mma
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.packed_tiles import e4m3_bits_to_fp32


@triton.jit
def kv_tile(ptrs, mask, dtype: tl.constexpr, FP8_KV: tl.constexpr):
    """A K or V tile: the cache's values, or its e4m3 codes decoded to `dtype` (exact: e4m3 values fit bf16 / fp16)."""
    tile = tl.load(ptrs, mask=mask, other=0)
    if FP8_KV:
        tile = e4m3_bits_to_fp32(tile.to(tl.int32)).to(dtype)
    return tile


@triton.jit
def attend_block(
    # Running state
    q, m_i, l_i, acc,
    # Pointers
    k_ptr, v_ptr, k_scale_ptr, v_scale_ptr,
    # The block
    kvh, offs_n, nmask, offs_d, dmask, visible, qk_scale,
    # Strides
    stride_ks, stride_kh, stride_vs, stride_vh, stride_scs,
    # Meta-parameters
    DOT_FP32: tl.constexpr, FP8_KV: tl.constexpr, EMPTY_ROWS: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """q [BR, BD] against keys offs_n [BN] (nmask: in the cache; visible [BR or 1, BN]: seen by the row), from the
    running max m_i [BR], sum l_i [BR] and unnormalised output acc [BR, BD] -> (m_i, l_i, acc) after the block.
    EMPTY_ROWS: a row may see no key yet; its -inf max is kept out of the exponents."""
    k = kv_tile(k_ptr + offs_n[None, :] * stride_ks + kvh * stride_kh + offs_d[:, None],
                nmask[None, :] & dmask[:, None], q.dtype, FP8_KV)  # [BD, BN]
    if FP8_KV:
        k_scale = tl.load(k_scale_ptr + offs_n * stride_scs + kvh, mask=nmask, other=0.0)  # [BN]
        s = mma(q, k, tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32), DOT_FP32) * (k_scale * qk_scale)[None, :]
    else:
        s = mma(q, k, tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32), DOT_FP32) * qk_scale
    s = tl.where(visible, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if EMPTY_ROWS:
        m_new = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = kv_tile(v_ptr + offs_n[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                nmask[:, None] & dmask[None, :], q.dtype, FP8_KV)  # [BN, BD]
    if FP8_KV:
        v_scale = tl.load(v_scale_ptr + offs_n * stride_scs + kvh, mask=nmask, other=0.0)  # [BN]
        acc = mma((p * v_scale[None, :]).to(v.dtype), v, acc * alpha[:, None], DOT_FP32)
    else:
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], DOT_FP32)
    return m_new, l_i, acc
