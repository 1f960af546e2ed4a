"""Gated RMSNorm on the Gated DeltaNet output: RMSNorm(x) * w, times silu(z), HF's Qwen3NextRMSNormGated order."""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.rmsnorm import MAX_D


@triton.jit
def _rms_norm_gated_kernel(
    # Pointers
    x_ptr, z_ptr, w_ptr, out_ptr,
    # Dimensions
    D, eps,
    # Strides
    stride_x, stride_z, stride_out,
    # Meta-parameters
    BLOCK_D: tl.constexpr,
):
    """One row per program: y = (w * (x rsqrt(mean x^2 + eps)).to(x.dtype)) * silu(z), in fp32, rounded once."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    normed = (xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + row * stride_z + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (w * normed * (z * tl.sigmoid(z))).to(out_ptr.dtype.element_ty),
             mask=mask)


def _check(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> None:
    check_tensor(x, "x", 2)
    check_tensor(z, "z", 2)
    check_tensor(weight, "weight", 1)
    check_same_device(x=x, z=z, weight=weight)
    if z.shape != x.shape or weight.shape[0] != x.shape[1]:
        raise ValueError(f"x {tuple(x.shape)}, z {tuple(z.shape)}, weight {tuple(weight.shape)}: want x, z [N, D], "
                         f"weight [D]")
    if x.shape[1] > MAX_D:
        raise ValueError(f"x: last dim {x.shape[1]} > {MAX_D} (one row per program)")


def rms_norm_gated(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, z [N, D], weight [D] -> [N, D] in x's dtype."""
    # 1. check
    _check(x, z, weight)
    N, D = x.shape
    # 2. allocate
    out = torch.empty((N, D), dtype=x.dtype, device=x.device)
    if N == 0:
        return out
    # 3. launch
    BLOCK_D = triton.next_power_of_2(D)
    _rms_norm_gated_kernel[(N,)](x, z, weight, out, D, float(eps), x.stride(0), z.stride(0), out.stride(0),
                                 BLOCK_D=BLOCK_D, num_warps=min(max(BLOCK_D // 256, 1), 16))
    return out


def rms_norm_gated_ref(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch, HF's order: normalise in fp32, round to x.dtype, times the weight, times silu(z) in fp32."""
    _check(x, z, weight)
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight.float() * normed.float() * torch.nn.functional.silu(z.float())).to(x.dtype)
