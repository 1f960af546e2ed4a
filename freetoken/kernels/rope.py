"""Rotary position embedding, neox / HF "rotate_half" layout: dims i and i + rotary_dim/2 form a pair.

The default rope derives its frequencies from theta; scaled ropes (YaRN: gpt-oss) pass their own inverse frequencies
and a cos/sin scale (YaRN's attention factor), see `yarn_inv_freq`.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton


@triton.jit
def _rope_kernel(
    # Pointers
    x_ptr, pos_ptr, inv_freq_ptr, out_ptr,
    # Dimensions
    H, Dh, HALF, cs_scale,
    # Strides
    stride_xt, stride_xh, stride_ot, stride_oh,
    # Meta-parameters
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):
    """One token per program, all heads: out = x * cos + rotate_half(x) * sin on the first 2*HALF dims, in fp32."""
    t = tl.program_id(0)
    offs_h = tl.arange(0, BLOCK_H)[:, None]  # [BH, 1]
    offs_i = tl.arange(0, BLOCK_HALF)[None, :]  # [1, BHALF]
    mask = (offs_h < H) & (offs_i < HALF)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    inv_freq = tl.load(inv_freq_ptr + offs_i, mask=offs_i < HALF, other=0.0)  # [1, BHALF]
    angle = pos * inv_freq
    cos = tl.cos(angle) * cs_scale
    sin = tl.sin(angle) * cs_scale
    x_row = x_ptr + t * stride_xt + offs_h * stride_xh
    o_row = out_ptr + t * stride_ot + offs_h * stride_oh
    x1 = tl.load(x_row + offs_i, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + HALF + offs_i, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_row + offs_i, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + HALF + offs_i, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    if BLOCK_PASS > 0:  # partial rotary: dims past 2*HALF pass through
        offs_p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, :]
        pmask = (offs_h < H) & (offs_p < Dh)
        tl.store(o_row + offs_p, tl.load(x_row + offs_p, mask=pmask, other=0.0), mask=pmask)


@lru_cache(maxsize=64)
def _inv_freq(theta: float, rotary_dim: int, device: torch.device) -> torch.Tensor:
    """HF's default-rope inverse frequencies, computed exactly as LlamaRotaryEmbedding does (fp32 pow)."""
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return (1.0 / (theta**exponent)).to(device)  # [rotary_dim / 2]


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float, rotary_dim: int | None = None,
               inv_freq: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """x [T, H, Dh], positions [T] int64 -> [T, H, Dh] in x's dtype (a new tensor). inv_freq [rotary_dim / 2] fp32
    replaces theta's frequencies; scale multiplies cos and sin."""
    # 1. check
    check_tensor(x, "x", 3)
    check_tensor(positions, "positions", 1, dtypes=(torch.int64, torch.int32), last_contiguous=False)
    check_same_device(x=x, positions=positions)
    T, H, Dh = x.shape
    rotary_dim = Dh if rotary_dim is None else int(rotary_dim)
    if positions.shape[0] != T:
        raise ValueError(f"positions: shape {tuple(positions.shape)} does not match x's {T} tokens")
    if rotary_dim <= 0 or rotary_dim > Dh or rotary_dim % 2:
        raise ValueError(f"rotary_dim: {rotary_dim} must be even and in (0, {Dh}]")
    if theta <= 0:
        raise ValueError(f"theta: {theta} must be > 0")
    if inv_freq is not None:
        check_tensor(inv_freq, "inv_freq", 1, dtypes=(torch.float32,))
        check_same_device(x=x, inv_freq=inv_freq)
        if inv_freq.shape[0] != rotary_dim // 2:
            raise ValueError(f"inv_freq: {inv_freq.shape[0]} frequencies, expected rotary_dim / 2 = {rotary_dim // 2}")
    # 2. allocate
    out = torch.empty((T, H, Dh), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    inv_freq = _inv_freq(float(theta), rotary_dim, x.device) if inv_freq is None else inv_freq
    # 3. launch
    half = rotary_dim // 2
    block_pass = triton.next_power_of_2(Dh - rotary_dim) if Dh > rotary_dim else 0
    block = triton.next_power_of_2(H) * triton.next_power_of_2(half)
    _rope_kernel[(T,)](
        x, positions, inv_freq, out,
        H, Dh, half, float(scale),
        x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        BLOCK_H=triton.next_power_of_2(H), BLOCK_HALF=triton.next_power_of_2(half), BLOCK_PASS=block_pass,
        num_warps=min(max(block // 512, 1), 8),
    )
    return out


def apply_rope_ref(x: torch.Tensor, positions: torch.Tensor, theta: float, rotary_dim: int | None = None,
                   inv_freq: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """The torch formula in fp32: cos/sin of positions * inv_freq (times scale), rotate_half on the first rotary_dim
    dims."""
    Dh = x.shape[-1]
    rotary_dim = Dh if rotary_dim is None else rotary_dim
    inv_freq = _inv_freq(float(theta), rotary_dim, x.device) if inv_freq is None else inv_freq
    angle = positions.float()[:, None] * inv_freq[None, :]  # [T, rotary_dim / 2]
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1)[:, None, :] * scale  # [T, 1, rotary_dim]
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1)[:, None, :] * scale
    xr, xp = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    x1, x2 = xr.chunk(2, dim=-1)
    rotated = xr * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([rotated.to(x.dtype), xp], dim=-1)


def yarn_inv_freq(theta: float, rotary_dim: int, factor: float, original_max_positions: int, beta_fast: float = 32.0,
                  beta_slow: float = 1.0, truncate: bool = True,
                  attention_factor: float | None = None) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) as HF computes it: per frequency a ramp between the theta frequency (fast rotations,
    kept) and it divided by `factor` (slow ones, interpolated), over the dims whose rotation counts in
    original_max_positions lie between beta_slow and beta_fast -> (inv_freq [rotary_dim / 2] fp32 on CPU, the cos/sin
    scale: attention_factor, by default 0.1 ln(factor) + 1)."""
    if factor <= 0 or original_max_positions <= 0:
        raise ValueError(f"yarn: factor {factor} and original_max_position_embeddings {original_max_positions} "
                         "must be positive")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def correction_dim(rotations: float) -> float:  # the dim whose wavelength fits `rotations` times
        return rotary_dim * math.log(original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    pos_freqs = theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (the theta frequency as is), 0: interpolate (divided by factor)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv_freq, float(attention_factor)
