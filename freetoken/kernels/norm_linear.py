"""The residual add, the RMSNorm and the projection after it in one launch, for decode rows (the attention's input
norm and its qkv projection: was add_rms_norm + linear per layer).

    x [T, D] (+ y [T, D]) -> s = x + y (rounded to x's dtype; written once) -> h = rms_norm(s) (rounded as rms_norm
    rounds) -> out = h @ w.T (+ bias) [T, N], fp32 sums rounded to x's dtype

Each program recomputes its row's norm (D values: cheap beside the weight tile it streams), so no program waits for
another. A GEMV with one program per (row, BLOCK_N outputs): meant for a few rows (MAX_ROWS).
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.linear import linear_ref
from freetoken.kernels.rmsnorm import add_rms_norm_ref, rms_norm_ref

MAX_ROWS = 8


@triton.jit
def _row_sum(x_row, y_row, offs_k, kmask, HAS_Y: tl.constexpr):
    """Columns offs_k of x's row (+ y's, rounded to x's dtype): both passes of the kernel read the sum this way."""
    s = tl.load(x_row + offs_k, mask=kmask, other=0.0)
    if HAS_Y:
        y = tl.load(y_row + offs_k, mask=kmask, other=0.0)
        s = (s.to(tl.float32) + y.to(tl.float32)).to(x_row.dtype.element_ty)
    return s


@triton.jit
def _norm_linear_kernel(
    # Pointers
    x_ptr, y_ptr, norm_w_ptr, w_ptr, bias_ptr, sum_ptr, out_ptr,
    # Dimensions
    D, N, eps,
    # Strides
    stride_x, stride_y, stride_sum, stride_w, stride_out,
    # Meta-parameters
    HAS_Y: tl.constexpr, HAS_BIAS: tl.constexpr, ROUND_NORMED: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Grid (T, cdiv(N, BLOCK_N)): row t's sum of squares over D, then its normed row against BLOCK_N weight rows;
    program (t, 0) writes the sum s."""
    t = tl.program_id(0)
    nb = tl.program_id(1)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    ss = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < D
        s = _row_sum(x_ptr + t * stride_x, y_ptr + t * stride_y, offs_k, kmask, HAS_Y)
        if HAS_Y and nb == 0:
            tl.store(sum_ptr + t * stride_sum + offs_k, s, mask=kmask)
        sf = s.to(tl.float32)
        ss += sf * sf
    rstd = tl.rsqrt(tl.sum(ss, axis=0) / D + eps)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < D
        s = _row_sum(x_ptr + t * stride_x, y_ptr + t * stride_y, offs_k, kmask, HAS_Y)
        normed = s.to(tl.float32) * rstd
        if ROUND_NORMED:
            normed = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
        nw = tl.load(norm_w_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        h = (normed * nw).to(x_ptr.dtype.element_ty).to(tl.float32)  # rms_norm's output, in x's dtype
        w = tl.load(w_ptr + offs_n[:, None] * stride_w + offs_k[None, :], mask=nmask[:, None] & kmask[None, :],
                    other=0.0)
        acc += tl.sum(w.to(tl.float32) * h[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_out + offs_n, acc.to(out_ptr.dtype.element_ty), mask=nmask)


def add_norm_linear(x: torch.Tensor, y: torch.Tensor | None, norm_w: torch.Tensor, eps: float, w: torch.Tensor,
                    bias: torch.Tensor | None = None, round_normed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [T, D] (y None: no add), norm_w [D], w [N, D], bias [N] -> (x + y (x when y is None), out [T, N])."""
    # 1. check
    check_tensor(x, "x", 2)
    check_tensor(w, "w", 2)
    T, D = x.shape
    N = w.shape[0]
    if T > MAX_ROWS:
        raise ValueError(f"x: {T} rows > {MAX_ROWS} (a decode GEMV; use add_rms_norm and linear)")
    if w.shape[1] != D or norm_w.shape != (D,) or (bias is not None and bias.shape != (N,)):
        raise ValueError(f"w {tuple(w.shape)} / norm_w {tuple(norm_w.shape)} / bias do not match x's {D} features")
    if y is not None:
        check_tensor(y, "y", 2)
        if y.shape != x.shape or y.dtype != x.dtype:
            raise ValueError(f"y: {y.dtype} {tuple(y.shape)} must be x's {x.dtype} {tuple(x.shape)}")
    check_same_device(x=x, w=w, norm_w=norm_w)
    # 2. allocate
    s = torch.empty_like(x) if y is not None else x
    out = torch.empty((T, N), dtype=x.dtype, device=x.device)
    if T == 0:
        return s, out
    # 3. launch
    BLOCK_N, BLOCK_K = 32, max(16, min(triton.next_power_of_2(D), 128))
    _norm_linear_kernel[(T, triton.cdiv(N, BLOCK_N))](
        x, y if y is not None else x, norm_w, w, bias if bias is not None else w, s, out,
        D, N, float(eps),
        x.stride(0), (y if y is not None else x).stride(0), s.stride(0), w.stride(0), out.stride(0),
        HAS_Y=y is not None, HAS_BIAS=bias is not None, ROUND_NORMED=round_normed, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=4,
    )
    return s, out


def add_norm_linear_ref(x: torch.Tensor, y: torch.Tensor | None, norm_w: torch.Tensor, eps: float, w: torch.Tensor,
                        bias: torch.Tensor | None = None,
                        round_normed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The composition it replaces: add_rms_norm_ref (rms_norm_ref without y), then linear_ref."""
    if y is None:
        s, h = x, rms_norm_ref(x, norm_w, eps, round_normed)
    else:
        s, h = add_rms_norm_ref(x, y, norm_w, eps, round_normed)
    return s, linear_ref(h, w, bias)
