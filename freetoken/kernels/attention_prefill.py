"""Causal GQA flash attention for prefill chunks: T queries at positions start_pos.. over a contiguous KV cache.

Options (constexpr flags, off by default): SINKS, a learned per-head logit joining each row's softmax denominator
(gpt-oss); SLIDING, query p sees keys (p - window, p] only; FP8_KV, the cache holds e4m3 codes (uint8) with one
fp32 scale per (token, kv head) (kv_fp8.py). Each key block is attention_block.py's step, shared with the decode
kernel.
"""

from __future__ import annotations

import torch

from freetoken.kernels.attention_block import attend_block
from freetoken.kernels.lazy import tl, triton

LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["T", "start_pos"])  # both change every call: compile once
def _attention_prefill_kernel(
    # Pointers
    q_ptr, k_ptr, v_ptr, out_ptr, sinks_ptr, k_scale_ptr, v_scale_ptr,
    # Dimensions
    T, start_pos, Dh, GROUP, qk_scale, window,
    # Strides
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_scs,
    # Meta-parameters
    DOT_FP32: tl.constexpr, SINKS: tl.constexpr, SLIDING: tl.constexpr, FP8_KV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (query block, head): online softmax (base 2) over keys [0, start_pos + last query of the block]
    (sliding: from the first key the block's first query sees). A sink starts every row as a key of logit sink and
    value 0: m = sink, l = 1."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the chunk
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < Dh
    q_mask = (offs_m[:, None] < T) & dmask[None, :]
    q = tl.load(q_ptr + offs_m[:, None] * stride_qt + h * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)
    q_pos = start_pos + offs_m  # [BM]

    if SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634  # base 2, like the scores
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + sink
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = start_pos + tl.minimum((pid_m + 1) * BLOCK_M, T)  # one past the last key any real row of the block sees
    lo = 0
    if SLIDING:
        lo = tl.maximum(start_pos + pid_m * BLOCK_M - window + 1, 0) // BLOCK_N * BLOCK_N
    for n0 in range(lo, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        visible = (offs_n[None, :] <= q_pos[:, None]) & nmask[None, :]
        if SLIDING:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        # the max stays finite where key 0 is visible to every row (or the sink is there); sliding without sinks,
        # a row may see no key of this block yet
        m_i, l_i, acc = attend_block(
            q, m_i, l_i, acc, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr,
            kvh, offs_n, nmask, offs_d, dmask, visible, qk_scale,
            stride_ks, stride_kh, stride_vs, stride_vh, stride_scs,
            DOT_FP32, FP8_KV, SLIDING and not SINKS, BLOCK_M, BLOCK_N)
    if SLIDING and not SINKS:  # padding rows past T may have seen no key: 0 / 1, not 0 / 0 (never stored)
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_i[:, None]
    tl.store(out_ptr + offs_m[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def attention_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int, sm_scale: float,
    out: torch.Tensor, dot_fp32: bool, sinks: torch.Tensor | None = None, window: int | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch only; `attention` checks the arguments (fp8: k_scale / v_scale [S_max, Hkv]) and allocates
    `out` [T, H, Dh]."""
    fp8 = k_scale is not None
    T, H, Dh = q.shape
    Hkv = k_cache.shape[1]
    BLOCK_D = max(triton.next_power_of_2(Dh), 16)
    BLOCK_M = 64 if T > 32 else 16
    BLOCK_N = 64 if BLOCK_D <= 128 else 32
    grid = (triton.cdiv(T, BLOCK_M), H)
    _attention_prefill_kernel[grid](
        q, k_cache, v_cache, out, q if sinks is None else sinks, k_scale if fp8 else q, v_scale if fp8 else q,
        T, start_pos, Dh, H // Hkv, sm_scale * LOG2E, 0 if window is None else int(window),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1), k_scale.stride(0) if fp8 else 0,
        DOT_FP32=dot_fp32, SINKS=sinks is not None, SLIDING=window is not None, FP8_KV=fp8, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
        num_warps=4 if BLOCK_M <= 16 else 8, num_stages=2,
    )
    return out
