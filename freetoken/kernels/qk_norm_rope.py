"""Attention's prologue after the qkv projection in one launch: per-head q / k RMSNorm (Qwen3; optional), rope on
q and k, and the KV cache writes of k and v (was 4 kernels and 2 copies per layer).

    qkv [T, (H + 2 Hkv) Dh] -> q [T, H, Dh] (normed, roped); k (normed, roped) -> k_cache[start + t],
    v -> v_cache[start + t]

Same rounding as the composition it replaces: rms_norm's output is rounded to the input dtype, then rope computes
in fp32 from that and rounds again.
"""

from __future__ import annotations

import torch

from freetoken.kernels.checks import check_same_device, check_tensor
from freetoken.kernels.lazy import tl, triton
from freetoken.kernels.rmsnorm import rms_norm_ref
from freetoken.kernels.rope import _inv_freq, apply_rope_ref


@triton.jit
def _norm_rope_heads(x_ptr, w_ptr, out_ptr, pos, inv_freq, cs_scale, eps, n_heads, Dh, HALF,
                     stride_xh, stride_oh,
                     NORM: tl.constexpr, ROUND_NORMED: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr):
    """n_heads rows of Dh at x_ptr (head stride stride_xh) -> normed (NORM), roped rows at out_ptr."""
    offs_h = tl.arange(0, BLOCK_H)[:, None]  # [BH, 1]
    offs_i = tl.arange(0, BLOCK_HALF)[None, :]  # [1, BHALF]
    mask = (offs_h < n_heads) & (offs_i < HALF)
    offs_p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, :]  # [1, BPASS] dims past the rotary ones
    pmask = (offs_h < n_heads) & (offs_p < Dh)
    x_row = x_ptr + offs_h * stride_xh
    x1 = tl.load(x_row + offs_i, mask=mask, other=0.0)
    x2 = tl.load(x_row + HALF + offs_i, mask=mask, other=0.0)
    xp = tl.load(x_row + offs_p, mask=pmask, other=0.0)
    dtype = x1.dtype
    if NORM:
        f1, f2, fp = x1.to(tl.float32), x2.to(tl.float32), xp.to(tl.float32)
        ss = tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1) + tl.sum(fp * fp, axis=1)  # [BH]
        rstd = tl.rsqrt(ss / Dh + eps)[:, None]
        n1, n2, np_ = f1 * rstd, f2 * rstd, fp * rstd
        if ROUND_NORMED:
            n1, n2, np_ = n1.to(dtype).to(tl.float32), n2.to(dtype).to(tl.float32), np_.to(dtype).to(tl.float32)
        w1 = tl.load(w_ptr + offs_i, mask=offs_i < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs_i, mask=offs_i < HALF, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + offs_p, mask=offs_p < Dh, other=0.0).to(tl.float32)
        x1, x2, xp = (n1 * w1).to(dtype), (n2 * w2).to(dtype), (np_ * wp).to(dtype)
    angle = pos * inv_freq
    cos = tl.cos(angle) * cs_scale
    sin = tl.sin(angle) * cs_scale
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    o_row = out_ptr + offs_h * stride_oh
    tl.store(o_row + offs_i, (f1 * cos - f2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + HALF + offs_i, (f2 * cos + f1 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + offs_p, xp.to(out_ptr.dtype.element_ty), mask=pmask)


@triton.jit
def _qk_norm_rope_kernel(
    # Pointers
    qkv_ptr, q_norm_ptr, k_norm_ptr, pos_ptr, inv_freq_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    # Dimensions
    H, Hkv, Dh, HALF, start, cs_scale, eps,
    # Strides
    stride_qkv, stride_qt, stride_qh, stride_ct, stride_ch, stride_vt, stride_vh,
    # Meta-parameters
    NORM: tl.constexpr, ROUND_NORMED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HKV: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One token per program: its q heads into q, its k heads into the K cache, its v heads copied to the V cache,
    at cache row start + t."""
    t = tl.program_id(0)
    row = qkv_ptr + t * stride_qkv
    pos = tl.load(pos_ptr + t).to(tl.float32)
    offs_i = tl.arange(0, BLOCK_HALF)[None, :]
    inv_freq = tl.load(inv_freq_ptr + offs_i, mask=offs_i < HALF, other=0.0)  # [1, BHALF]
    _norm_rope_heads(row, q_norm_ptr, q_ptr + t * stride_qt, pos, inv_freq, cs_scale, eps, H, Dh, HALF, Dh,
                     stride_qh, NORM, ROUND_NORMED, BLOCK_H, BLOCK_HALF, BLOCK_PASS)
    c = (start + t).to(tl.int64)
    _norm_rope_heads(row + H * Dh, k_norm_ptr, k_cache_ptr + c * stride_ct, pos, inv_freq, cs_scale, eps, Hkv, Dh,
                     HALF, Dh, stride_ch, NORM, ROUND_NORMED, BLOCK_HKV, BLOCK_HALF, BLOCK_PASS)
    offs_h = tl.arange(0, BLOCK_HKV)[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    vmask = (offs_h < Hkv) & (offs_d < Dh)
    v = tl.load(row + (H + Hkv) * Dh + offs_h * Dh + offs_d, mask=vmask, other=0.0)
    tl.store(v_cache_ptr + c * stride_vt + offs_h * stride_vh + offs_d, v.to(v_cache_ptr.dtype.element_ty), mask=vmask)


def qk_norm_rope(qkv: torch.Tensor, H: int, Hkv: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                 eps: float, positions: torch.Tensor, theta: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 start: int, rotary_dim: int | None = None, inv_freq: torch.Tensor | None = None, scale: float = 1.0,
                 round_normed: bool = True) -> torch.Tensor:
    """qkv [T, (H + 2 Hkv) Dh] (rows may be strided), q_norm / k_norm [Dh] (both or neither), positions [T] ->
    q [T, H, Dh]; k and v written into k_cache / v_cache [N, Hkv, Dh] at rows start .. start + T."""
    # 1. check
    check_tensor(qkv, "qkv", 2)
    T, width = qkv.shape
    Dh = k_cache.shape[-1]
    if width != (H + 2 * Hkv) * Dh:
        raise ValueError(f"qkv: width {width} is not (H + 2 Hkv) Dh = {(H + 2 * Hkv) * Dh}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm / k_norm: give both or neither")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 3 or tuple(c.shape[1:]) != (Hkv, Dh) or c.stride(2) != 1 or c.shape[0] < start + T:
            raise ValueError(f"{name}: shape {tuple(c.shape)} cannot take rows {start}..{start + T} of [{Hkv}, {Dh}]")
    check_same_device(qkv=qkv, positions=positions, k_cache=k_cache, v_cache=v_cache)
    rotary_dim = Dh if rotary_dim is None else int(rotary_dim)
    if rotary_dim <= 0 or rotary_dim > Dh or rotary_dim % 2:
        raise ValueError(f"rotary_dim: {rotary_dim} must be even and in (0, {Dh}]")
    # 2. allocate
    q = torch.empty((T, H, Dh), dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q
    inv_freq = _inv_freq(float(theta), rotary_dim, qkv.device) if inv_freq is None else inv_freq
    norm = q_norm is not None
    # 3. launch
    half = rotary_dim // 2
    _qk_norm_rope_kernel[(T,)](
        qkv, q_norm if norm else qkv, k_norm if norm else qkv, positions, inv_freq, q, k_cache, v_cache,
        H, Hkv, Dh, half, start, float(scale), float(eps),
        qkv.stride(0), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
        v_cache.stride(1),
        NORM=norm, ROUND_NORMED=round_normed, BLOCK_H=triton.next_power_of_2(H),
        BLOCK_HKV=triton.next_power_of_2(Hkv), BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_PASS=max(1, triton.next_power_of_2(max(Dh - rotary_dim, 1))), BLOCK_D=triton.next_power_of_2(Dh),
    )
    return q


def qk_norm_rope_ref(qkv: torch.Tensor, H: int, Hkv: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                     eps: float, positions: torch.Tensor, theta: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     start: int, rotary_dim: int | None = None, inv_freq: torch.Tensor | None = None,
                     scale: float = 1.0, round_normed: bool = True) -> torch.Tensor:
    """The composition it replaces: split, per-head rms_norm, apply_rope on q and k, the two cache writes."""
    T, Dh = qkv.shape[0], k_cache.shape[-1]
    q, k, v = qkv.split([H * Dh, Hkv * Dh, Hkv * Dh], dim=1)
    if q_norm is not None:
        q = rms_norm_ref(q.reshape(T * H, Dh), q_norm, eps, round_normed)
        k = rms_norm_ref(k.reshape(T * Hkv, Dh), k_norm, eps, round_normed)
    q = apply_rope_ref(q.reshape(T, H, Dh), positions, theta, rotary_dim, inv_freq, scale)
    k_cache[start:start + T] = apply_rope_ref(k.reshape(T, Hkv, Dh), positions, theta, rotary_dim, inv_freq, scale)
    v_cache[start:start + T] = v.reshape(T, Hkv, Dh)
    return q
