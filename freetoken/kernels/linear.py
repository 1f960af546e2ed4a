"""Dense projection y = x @ w.T (+ bias) as a tiled Triton matmul: q/k/v/o projections, routers, lm_head.
Up to linear_decode.MAX_ROWS rows (decode) go to the split-K GEMV of linear_decode.py instead."""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_linear_args, check_tensor, dot_in_fp32
from freetoken.kernels.dot import mma
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.linear_decode import MAX_ROWS, linear_decode

# (max tokens, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): the first row whose max tokens >= T is used.
TILE_CONFIGS = (
    (16, 16, 64, 128, 4, 4),
    (64, 64, 64, 64, 4, 4),
    (float("inf"), 128, 128, 64, 8, 3),
)
# Few tokens are weight-bandwidth bound: below this many N tiles, halve BLOCK_N so more programs stream the weight.
MIN_N_TILES = 256


def tile_config(T: int, N: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for T tokens and N output features."""
    _, bm, bn, bk, warps, stages = next(c for c in TILE_CONFIGS if T <= c[0])
    if bm == 16 and triton.cdiv(N, bn) < MIN_N_TILES:
        bn = 32
    return bm, bn, bk, warps, stages


@triton.jit(do_not_specialize=["M"])  # the token count varies call to call
def _linear_kernel(
    # Pointers
    x_ptr, w_ptr, bias_ptr, out_ptr,
    # Dimensions
    M, N, K,
    # Strides
    stride_xm, stride_wn, stride_om,
    # Meta-parameters
    HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """out[M, N] = x[M, K] @ w[N, K].T + bias[N]; program ids grouped along M so neighbours reuse w tiles in L2."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size)
    pid_n = (pid % (GROUP_M * num_n)) // group_size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows_m = offs_m.to(tl.int64)  # T x vocab logits outgrow int32 offsets
    rows_n = offs_n.to(tl.int64)
    x_ptrs = x_ptr + rows_m[:, None] * stride_xm + offs_k[None, :]  # [BM, BK]
    w_ptrs = w_ptr + rows_n[None, :] * stride_wn + offs_k[:, None]  # [BK, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = offs_k < K - k0
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & kmask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=(offs_n[None, :] < N) & kmask[:, None], other=0.0)
        acc = mma(x, w, acc, DOT_FP32)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + rows_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D_in], w [D_out, D_in], bias [D_out] -> [T, D_out] in x's dtype, accumulated in fp32."""
    # 1. check
    check_tensor(x, "x", 2)
    if 0 < x.shape[0] <= MAX_ROWS:  # decode: the split-K GEMV (checks the rest itself)
        return linear_decode(x, w, bias)
    T, D_in, D_out = check_linear_args(x, w, bias)
    # 2. allocate
    out = torch.empty((T, D_out), dtype=x.dtype, device=x.device)
    if T == 0 or D_out == 0:
        return out
    # 3. launch
    BM, BN, BK, warps, stages = tile_config(T, D_out)
    grid = (triton.cdiv(T, BM) * triton.cdiv(D_out, BN),)
    _linear_kernel[grid](
        x, w, bias if bias is not None else w, out,
        T, D_out, D_in,
        x.stride(0), w.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, DOT_FP32=dot_in_fp32(x, w),  # a bias of another dtype is read as fp32
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=8,
        num_warps=warps, num_stages=stages,
    )
    return out


def linear_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 matmul, rounded once to x's dtype."""
    y = x.float() @ w.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
