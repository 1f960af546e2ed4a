"""DeepSeek-V4's KV compression: each window of source rows becomes one entry, per channel the softmax-weighted sum
of its rows' values by their gate scores (the caller adds the learned position bias and lays out the slots: an HCA
window's m rows; a CSA window's 2m, the previous window's first-half channels then this window's second half, a
missing previous window scored -inf).

    out[w, c] = sum_s softmax_s(score[w, :, c])[s] kv[w, s, c]
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton


@triton.jit
def _compress_pool_kernel(
    # Pointers
    kv_ptr, score_ptr, out_ptr,
    # Dimensions
    S, C,
    # Strides
    stride_kw, stride_ks, stride_sw, stride_ss, stride_ow,
    # Meta-parameters
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Program (window, channel tile): the window's slots in one tile, softmax over them per channel, in fp32."""
    w = tl.program_id(0)
    offs_s = tl.arange(0, BLOCK_S)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_s[:, None] < S) & (offs_c[None, :] < C)
    score = tl.load(score_ptr + w * stride_sw + offs_s[:, None] * stride_ss + offs_c[None, :], mask=mask,
                    other=-float("inf")).to(tl.float32)
    kv = tl.load(kv_ptr + w * stride_kw + offs_s[:, None] * stride_ks + offs_c[None, :], mask=mask,
                 other=0.0).to(tl.float32)
    top = tl.max(score, axis=0)
    top = tl.where(top == -float("inf"), 0.0, top)  # channels past C: no slot at all
    e = tl.exp(score - top[None, :])  # [BS, BC], 0 on empty slots
    den = tl.sum(e, axis=0)
    out = tl.sum(e * kv, axis=0) / tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + w * stride_ow + offs_c, out.to(out_ptr.dtype.element_ty), mask=offs_c < C)


def _check(kv: torch.Tensor, score: torch.Tensor) -> None:
    check_tensor(kv, "kv", 3)
    check_tensor(score, "score", 3)
    check_same_device(kv=kv, score=score)
    if kv.shape != score.shape:
        raise ValueError(f"kv {tuple(kv.shape)}, score {tuple(score.shape)}: want the same [W, S, C]")


def compress_pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """kv, score [W, S, C] (score fp32; -inf: an empty slot) -> [W, C] in kv's dtype."""
    # 1. check
    _check(kv, score)
    W, S, C = kv.shape
    # 2. allocate
    out = torch.empty((W, C), dtype=kv.dtype, device=kv.device)
    if W == 0:
        return out
    # 3. launch
    BLOCK_S = triton.next_power_of_2(S)
    BLOCK_C = max(min(triton.next_power_of_2(C), 4096 // BLOCK_S), 16)
    _compress_pool_kernel[(W, triton.cdiv(C, BLOCK_C))](
        kv, score, out, S, C, kv.stride(0), kv.stride(1), score.stride(0), score.stride(1), out.stride(0),
        BLOCK_S=BLOCK_S, BLOCK_C=BLOCK_C)
    return out


def compress_pool_ref(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """HF's compressors: (kv * score.softmax(dim=slots, dtype=fp32)).sum(slots)."""
    _check(kv, score)
    return (kv * score.softmax(dim=1, dtype=torch.float32).to(kv.dtype)).sum(dim=1)
