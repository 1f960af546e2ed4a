"""GQA decode attention (one query) over a contiguous KV cache, split-K: partial softmaxes per key split, then a merge.

A sliding window is a narrower cache view (the last `window` keys); sinks (a per-head logit in the softmax
denominator, value 0) join in the merge (SINKS flag). FP8_KV: the cache holds e4m3 codes (uint8) with one fp32 scale
per (token, kv head) (kv_fp8.py), decoded in attention_block.py's key-block step, which both attention kernels share.
"""

from __future__ import annotations

import torch

from freetoken.kernels.attention_block import attend_block
from freetoken.kernels.lazy import tl, triton

LOG2E = 1.4426950408889634
TARGET_PROGRAMS = 256  # enough (kv head, split) programs to keep every SM of a large GPU streaming the cache


@triton.jit(do_not_specialize=["L", "SPLIT_LEN"])  # change every decode step: compile once
def _attention_decode_split_kernel(
    # Pointers
    q_ptr, k_ptr, v_ptr, part_out_ptr, part_lse_ptr, k_scale_ptr, v_scale_ptr,
    # Dimensions
    L, Dh, GROUP, SPLIT_LEN, qk_scale,
    # Strides
    stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ph, stride_ps, stride_lh, stride_scs,
    # Meta-parameters
    DOT_FP32: tl.constexpr, FP8_KV: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (kv head, split): all GROUP query heads of the kv head against keys [split * SPLIT_LEN, +SPLIT_LEN)."""
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    q_mask = (offs_g[:, None] < GROUP) & (offs_d[None, :] < Dh)
    q = tl.load(q_ptr + heads[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)  # [BG, BD]

    m_i = tl.full([BLOCK_G], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    lo = split * SPLIT_LEN
    hi = tl.minimum(lo + SPLIT_LEN, L)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < hi
        m_i, l_i, acc = attend_block(  # the max stays finite: every split holds at least one key
            q, m_i, l_i, acc, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr,
            kvh, offs_n, nmask, offs_d, offs_d < Dh, nmask[None, :], qk_scale,
            stride_ks, stride_kh, stride_vs, stride_vh, stride_scs,
            DOT_FP32, FP8_KV, False, BLOCK_G, BLOCK_N)
    tl.store(part_out_ptr + heads[:, None] * stride_ph + split * stride_ps + offs_d[None, :],
             acc / l_i[:, None], mask=q_mask)
    tl.store(part_lse_ptr + heads * stride_lh + split, m_i + tl.log2(l_i), mask=offs_g < GROUP)


@triton.jit(do_not_specialize=["NUM_SPLITS"])
def _attention_decode_merge_kernel(
    # Pointers
    part_out_ptr, part_lse_ptr, out_ptr, sinks_ptr,
    # Dimensions
    NUM_SPLITS, Dh,
    # Strides
    stride_ph, stride_ps, stride_lh, stride_oh,
    # Meta-parameters
    SINKS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program per head: out = sum_s 2^(lse_s - max) * out_s / (sum_s 2^(lse_s - max) [+ 2^(sink - max)]), the
    splits read BLOCK_S at a time (a fixed block: a growing context changes NUM_SPLITS, never the compiled kernel)."""
    h = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < Dh
    m = tl.full([], -float("inf"), tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        lse = tl.load(part_lse_ptr + h * stride_lh + offs_s, mask=offs_s < NUM_SPLITS, other=-float("inf"))  # [BS]
        m = tl.maximum(m, tl.max(lse, axis=0))
    if SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634  # base 2, like the lse
        m = tl.maximum(m, sink)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    denom = tl.zeros([], dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        smask = offs_s < NUM_SPLITS
        lse = tl.load(part_lse_ptr + h * stride_lh + offs_s, mask=smask, other=-float("inf"))  # [BS]
        w = tl.exp2(lse - m)
        part = tl.load(part_out_ptr + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
                       mask=smask[:, None] & dmask[None, :], other=0.0)  # [BS, BD]
        acc += tl.sum(part * w[:, None], axis=0)
        denom += tl.sum(w, axis=0)
    if SINKS:
        denom += tl.exp2(sink - m)
    tl.store(out_ptr + h * stride_oh + offs_d, (acc / denom).to(out_ptr.dtype.element_ty), mask=dmask)


def decode_splits(kv_len: int, num_kv_heads: int, block_n: int) -> tuple[int, int]:
    """(number of splits, keys per split, a multiple of block_n) for kv_len keys."""
    max_splits = triton.cdiv(kv_len, block_n)
    splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, num_kv_heads), max_splits))
    split_len = triton.cdiv(triton.cdiv(kv_len, splits), block_n) * block_n
    return triton.cdiv(kv_len, split_len), split_len


def merge_block(num_kv_heads: int) -> int:
    """The merge kernel's BLOCK_S, fixed per head count whatever kv_len (a length-dependent power of two recompiled
    the merge at each doubling): the most splits decode_splits can give, at most 64 (the kernel loops past that)."""
    return max(min(triton.next_power_of_2(triton.cdiv(TARGET_PROGRAMS, num_kv_heads)), 64), 2)


def attention_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int, sm_scale: float,
    out: torch.Tensor, dot_fp32: bool, sinks: torch.Tensor | None = None, window: int | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch only; `attention` checks the arguments (q [1, H, Dh]; fp8: k_scale / v_scale [S_max, Hkv]) and
    allocates `out`."""
    fp8 = k_scale is not None
    if window is not None and start_pos + 1 > window:  # the last `window` keys: a view starting past the rest
        lo = start_pos + 1 - window
        k_cache, v_cache, start_pos = k_cache[lo:], v_cache[lo:], window - 1
        if fp8:
            k_scale, v_scale = k_scale[lo:], v_scale[lo:]
    _, H, Dh = q.shape
    Hkv = k_cache.shape[1]
    group = H // Hkv
    L = start_pos + 1
    BLOCK_D = max(triton.next_power_of_2(Dh), 16)
    BLOCK_N = 64 if BLOCK_D <= 128 else 32
    num_splits, split_len = decode_splits(L, Hkv, BLOCK_N)
    part_out = torch.empty((H, num_splits, Dh), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((H, num_splits), dtype=torch.float32, device=q.device)
    _attention_decode_split_kernel[(Hkv, num_splits)](
        q, k_cache, v_cache, part_out, part_lse, k_scale if fp8 else part_lse, v_scale if fp8 else part_lse,
        L, Dh, group, split_len, sm_scale * LOG2E,
        q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        part_out.stride(0), part_out.stride(1), part_lse.stride(0), k_scale.stride(0) if fp8 else 0,
        DOT_FP32=dot_fp32, FP8_KV=fp8, BLOCK_G=max(triton.next_power_of_2(group), 16), BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
        num_warps=4, num_stages=2,
    )
    _attention_decode_merge_kernel[(H,)](
        part_out, part_lse, out, part_lse if sinks is None else sinks,
        num_splits, Dh,
        part_out.stride(0), part_out.stride(1), part_lse.stride(0), out.stride(1),
        SINKS=sinks is not None, BLOCK_S=merge_block(Hkv),
        BLOCK_D=triton.next_power_of_2(Dh), num_warps=4,
    )
    return out
