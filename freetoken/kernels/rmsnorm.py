"""RMSNorm over the last dim (also Qwen3's per-head q/k norm on [T*H, Dh]), HF rounding order: Llama's (the normed
row rounded to x's dtype before the weight) or, round_normed=False, Qwen3-Next's ((normed * w) in fp32, rounded
once)."""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton

MAX_D = 65536


@triton.jit
def _rms_norm_kernel(
    # Pointers
    x_ptr, w_ptr, out_ptr,
    # Dimensions
    D, eps,
    # Strides
    stride_x, stride_out,
    # Meta-parameters
    BLOCK_D: tl.constexpr, ROUND_NORMED: tl.constexpr,
):
    """One row per program: y = w * (x * rsqrt(mean(x^2) + eps)).to(x.dtype), the sum of squares in fp32."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
    normed = xf * rstd
    if ROUND_NORMED:  # Llama-style HF norms round to the input dtype before the weight
        normed = normed.to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, round_normed: bool = True) -> torch.Tensor:
    """x [T, D], weight [D] -> [T, D] in x's dtype."""
    # 1. check
    check_tensor(x, "x", 2)
    check_tensor(weight, "weight", 1)
    check_same_device(x=x, weight=weight)
    T, D = x.shape
    if weight.shape[0] != D:
        raise ValueError(f"weight: shape {tuple(weight.shape)} does not match x's last dim {D}")
    if D > MAX_D:
        raise ValueError(f"x: last dim {D} > {MAX_D} (one row per program)")
    # 2. allocate
    out = torch.empty((T, D), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    # 3. launch
    BLOCK_D = triton.next_power_of_2(D)
    num_warps = min(max(BLOCK_D // 256, 1), 16)
    _rms_norm_kernel[(T,)](x, weight, out, D, float(eps), x.stride(0), out.stride(0), BLOCK_D=BLOCK_D,
                           ROUND_NORMED=round_normed, num_warps=num_warps)
    return out


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, round_normed: bool = True) -> torch.Tensor:
    """HF LlamaRMSNorm / Qwen3MoeRMSNorm: normalise in fp32, round to x.dtype, times the weight; round_normed=False:
    Qwen3NextRMSNorm's order, (normed * w) in fp32 then rounded."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if round_normed:
        normed = normed.to(x.dtype)
    return (weight.float() * normed.float()).to(x.dtype)


# the residual add fused in front: the decoder's x = x + sublayer(x), then the next norm, in one launch
@triton.jit
def _add_rms_norm_kernel(
    # Pointers
    x_ptr, y_ptr, w_ptr, sum_ptr, out_ptr,
    # Dimensions
    D, eps,
    # Strides
    stride_x, stride_y, stride_sum, stride_out,
    # Meta-parameters
    BLOCK_D: tl.constexpr, ROUND_NORMED: tl.constexpr,
):
    """One row per program: s = (x + y) rounded to x's dtype (as torch's add), out = rms_norm(s)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + row * stride_y + offs, mask=mask, other=0.0)
    s = (x.to(tl.float32) + y.to(tl.float32)).to(x.dtype)
    tl.store(sum_ptr + row * stride_sum + offs, s, mask=mask)
    sf = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(sf * sf, axis=0) / D + eps)
    normed = sf * rstd
    if ROUND_NORMED:
        normed = normed.to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float,
                 round_normed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [T, D] (y in x's dtype or wider), weight [D] -> (x + y, rms_norm(x + y)), both [T, D] in x's dtype."""
    # 1. check
    check_tensor(x, "x", 2)
    check_tensor(y, "y", 2)
    check_tensor(weight, "weight", 1)
    check_same_device(x=x, y=y, weight=weight)
    T, D = x.shape
    if tuple(y.shape) != (T, D) or weight.shape[0] != D:
        raise ValueError(f"y {tuple(y.shape)} / weight {tuple(weight.shape)} do not match x's [{T}, {D}]")
    if D > MAX_D:
        raise ValueError(f"x: last dim {D} > {MAX_D} (one row per program)")
    # 2. allocate
    s = torch.empty((T, D), dtype=x.dtype, device=x.device)
    out = torch.empty((T, D), dtype=x.dtype, device=x.device)
    if T == 0:
        return s, out
    # 3. launch
    BLOCK_D = triton.next_power_of_2(D)
    _add_rms_norm_kernel[(T,)](x, y, weight, s, out, D, float(eps), x.stride(0), y.stride(0), s.stride(0),
                               out.stride(0), BLOCK_D=BLOCK_D, ROUND_NORMED=round_normed,
                               num_warps=min(max(BLOCK_D // 256, 1), 16))
    return s, out


def add_rms_norm_ref(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float,
                     round_normed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The composition it replaces: the residual add in x's dtype, then rms_norm_ref."""
    s = x + y.to(x.dtype)
    return s, rms_norm_ref(s, weight, eps, round_normed)
